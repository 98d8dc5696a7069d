# SPDX-License-Identifier: Apache-2.0
"""The drafter's LM head fused with the Markov draw (``dspark.ops.markov_sample_from_hidden``): which drafters
take it, and that a fused draft is the unfused one (tokens equal, z and U within fp32 rounding). On CPU the
fused path is switched on by hand (``fused_lm_head_devices``); on CUDA it is the default."""

from __future__ import annotations

import pytest
import torch

from dspark import DSparkDrafter
from tests.models.drafter_fixtures import random_checkpoint, tiny_config
from tests.ops.cuda_switches import kernel_names

TOL = dict(rtol=1e-5, atol=1e-5)


def _drafter(tmp_path, head_type="vanilla", rank=16, hidden=32):
    cfg = tiny_config(head_type, rank, block_size=5, hidden=hidden)
    random_checkpoint(tmp_path / head_type, cfg, seed=3)
    return DSparkDrafter.from_pretrained(tmp_path / head_type)


def _rounds(d, n=3, device="cpu"):
    """Drafts of three requests over ``n`` rounds of growing contexts: (tokens, z, U) per round."""
    gen = torch.Generator().manual_seed(0)
    ids, out = [4, 9, 1], []
    temp = torch.tensor([0.0, 1.0, 0.5], device=device)
    for rnd in range(n):
        width = 3 * d.config.hidden_size  # three tapped target layers
        feats = [torch.randn(3 + rnd, width, generator=gen).to(device, d.dtype) for _ in ids]
        d.append_context(ids, feats)
        anchors = torch.randint(0, 64, (3,), generator=gen).to(device)
        o = d.draft(ids, anchors, temp, seed=5, offset=rnd, return_base_logits=True)
        out.append((o.tokens, o.draft_logits, o.base_logits))
    return out


def test_which_drafters_fuse(tmp_path):
    d = _drafter(tmp_path)
    h = torch.zeros(2, 3, 32)
    assert not d.lm_head_fused(h)  # CPU: the few-row linear path stays
    d.fused_lm_head_devices = ("cpu",)
    assert d.lm_head_fused(h)
    assert not d.lm_head_fused(h.double())  # the LM head in another dtype than the hidden states
    d.fuse_lm_head = False
    assert not d.lm_head_fused(h)
    rnn = _drafter(tmp_path, "rnn")
    rnn.fused_lm_head_devices = ("cpu",)
    assert not rnn.lm_head_fused(h)  # only the vanilla head's bias is W2 W1[x]
    d.fuse_lm_head = True
    d.set_draft_vocab(list(range(0, 64, 2)))
    assert not d.lm_head_fused(h)  # a draft vocabulary extends the tables per call


def test_fused_draft_equals_unfused(tmp_path):
    fused, plain = _drafter(tmp_path), _drafter(tmp_path)
    fused.fused_lm_head_devices = ("cpu",)
    calls = []
    head = fused.markov_head
    original = head.sample_from_hidden
    head.sample_from_hidden = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    for (tf, zf, uf), (tp, zp, up) in zip(_rounds(fused), _rounds(plain), strict=True):
        assert torch.equal(tf, tp)
        torch.testing.assert_close(zf, zp, **TOL)
        torch.testing.assert_close(uf, up, **TOL)
    assert len(calls) == 3  # every round took the fused op


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_drafter_fuses_and_agrees(tmp_path):
    def bf16_drafter():
        return _drafter(tmp_path, hidden=64).to("cuda", torch.bfloat16)

    names = kernel_names(lambda: _rounds(bf16_drafter(), 1, "cuda"))
    assert "MarkovHiddenMmaKernel" in names, names
    plain = bf16_drafter()
    plain.fuse_lm_head = False
    for (tf, zf, _), (tp, zp, _) in zip(
        _rounds(bf16_drafter(), 3, "cuda"), _rounds(plain, 3, "cuda"), strict=True
    ):
        # the unfused pair rounds U to bf16: z differs by that, tokens only at near-ties of a random drafter
        assert float((tf[:, 0] == tp[:, 0]).float().mean()) >= 2 / 3
        torch.testing.assert_close(zf, zp, rtol=2e-2, atol=2e-2)
