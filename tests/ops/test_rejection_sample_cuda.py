# SPDX-License-Identifier: Apache-2.0
"""rejection_sample on CUDA == CPU (same tokens for the same inputs and seeds); opcheck on CUDA."""

import pytest
import torch

import dspark
from tests.ops.test_rejection_sample import PROCS, rs_inputs

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
