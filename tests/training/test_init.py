# SPDX-License-Identifier: Apache-2.0
"""Warm-start initialisation of a fresh drafter from its target's weights."""

from __future__ import annotations

import pytest
import torch

from dspark.training.features import target_features
from dspark.training.init import bigram_markov_init, init_from_target
from tests.decoding.toy_models import random_drafter, tiny_target


@pytest.fixture()
def pair():
    t = tiny_target("llama", vocab=96, layers=4)
    d = random_drafter(t, block_size=4, markov_rank=8)
    return t, d


def test_norm_mode_copies_final_norm_and_picks_the_last_tap(pair):
    t, d = pair
    with torch.no_grad():
        t.model.norm.weight.uniform_(0.5, 2.0)
    init_from_target(d, t, "norm")
    torch.testing.assert_close(d.norm.weight, t.model.norm.weight)
    ids = torch.randint(0, 90, (10,), generator=torch.Generator().manual_seed(0))
    feats, _ = target_features(t, ids, d.config.target_layer_ids)
    H = d.config.hidden_size
    with torch.no_grad():
        ctx = d.hidden_norm(d.fc(feats))
        want = d.hidden_norm(feats[:, -H:])
    torch.testing.assert_close(ctx, want)


@pytest.mark.parametrize("mode, pick", [("late", -1), ("early", 0)])
def test_layer_modes_copy_the_targets_layers(pair, mode, pick):
    t, d = pair
    init_from_target(d, t, mode)
    src, dst = t.model.layers[pick], d.layers[0]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        torch.testing.assert_close(getattr(dst.self_attn, name).weight, getattr(src.self_attn, name).weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        torch.testing.assert_close(getattr(dst.mlp, name).weight, getattr(src.mlp, name).weight)
    torch.testing.assert_close(dst.input_layernorm.weight, src.input_layernorm.weight)
    torch.testing.assert_close(d.norm.weight, t.model.norm.weight)


def test_random_mode_changes_nothing_and_bad_mode_is_named(pair):
    t, d = pair
    before = {k: v.clone() for k, v in d.state_dict().items()}
    init_from_target(d, t, "random")
    assert all(torch.equal(before[k], v) for k, v in d.state_dict().items())
    with pytest.raises(ValueError, match="mode"):
        init_from_target(d, t, "middle")


def _bigram_sequences():
    """Prompt ``[1, 10]``, then a response whose next token depends only on the previous one: ``10+k`` goes to
    ``10+(k+1)%4`` (2/3) or ``20+k`` (1/3), ``20+k`` goes back to ``10+k``: 8 distinct previous tokens."""
    g = torch.Generator().manual_seed(3)
    seqs = []
    for _ in range(40):
        ids = [1, 10]
        for _ in range(12):
            cur, u = ids[-1], float(torch.rand(1, generator=g))
            ids.append(cur - 10 if cur >= 20 else (10 + (cur - 9) % 4 if u < 2 / 3 else cur + 10))
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[2:] = True
        seqs.append((torch.tensor(ids), mask))
    return seqs


def _counted_log_table(seqs, V, floor):
    n = torch.zeros(V, V, dtype=torch.float64)
    for ids, mask in seqs:
        for t in range(1, ids.numel()):
            if mask[t]:
                n[ids[t - 1], ids[t]] += 1
    rows = n.sum(1, keepdim=True)
    want = torch.where(n > 0, (n / rows.clamp_min(1) / floor).log().clamp_min(0), torch.zeros_like(n))
    return want.float(), n


def test_bigram_init_is_the_counted_bigram_table(pair):
    _, d = pair
    seqs = _bigram_sequences()
    V = d.markov_head.markov_w1.weight.shape[0]
    want, n = _counted_log_table(seqs, V, 1e-3)
    assert n[1, 10] == 0 and n.sum() == 40 * 12  # prompt pairs are not counted, prompt -> response pairs are
    got_pairs = bigram_markov_init(d.markov_head, seqs)
    assert got_pairs == int(n.sum())
    with torch.no_grad():
        table = d.markov_head.markov_w2(d.markov_head.markov_w1.weight)  # [V, V]: bias of every prev token
    # as many distinct prev rows (8) as the rank (8): the factorisation is exact up to float error
    torch.testing.assert_close(table, want, atol=2e-3, rtol=1e-3)
    seen = n.sum(1) > 0
    assert torch.equal(table[seen].argmax(1), n[seen].argmax(1))  # the most frequent successor


def test_bigram_init_rejects_what_it_cannot_use(pair):
    _, d = pair
    with pytest.raises(ValueError, match="no response token pairs"):
        bigram_markov_init(d.markov_head, [(torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.bool))])
    with pytest.raises(ValueError, match="vocabulary"):
        bigram_markov_init(d.markov_head, [(torch.tensor([1, 500]), torch.ones(2, dtype=torch.bool))])
    with pytest.raises(ValueError, match="floor"):
        bigram_markov_init(d.markov_head, _bigram_sequences(), floor=0.0)
    with pytest.raises(ValueError, match="vanilla"):
        bigram_markov_init(torch.nn.Linear(2, 2), _bigram_sequences())
