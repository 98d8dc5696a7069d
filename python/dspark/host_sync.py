# SPDX-License-Identifier: Apache-2.0
"""Reading device tensors on the host with one synchronisation per read point.

A decoding round has to look at a few device values on the host (the plan's verify lengths, which shape the
target's packed batch; the accepted counts and tokens, which finished-request bookkeeping needs; NaN flags).
Reading them one by one (``.tolist()``, ``bool(...)``) would stall the GPU once per value. :class:`HostReader`
queues every copy asynchronously and waits once, and counts the waits so that tests can hold the decoder to
its budget (docs/decoder.md, "Host synchronisation").

The other direction matters as much: ``torch.tensor(list, device="cuda")`` copies from pageable memory, and
PyTorch synchronises the stream for such a copy. :func:`to_device` stages host values in pinned memory and
queues the copy behind the work already launched, so the per-round index tensors cost no wait.

NaN / inf in the draft or target logits must fail the round, but checking them on the host would be a read:
:func:`all_finite` leaves the flag on the device (read later with the round's results) and :func:`sanitized`
makes the logits safe for the sampler meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def to_device(
    values: Tensor | Sequence[int] | Sequence[float],
    device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """``values`` (a host tensor or a list) as a tensor on ``device``, without waiting for the device.

    On CUDA the values are staged in pinned memory and copied ``non_blocking`` (the caching host allocator keeps
    the staging buffer alive until the copy has run); elsewhere this is ``tensor.to(device)``. A tensor already
    on ``device`` is returned as it is (cast to ``dtype`` when given).
    """
    t = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    dev = torch.device(device)
    if t.device.type == "cpu" and dev.type == "cuda":
        return t.pin_memory().to(dev, non_blocking=True)
    return t.to(dev)


def cat_to_device(parts: Sequence[Tensor], device: torch.device | str) -> Tensor:
    """``torch.cat(parts)`` on ``device``: host parts in one pinned copy for the batch rather than one per part
    (a batch's per-request ids or positions), parts already on one device where they are."""
    if len({t.device for t in parts}) == 1:
        return to_device(torch.cat(list(parts)), device)
    return torch.cat([to_device(t, device) for t in parts])


def all_finite(x: Tensor) -> Tensor:
    """0-d bool tensor on ``x``'s device: no NaN, +inf or -inf in ``x`` (nothing is read).

    One min/max reduction (NaN propagates through it); ``torch.isfinite(x).all()`` builds a bool tensor of
    ``x``'s size first and was ~5x slower for a ``[8, 7, 49152]`` float32 ``x`` on a CPU.
    """
    if x.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=x.device)
    lo, hi = torch.aminmax(x)
    return torch.isfinite(lo) & torch.isfinite(hi)


def rows_finite(x: Tensor) -> Tensor:
    """bool tensor of shape ``x.shape[:-1]`` on ``x``'s device: which rows hold no NaN / ±inf (nothing is read).

    Per-row flags let a caller fail only on the rows whose values it uses (a round commits a prefix of its
    verify rows). One min/max reduction over the last dimension, as in :func:`all_finite`.
    """
    if x.numel() == 0:
        return torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
    lo, hi = torch.aminmax(x, dim=-1)
    return torch.isfinite(lo) & torch.isfinite(hi)


def sanitized(x: Tensor, finite: Tensor) -> Tensor:
    """``x`` with NaN / ±inf replaced by 0, so that a sampler can run on it; ``finite`` from :func:`all_finite`
    or :func:`rows_finite`.

    The caller fails the round from ``finite`` when it reads its results. On a CPU reading the flag costs
    nothing, so a finite ``x`` is returned as it is; on other devices the flag stays unread and ``x`` is always
    replaced (a copy without a wait).
    """
    if x.device.type == "cpu" and bool(finite.all()):
        return x
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


class HostReader:
    """Copies groups of tensors to the CPU, with one wait per :meth:`fetch` call.

    Attributes
    ----------
    syncs : int
        Number of :meth:`fetch` calls so far (each one is at most one device synchronisation).
    """

    def __init__(self) -> None:
        self.syncs = 0

    def fetch(self, *tensors: Tensor | None) -> list[Tensor | None]:
        """CPU copies of ``tensors`` (``None`` passes through), all ready on return.

        On CUDA every copy is queued with ``non_blocking=True`` (into pinned memory) and the current stream is
        synchronised once; CPU tensors are returned as they are.
        """
        self.syncs += 1
        devices = {t.device for t in tensors if t is not None and t.device.type != "cpu"}
        if not devices:
            return list(tensors)
        out = [None if t is None else t.to("cpu", non_blocking=True) for t in tensors]
        for dev in devices:
            if dev.type == "cuda":
                torch.cuda.current_stream(dev).synchronize()
            else:  # other accelerators: a blocking copy is the portable way to be sure
                out = [None if t is None else t.cpu() for t in tensors]
        return out
