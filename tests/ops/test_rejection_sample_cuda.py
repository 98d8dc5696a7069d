# SPDX-License-Identifier: Apache-2.0
"""rejection_sample on CUDA == CPU (same tokens for the same inputs and seeds); opcheck on CUDA."""

import pytest
import torch

import dspark
from dspark.reference import rejection_sample_ref
from tests.ops.test_rejection_sample import PROCS, rs_inputs
from tests.ops.test_rejection_sample_one_hot import (
    ONE_HOT_MASKS,
    TINY_V,
    _chi_square_p,
    _emitted,
    _tiny_law,
    _tiny_round,
    masked_draft_logits,
    onehot_inputs,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("procs", PROCS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_cuda_equals_cpu(procs, dtype, seed):
    args = rs_inputs(seed=seed, dtype=dtype, match=0.6)
    cpu = dspark.ops.rejection_sample(*args, seed, 1, **procs)
    gpu = dspark.ops.rejection_sample(
        *(a.cuda() for a in args), seed, 1, **{k: v.cuda() for k, v in procs.items()}
    )
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())


def test_large_vocab_cuda_equals_cpu():
    g = torch.Generator().manual_seed(0)
    R, G, V = 16, 7, 151936
    z = torch.randn(R, G, V, generator=g)
    vl = torch.full((R,), G + 1, dtype=torch.int32)
    qo = torch.arange(R + 1, dtype=torch.int32) * (G + 1)
    tl = z.repeat_interleave(1, 0)[:, :, :].reshape(R * G, V)
    tl = torch.cat([tl, torch.randn(R, V, generator=g)]).reshape(R * (G + 1), V)
    drafts = z.argmax(-1)
    temp = torch.ones(R)
    cpu = dspark.ops.rejection_sample(tl, qo, z, drafts, vl, temp, 3, 4)
    gpu = dspark.ops.rejection_sample(
        tl.cuda(), qo.cuda(), z.cuda(), drafts.cuda(), vl.cuda(), temp.cuda(), 3, 4
    )
    assert torch.equal(cpu[1], gpu[1].cpu())


def _cuda(kw):
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


@pytest.mark.parametrize("procs", PROCS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", ["mixed", "all", "no_draft_logits"])
def test_one_hot_cuda_equals_cpu(procs, dtype, mask):
    # deterministic proposals: mixed one-hot / normal requests (NaN in the one-hot requests' draft rows, never
    # read) and no draft_logits at all; ragged verify lengths, greedy and sampled rows, processors
    tl, qo, z, drafts, vl, temp = onehot_inputs(seed=21, dtype=dtype)
    zz, kw = masked_draft_logits(z, mask)
    kw.update(procs)
    for seed in range(3):
        cpu = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, seed, 1, **kw)
        gpu = dspark.ops.rejection_sample(
            *(a.cuda() for a in (tl, qo)),
            None if zz is None else zz.cuda(),
            *(a.cuda() for a in (drafts, vl, temp)),
            seed,
            1,
            **_cuda(kw),
        )
        assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu()), (seed, cpu, gpu)
    ref = rejection_sample_ref(tl, qo, zz, drafts, vl, temp, 2, 1, **kw)
    assert torch.equal(ref[1], gpu[1].cpu())


def test_one_hot_large_vocab_cuda_equals_cpu():
    # x excluded from the residual at any id of a 151936 vocabulary (the block-strided loops)
    g = torch.Generator().manual_seed(1)
    R, G, V = 16, 7, 151936
    tl = torch.randn(R * (G + 1), V, generator=g) * 2
    drafts = torch.randint(0, V, (R, G), generator=g)
    drafts[:, 0] = tl[:: G + 1].argmax(-1)  # often accepted at position 0
    vl = torch.full((R,), G + 1, dtype=torch.int32)
    qo = torch.arange(R + 1, dtype=torch.int32) * (G + 1)
    temp = torch.ones(R)
    cpu = dspark.ops.rejection_sample(tl, qo, None, drafts, vl, temp, 3, 4)
    gpu = dspark.ops.rejection_sample(tl.cuda(), qo.cuda(), None, drafts.cuda(), vl.cuda(), temp.cuda(), 3, 4)
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())


def test_one_hot_round_has_the_target_law_cuda():
    # the exact law of the tiny round (see the CPU test), on the device; q uniform must fail the same test
    drafts, t, k, R = [0, 2], 1.0, 0, 6000
    law = _tiny_law(drafts, t, k)
    tl, qo, d, vl, temp, seed, kw = _tiny_round(R, drafts, t, k, seed=7)
    dev = [a.cuda() for a in (tl, qo, d, vl, temp)]
    acc, out = dspark.ops.rejection_sample(dev[0], dev[1], None, *dev[2:], seed, 4, **_cuda(kw))
    assert _chi_square_p(_emitted(acc.cpu(), out.cpu()), law) > 1e-4
    uniform = torch.zeros(R, 2, TINY_V, device="cuda")
    bad = dspark.ops.rejection_sample(dev[0], dev[1], uniform, *dev[2:], seed, 4, **_cuda(kw))
    assert _chi_square_p(_emitted(bad[0].cpu(), bad[1].cpu()), law) < 1e-6


def test_one_hot_opcheck_cuda():
    tl, qo, z, drafts, vl, temp = (a.cuda() for a in onehot_inputs(R=6, V=50, seed=2))
    op = torch.ops.dspark.rejection_sample.default
    oh = ONE_HOT_MASKS["mixed"].cuda()
    torch.library.opcheck(op, (tl, qo, z, drafts, vl, temp, 1, 2) + (None,) * 6 + (oh,))
    torch.library.opcheck(op, (tl, qo, None, drafts, vl, temp, 1, 2) + (None,) * 6)
