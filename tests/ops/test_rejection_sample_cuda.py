# SPDX-License-Identifier: Apache-2.0
"""rejection_sample on CUDA == CPU (same tokens for the same inputs and seeds; with top-p split over the
vocabulary, except requests where the fixed-point and lane-sum top-p rules keep other ids: contract C4,
tests/ops/top_p_c4.py); opcheck on CUDA."""

import pytest
import torch

import dspark
from dspark.reference import rejection_sample_ref
from tests.ops.cuda_switches import kernel_names, set_switch
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
from tests.ops.top_p_c4 import assert_equal_outside, top_p_disagreements

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def choose_kernels(split, monkeypatch):
    """ "on": greedy and sampled rows split over the vocabulary (the default where they fit); "off": one block
    per request walking its rows (DSPARK_CUDA_REJECTION_SPLIT=0). Both give the CPU's tokens (split top-p:
    outside top_p_disagreements)."""
    set_switch(monkeypatch, "DSPARK_CUDA_REJECTION_SPLIT", split == "on")


@pytest.mark.parametrize("procs", PROCS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("split", ["on", "off"])
def test_cuda_equals_cpu(procs, dtype, seed, split, monkeypatch):
    choose_kernels(split, monkeypatch)
    args = rs_inputs(seed=seed, dtype=dtype, match=0.6)
    cpu = dspark.ops.rejection_sample(*args, seed, 1, **procs)
    gpu = dspark.ops.rejection_sample(
        *(a.cuda() for a in args), seed, 1, **{k: v.cuda() for k, v in procs.items()}
    )
    skip = top_p_disagreements(args, procs) if split == "on" else set()
    assert len(skip) <= 1  # near-ties of the top-p boundary are rare
    assert_equal_outside(cpu, gpu, skip)


@pytest.mark.parametrize("split", ["on", "off"])
def test_large_vocab_cuda_equals_cpu(split, monkeypatch):
    choose_kernels(split, monkeypatch)
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
@pytest.mark.parametrize("split", ["on", "off"])
def test_one_hot_cuda_equals_cpu(procs, dtype, mask, split, monkeypatch):
    choose_kernels(split, monkeypatch)
    # deterministic proposals: mixed one-hot / normal requests (NaN in the one-hot requests' draft rows, never
    # read) and no draft_logits at all; ragged verify lengths, greedy and sampled rows, processors
    tl, qo, z, drafts, vl, temp = onehot_inputs(seed=21, dtype=dtype)
    zz, kw = masked_draft_logits(z, mask)
    kw.update(procs)
    # split top-p rows take the fixed-point threshold (C4): equal outside the requests where the two rules keep
    # other ids (p only, so the same set for every seed and whatever q is)
    skip = top_p_disagreements((tl, qo, zz, drafts, vl, temp), procs) if split == "on" else set()
    assert len(skip) <= 1  # near-ties of the top-p boundary are rare
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
        assert_equal_outside(cpu, gpu, skip)
    ref = rejection_sample_ref(tl, qo, zz, drafts, vl, temp, 2, 1, **kw)
    assert_equal_outside(ref, gpu, skip)


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


def _greedy_case(R, G, V, seed, dtype, penalty):
    """All-greedy rounds whose drafts follow the target's argmax often (long accepted runs) and, with
    ``penalty``, histories whose ids fall in every 4,096-id chunk of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    vl = torch.full((R,), G + 1, dtype=torch.int32)
    vl[::3] = torch.randint(1, G + 1, (len(vl[::3]),), generator=g).to(torch.int32)
    qo = torch.zeros(R + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(vl, 0)
    tl = torch.randn(int(qo[-1]), V, generator=g).to(dtype)
    drafts = torch.randint(0, V, (R, G), generator=g)
    for r in range(R):
        for i in range(int(vl[r]) - 1):
            if torch.rand((), generator=g) < 0.8:
                drafts[r, i] = int(tl[int(qo[r]) + i].float().argmax())
    procs = {}
    if penalty:
        counts = torch.randint(0, 300, (R,), generator=g)
        procs = {
            "repetition_penalty": torch.linspace(0.7, 1.8, R),
            "penalty_tokens": torch.randint(0, V, (int(counts.sum()),), generator=g),
            "penalty_indptr": torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]),
        }
    return (tl, qo, None, drafts, vl, torch.zeros(R)), procs


@pytest.mark.parametrize("split", ["on", "off"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("penalty", [False, True])
def test_greedy_rounds_split_over_the_vocabulary_equal_cpu(split, dtype, penalty, monkeypatch):
    # greedy requests run on (request, row, 4,096-id chunk) CTAs; the tokens and accepted counts are the CPU
    # op's exactly (an argmax, ties to the lowest id); DSPARK_CUDA_REJECTION_SPLIT=0 keeps the one-block kernel
    choose_kernels(split, monkeypatch)
    args, procs = _greedy_case(12, 7, 151936, 5, dtype, penalty)
    cpu = dspark.ops.rejection_sample(*args, 3, 4, **procs)
    gpu = dspark.ops.rejection_sample(
        *(a.cuda() if a is not None else None for a in args), 3, 4, **_cuda(procs)
    )
    assert int(cpu[0].sum()) > 12  # runs of accepted drafts, not only first-row rejections
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())


def test_greedy_ties_go_to_the_lowest_id_across_chunks():
    # one row, a maximum shared by ids in three chunks, and a row whose maximum is a zero held as -0.0 at a
    # lower id and +0.0 at a higher one: the lowest id wins both, as on the CPU
    V = 3 * 4096 + 17
    tl = torch.full((2, V), -1.0)
    tl[0, [9000, 5000, 12300]] = 2.5
    tl[1, 3], tl[1, 7000] = -0.0, 0.0
    args = (tl, torch.tensor([0, 1, 2], dtype=torch.int32), None, torch.zeros(2, 1, dtype=torch.int64))
    rest = (torch.ones(2, dtype=torch.int32), torch.zeros(2))
    cpu = dspark.ops.rejection_sample(*args, *rest, 0, 0)
    gpu = dspark.ops.rejection_sample(*(a.cuda() if a is not None else None for a in args + rest), 0, 0)
    assert cpu[1][:, 0].tolist() == [5000, 3]
    assert torch.equal(cpu[1], gpu[1].cpu()) and torch.equal(cpu[0], gpu[0].cpu())


def _sampled_case(R, G, V, seed, dtype):
    """Sampled rounds over a multi-chunk vocabulary: temperatures in (0, 1.5], drafts often the target's
    peak (runs of accepted drafts), histories with ids in every 4,096-id chunk, a third of the requests
    with deterministic (one-hot) proposals, every verify length."""
    g = torch.Generator().manual_seed(seed)
    vl = torch.randint(1, G + 2, (R,), generator=g).to(torch.int32)
    vl[0] = G + 1
    qo = torch.zeros(R + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(vl, 0)
    tl = torch.randn(int(qo[-1]), V, generator=g) * 2.0
    z = torch.randn(R, G, V, generator=g) * 2.0
    drafts = torch.randint(0, V, (R, G), generator=g)
    for r in range(R):
        for i in range(int(vl[r]) - 1):
            if torch.rand((), generator=g) < 0.8:  # p and q both peaked at the draft: accepted often
                tl[int(qo[r]) + i, drafts[r, i]] += 30.0
                z[r, i, drafts[r, i]] += 30.0
    tl = tl.to(dtype)
    temp = torch.rand(R, generator=g) * 1.4 + 0.1
    counts = torch.randint(0, 300, (R,), generator=g)
    procs = {
        "repetition_penalty": torch.linspace(0.8, 1.6, R),
        "penalty_tokens": torch.randint(0, V, (int(counts.sum()),), generator=g),
        "penalty_indptr": torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]),
        "request_ids": torch.randint(0, 2**32, (R,), generator=g),
        "draft_one_hot": torch.arange(R) % 3 == 1,
    }
    return (tl, qo, z, drafts, vl, temp), procs


@pytest.mark.parametrize("split", ["on", "off"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("filtering", ["none", "top_k", "top_p"])
def test_sampled_rounds_split_over_the_vocabulary_equal_cpu(split, dtype, filtering, monkeypatch):
    # sampled requests run on (request, row, 4,096-id chunk) CTAs — the top-k threshold by a radix select whose
    # digit histograms are summed over the chunks, the normalisers in the CPU's lane order — so the tokens and
    # accepted counts are the CPU op's exactly; the top-p threshold by a radix select over fixed-point masses,
    # so exactly except where that rule and the CPU's keep other ids (C4)
    choose_kernels(split, monkeypatch)
    R, V = 10, 3 * 4096 + 1000
    args, procs = _sampled_case(R, 7, V, 8, dtype)
    if filtering == "top_k":  # 0 and >= V keep every id; 1 keeps only the argmax
        procs["top_k"] = torch.tensor([0, 50, V, 3000, 7, 0, 1, 4097, V + 5, 20])
    if filtering == "top_p":
        procs["top_p"] = torch.tensor([1.0, 0.9, 0.5, 0.99, 0.7, 1.0, 0.3, 0.95, 0.8, 0.6])
    cpu = dspark.ops.rejection_sample(*args, 3, 4, **procs)
    gpu_args = tuple(a.cuda() for a in args)
    gpu = dspark.ops.rejection_sample(*gpu_args, 3, 4, **_cuda(procs))
    assert int(cpu[0].sum()) > R  # runs of accepted drafts, not only first-row rejections
    skip = top_p_disagreements(args, procs) if split == "on" else set()
    assert len(skip) <= 2
    assert_equal_outside(cpu, gpu, skip)
    names = kernel_names(lambda: dspark.ops.rejection_sample(*gpu_args, 3, 4, **_cuda(procs)))
    assert ("SampledMaxKernel" in names) == (split == "on"), names
    assert ("SampledTopKPassKernel" in names) == (split == "on" and filtering == "top_k"), names
    assert ("SampledTopPPassKernel" in names) == (split == "on" and filtering == "top_p"), names


def test_sampled_split_top_k_ties_at_the_threshold_equal_cpu():
    # rows whose k-th largest logit is tied across chunks, a zero held as -0.0 and +0.0, and -inf entries: the
    # radix select keeps the ids the CPU's threshold search keeps
    R, G, V = 3, 2, 2 * 4096 + 300
    tl = torch.full((R * (G + 1), V), -3.0)
    tl[:, [10, 4100, 8200]] = 1.5  # three-way tie at the top
    tl[:, [20, 5000]] = 0.0
    tl[:, 21] = -0.0
    tl[:, 6000:6010] = float("-inf")
    z = torch.randn(R, G, V, generator=torch.Generator().manual_seed(3))
    drafts = torch.tensor([[10, 4100], [20, 21], [8200, 5000]])
    vl = torch.full((R,), G + 1, dtype=torch.int32)
    qo = torch.arange(R + 1, dtype=torch.int32) * (G + 1)
    temp = torch.tensor([1.0, 0.5, 2.0])
    for k in ([2, 3, 4], [3, 5, 6], [1, 2, 3]):
        top_k = torch.tensor(k)
        for seed in range(4):
            args = (tl, qo, z, drafts, vl, temp)
            cpu = dspark.ops.rejection_sample(*args, seed, 0, top_k=top_k)
            gpu = dspark.ops.rejection_sample(*(a.cuda() for a in args), seed, 0, top_k=top_k.cuda())
            assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu()), (k, seed)


def test_sampled_split_draws_equal_cpu_at_large_vocab():
    # V = 151,936 (38 chunks), fp32 and a bonus / residual mix: many seeds, every token equal to the CPU op's
    R, G, V = 4, 7, 151936
    for seed in range(6):
        args, procs = _sampled_case(R, G, V, 100 + seed, torch.bfloat16)
        cpu = dspark.ops.rejection_sample(*args, seed, 9, **procs)
        gpu = dspark.ops.rejection_sample(*(a.cuda() for a in args), seed, 9, **_cuda(procs))
        assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu()), seed


@pytest.mark.parametrize("ids", ["given", "none"])
@pytest.mark.parametrize("filtering", ["none", "top_k", "top_p"])
def test_a_batch_in_chunks_gives_each_request_its_tokens(ids, filtering, monkeypatch):
    # C2: which kernels sample a request never depends on R. A batch whose split workspace passes its budget
    # (DSPARK_CUDA_REJECTION_WS_BYTES; 1 GiB by default, R = 64 at gamma 7 and V = 151,936) runs in chunks of
    # requests; each request must get the tokens the one-launch call gives it — also without request_ids,
    # where a request's Philox key is its index in the whole batch, not in its chunk
    R, G, V = 10, 7, 3 * 4096 + 1000
    args, procs = _sampled_case(R, G, V, 11, torch.float32)
    if ids == "none":
        del procs["request_ids"]
    if filtering == "top_k":
        procs["top_k"] = torch.tensor([0, 50, V, 3000, 7, 0, 1, 4097, V + 5, 20])
    if filtering == "top_p":
        procs["top_p"] = torch.tensor([1.0, 0.9, 0.5, 0.99, 0.7, 1.0, 0.3, 0.95, 0.8, 0.6])
    gpu_args = tuple(a.cuda() for a in args)
    whole = dspark.ops.rejection_sample(*gpu_args, 5, 9, **_cuda(procs))
    row_bytes = 2 * (G + 1) * V * 4
    for per_chunk in (1, 3, 4):
        monkeypatch.setenv("DSPARK_CUDA_REJECTION_WS_BYTES", str(per_chunk * row_bytes))
        chunked = dspark.ops.rejection_sample(*gpu_args, 5, 9, **_cuda(procs))
        assert torch.equal(chunked[0], whole[0]) and torch.equal(chunked[1], whole[1]), per_chunk
    assert int(whole[0].sum()) > R  # runs of accepted drafts
    # the chunks take the split kernels, as the whole batch does
    names = kernel_names(lambda: dspark.ops.rejection_sample(*gpu_args, 5, 9, **_cuda(procs)))
    assert "SampledMaxKernel" in names, names
