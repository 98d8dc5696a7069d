# SPDX-License-Identifier: Apache-2.0
"""Few-row fp32 linear layers on CPU: the weight-stationary GEMM orientation (see docs/target-adapter.md).

A decode or verify step multiplies a handful of rows ``x [M, K]`` (M = 1 for plain decoding, 2–8 for a
speculative verify) by every weight ``W [N, K]`` of the model. ``F.linear`` computes ``x · Wᵀ``; with MKL's
fp32 GEMM on x86 that orientation is slow for few rows (all the weights of SmolLM2-135M once, 2 threads of a
Xeon: 46 ms at M = 1, 75–94 ms at M = 2–3, on one thread whatever the thread count), while the transposed
product ``W · xᵀ`` (the weight as the left operand, read in its stored row-major order) takes 21–28 ms. So for few
rows :func:`linear` computes ``(W · xᵀ)ᵀ``; a single row is doubled first (M = 1 would otherwise be a GEMV,
which is the slow 46 ms case). The products are the same dot products summed in another order: results agree
with ``F.linear`` to float rounding, not bit for bit.

:func:`few_row_linears` applies it to a model's ``nn.Linear`` modules for the duration of a ``with``
block (the target adapter wraps each forward in it), and restores the modules afterwards.

Where that path does not pay (:func:`pays_here`), the ``dspark::few_row_linear`` op may: it streams each
weight once for all the rows (:func:`op_applies`: x86 with AVX2 or AVX-512, :data:`OP_MIN_ROWS` to
:data:`OP_MAX_ROWS` rows, weights of at least :data:`OP_MIN_NUMEL` elements).
"""

from __future__ import annotations

import contextlib
import functools
import platform
import time
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import dspark.ops  # noqa: F401  (registers the ops' fakes; torch.ops.dspark.few_row_linear below)


def default_max_rows() -> int:
    """Rows up to which the weight-stationary product is used: 0 where it does not pay.

    Measured (benchmarks/bench_cpu_linear.py, docs/benchmarks.md) on AMD EPYC CPUs with MKL: with one thread
    it is 1.3–2.3× faster at M ≤ 4 and no faster beyond; with two threads 1.5–3.5× at M ≤ 8 and 1.0–1.3× up to
    64 (MKL runs ``x · Wᵀ`` on one thread at few rows). On an Intel Xeon with AMX it was the other way round
    (a SmolLM2-135M step 2.2× slower), so on x86 with MKL the choice is confirmed once per process and thread
    count by :func:`pays_here`; elsewhere (another BLAS, another architecture) it is not used unless asked for.
    """
    if not torch.backends.mkl.is_available() or not _x86():
        return 0
    threads = torch.get_num_threads()
    if not pays_here(threads):
        return 0
    return 4 if threads < 2 else 64


@functools.cache
def pays_here(threads: int) -> bool:
    """Whether ``(W · xᵀ)ᵀ`` beats ``F.linear`` by 10 % for a 1-row and a 4-row input on this CPU at
    ``threads`` threads (medians of 7 timings of a 2048 × 1024 fp32 weight, ~40 ms once per process)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2048, 1024, generator=g)
    with torch.no_grad():
        for rows in (1, 4):
            x = torch.randn(rows, 1024, generator=g)
            plain = _median_s(lambda x=x: F.linear(x, w), 2, 7)
            stationary = _median_s(lambda x=x, n=rows: linear(x, w, max_rows=n), 2, 7)
            if not stationary < 0.9 * plain:
                return False
    return True


def _median_s(fn, warmup: int, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[repeats // 2]


def applies(x: Tensor, weight: Tensor, max_rows: int, bias: Tensor | None = None) -> bool:
    """Whether :func:`linear` takes the weight-stationary path for this input (CPU, fp32, no autograd)."""
    if max_rows <= 0 or x.device.type != "cpu" or weight.device.type != "cpu":
        return False
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.dim() != 2:
        return False
    grads = (x, weight) if bias is None else (x, weight, bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in grads):
        return False
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    return 1 <= rows <= max_rows and x.shape[-1] == weight.shape[1]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, max_rows: int | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, as ``(W · xᵀ)ᵀ`` when x has few rows (CPU fp32; see the module doc).

    Parameters
    ----------
    x : Tensor
        ``(..., K)``.
    weight : Tensor
        ``(N, K)``.
    bias : Tensor, optional
        ``(N,)``.
    max_rows : int, optional
        Largest row count ``prod(x.shape[:-1])`` that takes the weight-stationary path; default
        :func:`default_max_rows`, and where that is 0 the ``dspark::few_row_linear`` op where
        :func:`op_applies`. 0 always calls ``F.linear``.

    Returns
    -------
    Tensor
        ``(..., N)``, contiguous.
    """
    limit = default_max_rows() if max_rows is None else max_rows
    if not applies(x, weight, limit, bias):
        if max_rows is None and limit == 0 and op_applies(x, weight, bias):
            return _op_linear(x, weight, bias)
        return F.linear(x, weight, bias)
    K = x.shape[-1]
    rows = x.reshape(-1, K)
    if rows.shape[0] == 1:  # a GEMV is the slow case: compute two identical columns, keep one
        y = torch.mm(weight, torch.cat([rows, rows]).t())[:, :1]
    else:
        y = torch.mm(weight, rows.t())
    y = y.t().contiguous()
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], weight.shape[0])


