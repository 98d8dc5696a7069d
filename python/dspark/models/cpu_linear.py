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

:func:`weight_stationary_linears` applies it to a model's ``nn.Linear`` modules for the duration of a ``with``
block (the target adapter wraps each forward in it), and restores the modules afterwards.

Where that path does not pay (:func:`pays_here`), a second one may: with MKL's fp32 GEMM the time of
``F.linear`` grows in proportion to the rows below 16 for a weight larger than the caches, while 16 rows take
the packed kernel (an Intel Xeon, 2 threads, SmolLM2's 49,152 × 576 LM head: 18.6 ms at 8 rows, 25.6 ms at 12,
12.8 ms for 16). So a large weight (:data:`PAD_MIN_NUMEL`) fed between :func:`pad_from` and 15 rows gets its
input padded with zero rows to 16 and the extra outputs dropped (:func:`padded_linear`); the rows kept are the
same dot products, through another kernel (float rounding, not bit for bit).
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


def default_max_rows() -> int:
    """Rows up to which the weight-stationary product is used: 0 where it does not pay.

    Measured (benchmarks/bench_cpu_linear.py, docs/benchmarks.md) on AMD EPYC CPUs with MKL: with one thread
    it is 1.3–2.3× faster at M ≤ 4 and no faster beyond; with two threads 1.5–3.5× at M ≤ 8 and 1.0–1.3× up to
    64 (MKL runs ``x · Wᵀ`` on one thread at few rows). On an Intel Xeon with AMX it was the other way round
    (a SmolLM2-135M step 2.2× slower), so on x86 with MKL the choice is confirmed once per process and thread
    count by :func:`pays_here`; elsewhere (another BLAS, another architecture) it is not used unless asked for.
    """
    if not torch.backends.mkl.is_available() or platform.machine().lower() not in ("x86_64", "amd64"):
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
    """Median wall seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones (the probes' timer)."""
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
        :func:`default_max_rows`. 0 always calls ``F.linear``.

    Returns
    -------
    Tensor
        ``(..., N)``, contiguous.
    """
    limit = default_max_rows() if max_rows is None else max_rows
    if not applies(x, weight, limit, bias):
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


# weights from this many fp32 elements (32 MiB) may be fed padded rows; smaller ones gain little or lose
PAD_MIN_NUMEL = 1 << 23
PAD_ROWS = 16  # MKL's fp32 GEMM packs rows by 16 on AVX-512 / AVX2
_PAD_PROBE_ROWS = (4, 6, 8, 10, 12)


def pad_from(weight: Tensor) -> int:
    """Fewest rows from which padding the input to :data:`PAD_ROWS` beats ``F.linear`` by 10 % for this
    weight's shape at the current thread count (:data:`PAD_ROWS`: never). Timed once per shape and thread
    count on the weight itself (medians of 5 at 4–12 and 16 rows; ~0.5 s for a 49,152 × 576 weight)."""
    n, k = (int(d) for d in weight.shape)
    key = (n, k, torch.get_num_threads())
    if key not in _PAD_FROM:
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)

            def median_s(rows: int) -> float:
                x = torch.randn(rows, k, generator=g)
                return _median_s(lambda: F.linear(x, weight), 1, 5)

            padded = median_s(PAD_ROWS)
            rows = [m for m in _PAD_PROBE_ROWS if padded < 0.9 * median_s(m)]
        _PAD_FROM[key] = rows[0] if rows else PAD_ROWS
    return _PAD_FROM[key]


_PAD_FROM: dict[tuple[int, int, int], int] = {}  # (N, K, threads) -> pad_from


def pads(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether :func:`padded_linear` pads this input: CPU fp32 without autograd, a weight of at least
    :data:`PAD_MIN_NUMEL` elements, and between :func:`pad_from` and ``PAD_ROWS - 1`` rows."""
    if weight.numel() < PAD_MIN_NUMEL or not applies(x, weight, PAD_ROWS - 1, bias):
        return False
    return x.numel() // x.shape[-1] >= pad_from(weight)


def padded_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, with ``x`` ``(..., K)`` padded by zero rows to :data:`PAD_ROWS` where
    :func:`pads` says so; ``(..., N)``."""
    return padded_product(x, weight, bias) if pads(x, weight, bias) else F.linear(x, weight, bias)


def padded_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` of ``x`` ``(..., K)`` (at most :data:`PAD_ROWS` rows) padded by zero rows to
    :data:`PAD_ROWS`, the padding's outputs dropped: ``(..., N)``. Unconditional (benchmarks force it)."""
    K = x.shape[-1]
    rows = x.reshape(-1, K)
    full = torch.zeros(PAD_ROWS, K, dtype=x.dtype)
    full[: rows.shape[0]] = rows
    return F.linear(full, weight, bias)[: rows.shape[0]].view(*x.shape[:-1], weight.shape[0])


def _padded_forward(module: nn.Linear, x: Tensor) -> Tensor:
    return padded_linear(x, module.weight, module.bias)


def plain_linears(module: nn.Module) -> list[nn.Linear]:
    """The modules of exact type ``nn.Linear`` in ``module`` (subclasses, e.g. quantised linears, excluded)."""
    return [m for m in module.modules() if type(m) is nn.Linear]


@contextlib.contextmanager
def weight_stationary_linears(linears: Iterable[nn.Module], max_rows: int | None = None) -> Iterator[int]:
    """Route the given plain ``nn.Linear`` modules through :func:`linear` inside the block.

    Changed: modules of exact type ``nn.Linear`` with an fp32 CPU weight whose ``forward`` is the class's own (a
    subclass, e.g. a quantised linear, a module another library has hooked by replacing ``forward``, or one the
    path can never apply to is left alone). Callers on a hot path pass a list made once with
    :func:`plain_linears`. The instance attribute set here is removed on exit, also when the block raises.
    With ``max_rows=None`` and a machine where :func:`default_max_rows` is 0, the large weights
    (:data:`PAD_MIN_NUMEL`) go through :func:`padded_linear` instead; ``max_rows=0`` changes nothing.
    Yields the row limit in use (0: the weight-stationary path is off).
    """
    limit = default_max_rows() if max_rows is None else int(max_rows)
    pad = max_rows is None and limit == 0 and platform.machine().lower() in ("x86_64", "amd64")
    patched: list[nn.Linear] = []
    if limit > 0 or pad:
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
            elif w.numel() >= PAD_MIN_NUMEL:
                d["forward"] = functools.partial(_padded_forward, m)
                patched.append(m)
    try:
        yield limit
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
