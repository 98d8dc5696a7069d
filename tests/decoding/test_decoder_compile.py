# SPDX-License-Identifier: Apache-2.0
"""decoder.compile(): the compiled drafter (and, with ``target=True``, the target's norms and MLPs) gives the
same greedy output, and ``close`` gives the user's model back as it was; the Markov sampling time is its own
bucket."""

import torch._dynamo

from dspark import DSparkDecoder
from tests.decoding.test_decoder import hf_greedy, prompts_of
from tests.decoding.toy_models import random_drafter, tiny_target

PROMPTS = prompts_of([5, 13, 8], 96, seed=5)


def _compiled_generate(model, drafter, check=lambda: None, **compile_kw):
    """Greedy tokens of a compiled decoder and the graphs dynamo compiled for them; ``check`` runs before the
    decoder is closed."""
    torch._dynamo.reset()
    dec = DSparkDecoder(model, drafter, planner="full", max_batch_size=3).compile(**compile_kw)
    try:
        check()
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        out = dec.generate(PROMPTS, max_new_tokens=10, eos_token_id=[])
        return out.sequences, torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    finally:
        dec.close()
        torch._dynamo.reset()


def test_compiled_drafter_keeps_greedy_output_and_parameter_names():
    target = tiny_target("llama", seed=5)
    drafter = random_drafter(target)
    names = sorted(drafter.state_dict())
    want = [hf_greedy(target, p, 10) for p in PROMPTS]
    got, graphs = _compiled_generate(target, drafter)
    assert got == want
    assert graphs > 0  # the drafter's modules really went through the compiler
    assert sorted(drafter.state_dict()) == names


def test_markov_sampling_time_is_reported_separately():
    target = tiny_target("llama", seed=6)
    dec = DSparkDecoder(target, random_drafter(target), planner="full")
    try:
        out = dec.generate(prompts_of([4, 9], 96, seed=6), max_new_tokens=8, eos_token_id=[])
    finally:
        dec.close()
    sec = out.stats.seconds
    assert sec["markov_sample"] > 0 and sec["draft"] > 0
    assert set(sec) >= {"draft", "markov_sample", "plan", "verify", "accept", "commit"}


def test_compiled_target_keeps_greedy_output_and_close_restores_it():
    target = tiny_target("llama", seed=5)
    blocks = [m for m in target.modules() if type(m).__name__.endswith(("RMSNorm", "MLP"))]
    assert len(blocks) >= 2 * target.config.num_hidden_layers  # norms and MLPs of every layer
    want = [hf_greedy(target, p, 10) for p in PROMPTS]

    def compiled_while_open():
        assert all("forward" in vars(m) for m in blocks)

    got, graphs = _compiled_generate(target, random_drafter(target), compiled_while_open, target=True)
    assert got == want and graphs > 0
    # the user's model runs its own forwards again after close (and its output is unchanged)
    assert all("forward" not in vars(m) for m in blocks)
    assert [hf_greedy(target, p, 10) for p in PROMPTS] == want
