# SPDX-License-Identifier: Apache-2.0
"""Replaying a captured Markov op with a refilled ``round_offset`` (the CUDA tests of markov_sample and
markov_sample_from_hidden): what the drafter's CUDA graphs rely on."""

import torch


def assert_replays_follow_the_counter(op, args, seed: int, offset: int, counters=(0, 1, 5, 2)) -> None:
    """Capture ``op(*args, seed, offset, None, round_offset)`` in a CUDA graph once, then for each counter value
    ``c`` refill ``round_offset``, replay, and compare every output with the eager ``op(*args, seed, offset + c)``
    bit for bit (same device, same kernels). Consecutive replays must also differ (a baked-in offset would
    replay the captured draw every time)."""
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(*args, seed, offset, None, counter)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(*args, seed, offset, None, counter)
    drawn = []
    for c in counters:
        counter.fill_(c)
        graph.replay()
        want = op(*args, seed, offset + c)
        for name, got, w in zip(("tokens", "draft_logits", "prev_emb"), out, want, strict=True):
            assert torch.equal(got, w), (name, c)
        drawn.append(out[0].clone())
    assert not torch.equal(drawn[0], drawn[1]), "the replay ignored the refilled counter"
