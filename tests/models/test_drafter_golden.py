# SPDX-License-Identifier: Apache-2.0
"""Golden test: our loader + drafter vs the plain DeepSpec forward (tests/models/deepspec_plain.py)."""

from __future__ import annotations

import pytest
import torch

from dspark import DSparkDrafter
from tests.models.deepspec_plain import plain_draft
from tests.models.drafter_fixtures import random_checkpoint, tiny_config

TOL = dict(rtol=1e-5, atol=1e-5)


def _check(ours, plain, k):
    torch.testing.assert_close(ours.hidden[k], plain["hidden"], **TOL)
    torch.testing.assert_close(ours.base_logits[k], plain["base"], **TOL)
    torch.testing.assert_close(ours.draft_logits[k], plain["z"], **TOL)
    assert ours.tokens[k].tolist() == plain["tokens"].tolist()
    if plain["conf"] is None:
        assert ours.conf is None
    else:
        torch.testing.assert_close(ours.conf_logit[k], plain["conf_logit"].float(), **TOL)
        torch.testing.assert_close(ours.conf[k], plain["conf"].float(), **TOL)
        torch.testing.assert_close(ours.survival[k], plain["survival"].float(), **TOL)


@pytest.mark.parametrize(
    "head_type,rank,rope_style",
    [("vanilla", 6, "parameters"), ("gated", 6, "theta"), ("rnn", 6, "parameters"), ("vanilla", 0, "theta")],
)
def test_golden_rounds(tmp_path, head_type, rank, rope_style):
    cfg = tiny_config(head_type, rank, rope_style=rope_style)
    w = random_checkpoint(tmp_path / "ckpt", cfg, seed=1)
    drafter = DSparkDrafter.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    assert (drafter.markov_head is None) == (rank == 0)
    gen = torch.Generator().manual_seed(2)
    width = len(cfg["target_layer_ids"]) * cfg["hidden_size"]
    # two requests, different context lengths and offsets; rounds alternate greedy and sampled
    reqs = {7: dict(first=0, feats=torch.zeros(0, width)), 12: dict(first=3, feats=torch.zeros(0, width))}
    growth = [(5, 9), (1, 3), (3, 1), (4, 2)]
    for rnd, ns in enumerate(growth):
        ids, new = list(reqs), []
        for rid, n in zip(ids, ns, strict=True):
            f = torch.randn(n, width, generator=gen)
            new.append(f)
            reqs[rid]["feats"] = torch.cat([reqs[rid]["feats"], f])
        positions = [reqs[rid]["first"] for rid in ids] if rnd == 0 else None
        drafter.append_context(ids, new, positions)
        anchors = torch.randint(0, cfg["vocab_size"], (2,), generator=gen)
        temp = 0.0 if rnd % 2 == 0 else 0.8
        out = drafter.draft(ids, anchors, temp, seed=11, offset=rnd, return_base_logits=True)
        for k, rid in enumerate(ids):
            assert drafter.context_length(rid) == reqs[rid]["feats"].shape[0]
            ref = plain_draft(
                w, cfg, reqs[rid]["feats"], reqs[rid]["first"], int(anchors[k]), temp, 11, rnd, request=rid
            )
            _check(out, ref, k)
