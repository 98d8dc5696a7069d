# SPDX-License-Identifier: Apache-2.0
"""DSparkDecoder on CUDA: greedy output equals the target's own greedy decoding on the same device, and a
round waits for the device only at its counted read points (skipped without a GPU and a CUDA build).

PyTorch's sync debug mode warns on every synchronising call (``.item()``, blocking copies in either direction,
``stream.synchronize()``); the decoder's only sanctioned ones are :class:`HostReader` reads, which it counts.
"""

import traceback
import warnings

import pytest
import torch

from dspark import DSparkDecoder
from tests.decoding.test_decoder import MODES, SPS, hf_greedy, prompts_of
from tests.decoding.toy_models import random_drafter, tiny_target

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _count_syncs(fn):
    """``(fn(), Python stacks of the synchronising CUDA calls inside fn)``, one formatted stack per call."""
    torch.cuda.synchronize()
    stacks = []

    def record(message, category, filename, lineno, file=None, line=None):
        # the sync debug mode's own message; not its one-time "prototype feature" notice, which also says
        # "synchronizing" (set_sync_debug_mode emits it on the first call in a process)
        if "called a synchronizing CUDA operation" in str(message):
            stacks.append("".join(traceback.format_stack(limit=14)[:-1]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record  # restored by catch_warnings
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return result, stacks


def _uncounted(stacks):
    """The stacks that do not pass through HostReader.fetch (the decoder's counted reads)."""
    return [s for s in stacks if "in fetch" not in s or "host_sync.py" not in s]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("draft_vocab", [None, list(range(0, 96, 2))])
def test_rounds_sync_only_at_counted_reads_and_greedy_equals_target(mode, temperature, draft_vocab):
    target = tiny_target("llama", seed=5).to("cuda")
    drafter = random_drafter(target)
    drafter.set_draft_vocab(draft_vocab)  # a draft vocabulary adds no host reads
    prompts = prompts_of([4, 9, 13, 2], 96, seed=5)
    want = [hf_greedy(target, p, 12) for p in prompts] if temperature == 0 else None
    dec = DSparkDecoder(target, drafter, planner=mode, sps_table=SPS, threshold=0.3, max_batch_size=4)
    try:
        dec.generate(prompts[:1], max_new_tokens=3, eos_token_id=[])  # first-call allocations
        before = dec.host.syncs
        out, stacks = _count_syncs(
            lambda: dec.generate(prompts, max_new_tokens=12, temperature=temperature, seed=3, eos_token_id=[])
        )
        counted = dec.host.syncs - before
    finally:
        dec.close()
    if want is not None:
        assert out.sequences == want
    assert [len(s) for s in out.sequences] == [12] * len(prompts)
    others = _uncounted(stacks)
    assert not others and len(stacks) == counted, (
        f"{len(stacks)} synchronisations for {counted} counted host reads; the others came from:\n"
        + "\n----\n".join(others)
    )
