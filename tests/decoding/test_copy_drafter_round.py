# SPDX-License-Identifier: Apache-2.0
"""A drafter with a copy channel (and one with a copy head too) in the round: each request's copy index follows
its history (prompt, commits, preemption), greedy output equals the target's, and sampled output keeps the
target's distribution."""

from __future__ import annotations

import pytest
import torch

from dspark import DSparkDecoder, Planner
from dspark.decoding.lookup import LookupConfig
from dspark.models.drafter import DSparkDrafter
from tests.decoding.test_decoder_sampling import START, TV_MAX, N, batch_sps, chain_table, score_first_three
from tests.decoding.toy_models import markov_chain_target, tiny_target

V2 = dict(copy_channel=True, context_projection=True, learned_mask=True, tap_norm=True)


def copy_drafter(
    target, block_size: int = 4, seed: int = 1, head: bool = False, bounds: tuple[int, ...] = ()
) -> DSparkDrafter:
    """A copy-channel drafter with non-neutral inputs; ``head``: with a copy head, and with ``bounds`` its
    extent classes and a greedy table too."""
    torch.manual_seed(seed)
    L = target.config.num_hidden_layers
    d = DSparkDrafter.from_config(
        target,
        block_size=block_size,
        num_layers=1,
        target_layer_ids=sorted({0, max(L - 2, 0)}),
        markov_rank=8,
        initializer_range=0.2,
        copy_head=head,
        copy_extent_bounds=bounds,
        copy_greedy_bias=bool(bounds),
        **V2,
    ).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-neutral copy inputs: the drafts depend on them
        for name in ("copy_embed", "context_proj"):
            w = getattr(d, name).weight
            w.copy_(0.3 * torch.randn(w.shape, generator=g))
        if head:  # a bonus large enough that most drafts copy, and a confidence term
            d.copy_head.logit_bias.fill_(6.0)
            d.copy_head.conf_bias.copy_(torch.randn(d.copy_head.conf_bias.shape, generator=g))
            if bounds:
                d.copy_head.greedy_bias.copy_(3.0 * torch.randn(d.copy_head.greedy_bias.shape, generator=g))
    return d


def greedy_reference(target, prompts, n: int) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = target.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None)
        out.append(ids[0, len(p) :].tolist())
    return out


@pytest.mark.parametrize("head, bounds", [(False, ()), (True, ()), (True, (4, 6))])
@pytest.mark.parametrize("lookup", [False, True])
@pytest.mark.parametrize("mode", ["full", "early_stop"])
def test_copy_drafter_greedy_equals_the_target_greedy(lookup, mode, head, bounds):
    target = tiny_target("llama", vocab=64)
    drafter = copy_drafter(target, head=head, bounds=bounds)
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2, 3, 1], [40, 41, 42]]
    want = greedy_reference(target, prompts, 20)
    dec = DSparkDecoder(target, drafter, planner=Planner(mode, batch_sps(3, 4)), lookup=lookup, block_size=4)
    try:
        out = dec.generate(prompts, max_new_tokens=20, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences == want


def test_copy_index_holds_the_requests_history(monkeypatch):
    """The continuation the drafter gets each round is the one its whole history (prompt + commits) gives."""
    import dspark.decoding.round as round_mod

    target = tiny_target("llama", vocab=64)
    drafter = copy_drafter(target)
    seen = []
    real = round_mod.copy_continuations

    def spy(config, requests):
        for req in requests:
            seen.append((list(req.copy_index.history), req.prompt + req.generated))
        return real(config, requests)

    monkeypatch.setattr(round_mod, "copy_continuations", spy)
    dec = DSparkDecoder(target, drafter, planner=Planner("full", batch_sps(2, 4)), block_size=4)
    try:
        dec.generate([[1, 2, 3, 1, 2, 3, 1], [9, 8, 7]], max_new_tokens=12, eos_token_id=[])
    finally:
        dec.close()
    assert seen and all(h == want for h, want in seen)
    cfg = drafter.config
    assert (cfg.copy_min_match, cfg.copy_max_match) == (2, 3)


@pytest.mark.slow
@pytest.mark.parametrize("head, bounds", [(False, ()), (True, ()), (True, (4,))])
def test_copy_drafter_sampling_follows_the_target(head, bounds):
    table = chain_table()
    target = markov_chain_target(table)
    drafter = copy_drafter(target, block_size=3, head=head, bounds=bounds)
    pattern = [START, 0, 1, 3, START, 0, 1, 3, START]  # repeats: the copy channel has matches
    dec = DSparkDecoder(target, drafter, planner=Planner("full"), max_batch_size=N, lookup=LookupConfig(1, 3))
    try:
        out = dec.generate([pattern] * N, max_new_tokens=3, temperature=1.0, eos_token_id=[], seed=0)
    finally:
        dec.close()
    pval, tv = score_first_three(out.sequences, table, 1.0, 0, 1.0)
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    assert 0 < out.stats.rejected_drafts < out.stats.verified_drafts
