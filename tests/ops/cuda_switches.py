# SPDX-License-Identifier: Apache-2.0
"""Helpers of the CUDA op tests: the launchers' per-call switches and which kernels a call ran."""

from __future__ import annotations

from collections.abc import Callable

import torch


def set_switch(monkeypatch, name: str, on: bool) -> None:
    """Leave the environment switch ``name`` at its default (on) or set it to "0" (off)."""
    if on:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, "0")


def kernel_names(call: Callable[[], object]) -> str:
    """The names of the CUDA kernels ``call`` launched, space-separated (from the profiler).

    ``call`` runs once before profiling (lazy module loading, cuBLAS handles and the like stay out of the
    profiled run), and the profiler records CPU activity too: with CUDA activity alone Kineto has been seen to
    return no kernel events at all, which would fail the "kernel X ran" assertions spuriously."""
    call()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        call()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())
