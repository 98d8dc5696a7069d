# SPDX-License-Identifier: Apache-2.0
"""markov_sample on CUDA == CPU bit for bit (tokens, z, prev_emb); opcheck on CUDA."""

import pytest
import torch

import dspark
from tests.ops.test_markov_sample import markov_inputs

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("R,G,V,r", [(1, 1, 7, 1), (3, 4, 300, 12), (9, 7, 5000, 64), (64, 7, 49152, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_equals_cpu(R, G, V, r, dtype):
    args = markov_inputs(R, G, V, r, dtype, dtype, seed=R)
    ids = torch.randint(0, 2**32, (R,))
    cpu = dspark.ops.markov_sample(*args, 7, 3, ids)
    gpu = dspark.ops.markov_sample(*(a.cuda() for a in args), 7, 3, ids.cuda())
    for name, c, g in zip(("tokens", "draft_logits", "prev_emb"), cpu, gpu, strict=True):
        assert torch.equal(c, g.cpu()), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_w2_off_16_byte_alignment_equals_cpu(dtype):
    """A W2 whose data starts one element past a 16-byte boundary takes the scalar path (the 8-wide loads
    need the alignment); both paths match the CPU op."""
    U, anchor, w1, w2, temp = markov_inputs(9, 5, 3000, 64, dtype, dtype, seed=4)
    flat = torch.empty(w2.numel() + 1, dtype=dtype, device="cuda")
    w2_gpu = flat[1:].view_as(w2)
    w2_gpu.copy_(w2)
    assert w2_gpu.is_contiguous() and w2_gpu.data_ptr() % 16 != 0
    ids = torch.randint(0, 2**32, (9,))
    cpu = dspark.ops.markov_sample(U, anchor, w1, w2, temp, 7, 3, ids)
    gpu = dspark.ops.markov_sample(U.cuda(), anchor.cuda(), w1.cuda(), w2_gpu, temp.cuda(), 7, 3, ids.cuda())
    for name, c, g in zip(("tokens", "draft_logits", "prev_emb"), cpu, gpu, strict=True):
        assert torch.equal(c, g.cpu()), name


def test_opcheck_cuda():
    args = [a.cuda() for a in markov_inputs(2, 3, 40, 4)]
    torch.library.opcheck(torch.ops.dspark.markov_sample.default, (*args, 1, 2, None))
