# SPDX-License-Identifier: Apache-2.0
"""Which machine a cost table was profiled on, against the one decoding: a planner priced elsewhere may plan
verifies that do not pay here (docs/profiling.md)."""

from __future__ import annotations

import platform
import warnings

import torch


def machine_name(device: torch.device) -> str:
    """The GPU's name on CUDA; else the CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform``)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profiled_elsewhere(metadata: dict, device: torch.device) -> str | None:
    """How the machine in a cost table's ``metadata`` differs from this one on ``device`` (its name, or on
    CPU its thread count), or None when it matches or the table does not say."""
    name, threads = metadata.get("device_name"), metadata.get("threads")
    differences = []
    here = machine_name(device) if name else None
    if name and name != here:
        differences.append(f"on {name!r} (here: {here!r})")
    if device.type == "cpu" and isinstance(threads, int) and threads != torch.get_num_threads():
        differences.append(f"with {threads} threads (here: {torch.get_num_threads()})")
    return " and ".join(differences) or None


def warn_if_profiled_elsewhere(metadata: dict, device: torch.device) -> None:
    """A ``UserWarning`` naming the difference when :func:`profiled_elsewhere` finds one."""
    difference = profiled_elsewhere(metadata, device)
    if difference is not None:
        warnings.warn(
            f"sps_table: the cost table was profiled {difference}; the planner prices verify and drafter "
            "times from it, so its verify lengths may not pay on this machine. Profile this one with `dspark "
            "profile --target ... --drafter ... --out DIR` and pass sps_table=DIR/costs.json.",
            UserWarning,
            stacklevel=3,
        )
