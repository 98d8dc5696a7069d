# SPDX-License-Identifier: Apache-2.0
"""Batched drafting of requests with different context lengths equals drafting each alone; context management."""

from __future__ import annotations

import pytest
import torch

from dspark import DSparkDrafter
from dspark.models.heads import sample_without_markov
from dspark.reference import markov_sample_ref
from tests.models.drafter_fixtures import random_checkpoint, tiny_config

TOL = dict(rtol=1e-5, atol=1e-5)


def _drafter(tmp_path, head_type="vanilla", rank=6):
    cfg = tiny_config(head_type, rank, block_size=5)
    random_checkpoint(tmp_path / "c", cfg, seed=3)
    return DSparkDrafter.from_pretrained(tmp_path / "c")


@pytest.mark.parametrize("head_type", ["vanilla", "rnn"])
def test_batched_equals_alone(tmp_path, head_type):
    batch, alone = _drafter(tmp_path, head_type), _drafter(tmp_path, head_type)
    gen = torch.Generator().manual_seed(0)
    ids = [4, 9, 1]
    lengths = {4: [7, 2, 1], 9: [0, 5, 3], 1: [13, 0, 6]}
    for rnd in range(3):
        feats = [torch.randn(lengths[i][rnd], 96, generator=gen) for i in ids]
        anchors = torch.randint(0, 64, (3,), generator=gen)
        temp = torch.tensor([0.0, 1.0, 0.5])
        batch.append_context(ids, feats)
        ob = batch.draft(ids, anchors, temp, seed=5, offset=rnd, return_base_logits=True)
        for j, rid in enumerate(ids):
            alone.append_context([rid], [feats[j]])
            oa = alone.draft(
                [rid], anchors[j : j + 1], temp[j : j + 1], seed=5, offset=rnd, return_base_logits=True
            )
            assert torch.equal(ob.tokens[j], oa.tokens[0])
            for name in ("hidden", "base_logits", "draft_logits", "prev_emb", "conf_logit", "survival"):
                torch.testing.assert_close(getattr(ob, name)[j], getattr(oa, name)[0], **TOL)
            assert batch.context_length(rid) == alone.context_length(rid) == sum(lengths[rid][: rnd + 1])


def test_truncate_and_finish(tmp_path):
    d = _drafter(tmp_path)
    f = torch.randn(10, 96)
    d.append_context([0], [f[:6]])
    ref = d.draft([0], torch.tensor([3]), 0.0, return_base_logits=True)
    d.append_context([0], [f[6:]])
    d.truncate(0, 6)  # rollback: rows 6..9 dropped
    assert d.next_position(0) == 6
    again = d.draft([0], torch.tensor([3]), 0.0, return_base_logits=True)
    torch.testing.assert_close(again.base_logits, ref.base_logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="positions"):
        d.append_context([0], [f[:1]], positions=[9])
    d.finish(0)
    assert d.context_length(0) == 0
    with pytest.raises(ValueError, match="request_ids"):
        d.draft([1, 1], torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="features"):
        d.append_context([2], [torch.randn(3, 95)])


def test_sampling_statistics_and_greedy():
    """Gumbel-max draws follow softmax(z/T); T=0 is argmax; the noise is keyed (same seed -> same draws)."""
    V, R = 5, 4000
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    base = torch.log(probs).expand(R, 1, V).contiguous()
    anchor = torch.zeros(R, dtype=torch.int64)
    s = sample_without_markov(base, anchor, 1.0, seed=1, offset=0)
    freq = torch.bincount(s.tokens[:, 0], minlength=V).float() / R
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)
    s2 = sample_without_markov(base, anchor, 1.0, seed=1, offset=0)
    assert torch.equal(s.tokens, s2.tokens)
    assert not torch.equal(s.tokens, sample_without_markov(base, anchor, 1.0, seed=2, offset=0).tokens)
    g = sample_without_markov(base, anchor, 0.0, seed=1, offset=0)
    assert bool((g.tokens == 0).all())
    with pytest.raises(ValueError, match="temperature"):
        sample_without_markov(base, anchor, -1.0, seed=1, offset=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0, "mixed"])
def test_sample_without_markov_matches_the_reference(dtype, temperature):
    """The DFlash drafts (fused op, rank 0) are the reference sampler's with empty Markov weights."""
    g = torch.Generator().manual_seed(7)
    R, G, V = 5, 3, 300
    base = (torch.randn(R, G, V, generator=g) * 3).to(dtype)
    anchor = torch.randint(0, V, (R,), generator=g)
    ids = torch.tensor([3, 0, 2**32 - 1, 9, 4])
    t = torch.tensor([0.0, 1.0, 0.5, 2.0, 1.0]) if temperature == "mixed" else temperature
    empty = torch.empty(V, 0, dtype=dtype)
    temps = t if isinstance(t, torch.Tensor) else torch.full((R,), t)
    want_tokens, want_logits, _ = markov_sample_ref(base, anchor, empty, empty, temps, 11, 2, ids)
    got = sample_without_markov(base, anchor, t, 11, 2, ids)
    assert torch.equal(got.tokens, want_tokens)
    assert torch.equal(got.logits, want_logits)
    assert got.prev_emb.shape == (R, G, 0) and got.prev_emb.dtype == dtype


@pytest.mark.parametrize("head_type", ["vanilla", "rnn"])
def test_fewer_positions_equal_the_first_slots_of_a_full_draft(tmp_path, head_type):
    d = _drafter(tmp_path, head_type)
    gen = torch.Generator().manual_seed(1)
    ids = [2, 7]
    d.append_context(ids, [torch.randn(6, 96, generator=gen), torch.randn(3, 96, generator=gen)])
    anchors = torch.tensor([5, 11])
    temp = torch.tensor([0.0, 1.0])
    sts_t, sts_b = torch.tensor([1.0, 0.7, 1.3, 0.9, 1.1]), torch.tensor([0.2, -0.1, 0.0, 0.3, -0.2])
    full = d.draft(ids, anchors, temp, seed=3, offset=4, sts_temperature=sts_t, sts_bias=sts_b)
    for g in (1, 3):
        part = d.draft(
            ids,
            anchors,
            temp,
            seed=3,
            offset=4,
            sts_temperature=sts_t[:g],
            sts_bias=sts_b[:g],
            num_positions=g,
        )
        assert part.tokens.shape == (2, g) and part.draft_logits.shape[:2] == (2, g)
        assert torch.equal(part.tokens, full.tokens[:, :g])  # the noise is keyed by position, not by γ
        for name in ("hidden", "draft_logits", "prev_emb", "conf_logit", "survival"):
            torch.testing.assert_close(getattr(part, name), getattr(full, name)[:, :g], **TOL)
    for bad in (0, 6):
        with pytest.raises(ValueError, match="num_positions"):
            d.draft(ids, anchors, temp, num_positions=bad)
