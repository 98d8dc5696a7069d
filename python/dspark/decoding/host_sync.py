# SPDX-License-Identifier: Apache-2.0
"""Reading device tensors on the host with one synchronisation per read point.

A decoding round has to look at a few device values on the host (the plan's verify lengths, which shape the
target's packed batch; the accepted counts and tokens, which finished-request bookkeeping needs; NaN flags).
Reading them one by one (``.tolist()``, ``bool(...)``) would stall the GPU once per value. :class:`HostReader`
queues every copy asynchronously and waits once, and counts the waits so that tests can hold the decoder to
its budget (docs/decoder.md, "Host synchronisation").
"""

from __future__ import annotations

import torch
from torch import Tensor


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
