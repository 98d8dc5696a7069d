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
    """The names of the CUDA kernels ``call`` launched, space-separated (from the profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())