def _forward(module: nn.Linear, x: Tensor, max_rows: int) -> Tensor:
    return linear(x, module.weight, module.bias, max_rows)


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


# the rows dspark::few_row_linear takes (docs/benchmarks.md). AVX-512 (2-thread Xeon with AMX, SmolLM2-135M's
# weights, 6 x 4 register tiles): 1.0-1.1x F.linear at 1-3 rows, 1.6-2.0x at 4-16, 1.3-1.5x at 24-32, 1.2x at
# 48-64. AVX2 only (2-thread Zen 3, 3 x 4 register tiles): whole SmolLM2 forwards of 8 requests 1.24-1.59x
# faster with it than with F.linear at 40-64 rows.
OP_MIN_ROWS = 1
OP_MAX_ROWS = 64
OP_MIN_NUMEL = 1 << 16  # smaller weights sit in cache, where the per-call cost matters more than the reads


def op_applies(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether the ``dspark::few_row_linear`` op takes this product: x86 with AVX2 or AVX-512 (ATen's CPU
    capability), CPU fp32 without autograd, a weight of at least :data:`OP_MIN_NUMEL` elements and between
    :data:`OP_MIN_ROWS` and :data:`OP_MAX_ROWS` rows."""
    if weight.numel() < OP_MIN_NUMEL or not applies(x, weight, OP_MAX_ROWS, bias):
        return False
    if bias is not None and (bias.dtype != torch.float32 or bias.dim() != 1):
        return False
    return x.numel() // x.shape[-1] >= OP_MIN_ROWS and _simd_x86()


@functools.cache
def _simd_x86() -> bool:
    return _x86() and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


_few_row_op = torch.ops.dspark.few_row_linear.default


def _op_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    K = x.shape[-1]
    return _few_row_op(x.reshape(-1, K), weight, bias).view(*x.shape[:-1], weight.shape[0])


def _op_forward(module: nn.Linear, x: Tensor) -> Tensor:
    """A routed module's forward: the op's checks that can change per call (rows, dtype, autograd), inline
    because the 200-odd linears of a forward each pay them (the weight's were made when routing it)."""
    params = module.__dict__["_parameters"]
    w, b = params["weight"], params["bias"]
    K = x.shape[-1]
    rows = x.numel() // K if K else 0
    if (
        OP_MIN_ROWS <= rows <= OP_MAX_ROWS
        and x.dtype == torch.float32
        and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        and (b is None or not (torch.is_grad_enabled() and b.requires_grad))
    ):
        return _few_row_op(x.reshape(rows, K), w, b).view(*x.shape[:-1], w.shape[0])
    return F.linear(x, w, b)


def plain_linears(module: nn.Module) -> list[nn.Linear]:
    """The modules of exact type ``nn.Linear`` in ``module`` (subclasses, e.g. quantised linears, excluded)."""
    return [m for m in module.modules() if type(m) is nn.Linear]


@contextlib.contextmanager
def few_row_linears(linears: Iterable[nn.Module], max_rows: int | None = None) -> Iterator[int]:
    """Route the given plain ``nn.Linear`` modules through the faster few-row product inside the block.

    Changed: modules of exact type ``nn.Linear`` with an fp32 CPU weight whose ``forward`` is the class's own (a
    subclass, e.g. a quantised linear, a module another library has hooked by replacing ``forward``, or one the
    path can never apply to is left alone). Callers on a hot path pass a list made once with
    :func:`plain_linears`. The instance attribute set here is removed on exit, also when the block raises.
    The weight-stationary :func:`linear` where ``max_rows`` (default :func:`default_max_rows`) is above 0;
    with ``max_rows=None`` on x86 with AVX2 / AVX-512 where that is 0, weights of at least
    :data:`OP_MIN_NUMEL` elements go through ``dspark::few_row_linear`` where :func:`op_applies` (else
    ``F.linear``); ``max_rows=0`` changes nothing.
    Yields the row limit of the weight-stationary path (0: off).
    """
    limit = default_max_rows() if max_rows is None else int(max_rows)
    use_op = max_rows is None and limit == 0 and _simd_x86()
    patched: list[nn.Linear] = []
    if limit > 0 or use_op:
        for m in linears:
            if type(m) is not nn.Linear:
                continue
            # read and set directly: nn.Module's __getattr__ / __setattr__ cost microseconds each
            d = m.__dict__
            w = d["_parameters"]["weight"]
            if w.dtype != torch.float32 or w.device.type != "cpu" or "forward" in d:
                continue
            if limit > 0:
                d["forward"] = functools.partial(_forward, m, max_rows=limit)
                patched.append(m)
            elif w.numel() >= OP_MIN_NUMEL:
                d["forward"] = functools.partial(_op_forward, m)
                patched.append(m)
    try:
        yield limit
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
