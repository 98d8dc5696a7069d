# SPDX-License-Identifier: Apache-2.0
"""The packed training step (flattened anchors of several sequences in one pass) gives each sequence's loss
and the summed gradient of one pass per sequence."""

from __future__ import annotations

import pytest
import torch

from dspark.training.features import Sample, loss_mask_for, target_features
from dspark.training.objective import (
    LossWeights,
    block_hidden,
    block_loss,
    packed_block_loss,
    packed_hidden,
    sample_anchors,
)
from tests.decoding.toy_models import random_drafter, tiny_target


@pytest.fixture(scope="module")
def pair():
    t = tiny_target("llama", vocab=96, layers=4)
    for p in t.parameters():
        p.requires_grad_(False)
    return t, random_drafter(t, block_size=4, markov_rank=8)


def _sequences(t, d, lengths=(23, 40, 9), prompt=5):
    seqs, anchors = [], []
    for k, n in enumerate(lengths):
        ids = torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(k))
        feats, last = target_features(t, ids, d.config.target_layer_ids)
        mask = loss_mask_for(prompt, n)
        seqs.append(Sample(ids, mask, feats, last))
        anchors.append(sample_anchors(mask, 6, torch.Generator().manual_seed(10 + k)))
    return seqs, anchors


def _grads(d) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}


def test_packed_hidden_stacks_each_sequences_hidden(pair):
    t, d = pair
    seqs, anchors = _sequences(t, d)
    packed = packed_hidden(d, [s.features for s in seqs], [s.input_ids for s in seqs], anchors)
    alone = torch.cat(
        [block_hidden(d, s.features, s.input_ids, a) for s, a in zip(seqs, anchors, strict=True)]
    )
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_packed_loss_and_gradient_equal_the_per_sequence_sum(pair, draft_vocab):
    t, d = pair
    seqs, anchors = _sequences(t, d)
    w = LossWeights(kl=0.5)
    dv = torch.arange(0, 96, 2) if draft_vocab else None
    d.zero_grad(set_to_none=True)
    per = [
        block_loss(d, s.features, s.last_hidden, s.input_ids, s.loss_mask, a, w, draft_ids=dv)
        for s, a in zip(seqs, anchors, strict=True)
    ]
    sum(lo.loss for lo in per).backward()
    want = _grads(d)
    d.zero_grad(set_to_none=True)
    lo = packed_block_loss(d, seqs, anchors, w, draft_ids=dv)
    lo.loss.backward()
    got = _grads(d)
    d.zero_grad(set_to_none=True)
    for name in ("loss", "ce", "l1", "bce", "kl"):
        torch.testing.assert_close(
            getattr(lo, name), sum(getattr(p, name) for p in per).detach(), rtol=1e-5, atol=1e-6
        )
    assert set(got) == set(want) and got
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(lo.counted, sum(p.counted for p in per))


def test_packing_is_not_a_mean_over_the_pooled_slots(pair):
    """Negative control: pooling all slots into one mean (what a naive packing computes) weights long
    sequences more, and the test above would catch it: the two differ on sequences of unequal length."""
    t, d = pair
    seqs, anchors = _sequences(t, d, lengths=(12, 60))
    per = [
        block_loss(d, s.features, s.last_hidden, s.input_ids, s.loss_mask, a)
        for s, a in zip(seqs, anchors, strict=True)
    ]
    lo = packed_block_loss(d, seqs, anchors)
    pooled_l1 = sum(p.l1 * p.counted.sum() for p in per) / sum(p.counted.sum() for p in per)
    assert abs(float(lo.l1) - float(sum(p.l1 for p in per))) < 1e-5
    assert abs(float(lo.l1) / 2 - float(pooled_l1)) > 1e-4
