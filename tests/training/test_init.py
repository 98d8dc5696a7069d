# SPDX-License-Identifier: Apache-2.0
"""Warm-start initialisation of a fresh drafter from its target's weights."""

from __future__ import annotations

import pytest
import torch

from dspark.training.features import target_features
from dspark.training.init import init_from_target
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
