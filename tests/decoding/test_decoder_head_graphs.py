# SPDX-License-Identifier: Apache-2.0
"""The decoder with the drafter's graphs run padded on the CPU (``DrafterGraphs(capture=False)``: the graphs'
bodies on their static buffers, the Markov draw keyed by the device counter, the context appends padded): the
same output as without them for the same seed — greedy, sampled with top-k, and with lookup blocks mixed in — so
every round's draw took its own Philox offset through the counter. The graphs' path must have run in every drafted round. With a GPU,
tests/decoding/test_decoder_cuda_graphs.py replays the captured graphs.
"""

import pytest

from dspark import DSparkDecoder, GraphBuckets
from dspark.models.drafter_graphs import DrafterGraphs
from tests.decoding.test_decoder import SPS, hf_greedy, prompts_of
from tests.decoding.toy_models import random_drafter, tiny_target


@pytest.mark.parametrize(
    "sampling,lookup",
    [(dict(temperature=0.0), False), (dict(temperature=1.0, top_k=20), False), (dict(temperature=0.8), True)],
)
def test_padded_graphs_give_the_decoder_the_same_output(sampling, lookup):
    target = tiny_target("llama", seed=5)
    prompts = prompts_of([3, 17, 5, 9, 12], 96, seed=5)
    outs, stats = [], None
    for graphed in (False, True):
        drafter = random_drafter(target)  # the same weights both times
        if graphed:
            drafter.graphs = DrafterGraphs(drafter, GraphBuckets(requests=(1, 2, 4)), capture=False)
        dec = DSparkDecoder(
            target, drafter, planner="early_stop", sps_table=SPS, max_batch_size=4, lookup=lookup
        )
        try:
            out = dec.generate(prompts, max_new_tokens=14, eos_token_id=[], seed=3, **sampling)
        finally:
            dec.close()
        outs.append(out.sequences)
        if graphed:
            stats = drafter.graphs.heads.stats
            appends = drafter.graphs.context.stats
    assert outs[1] == outs[0]
    if sampling["temperature"] == 0:
        assert outs[0] == [hf_greedy(target, p, 14) for p in prompts]
    assert stats.replays > 0 and not stats.eager, stats  # sampling and confidence replayed in every round
    assert appends.replays > 0, appends  # the committed rows' appends took the padded graph path


def test_a_counter_not_refilled_changes_the_sampled_output(monkeypatch):
    """Negative control: with the counter left at its first value (an offset baked into the graph), the sampled
    output is not the one without graphs."""
    from dspark.models.drafter_head_graphs import DraftHeadGraphs

    monkeypatch.setattr(DraftHeadGraphs, "_refill_counter", lambda self, offset: None)
    target = tiny_target("llama", seed=5)
    prompts = prompts_of([3, 17, 5, 9, 12], 96, seed=5)
    outs = []
    for graphed in (False, True):
        drafter = random_drafter(target)
        if graphed:
            drafter.graphs = DrafterGraphs(drafter, GraphBuckets(requests=(1, 2, 4)), capture=False)
        dec = DSparkDecoder(target, drafter, planner="early_stop", sps_table=SPS, max_batch_size=4)
        try:
            outs.append(
                dec.generate(prompts, max_new_tokens=14, eos_token_id=[], seed=3, temperature=1.0).sequences
            )
        finally:
            dec.close()
    assert outs[1] != outs[0]
