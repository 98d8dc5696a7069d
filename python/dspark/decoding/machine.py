# SPDX-License-Identifier: Apache-2.0
"""Which machine a cost table was profiled on, against the one decoding: a planner priced elsewhere may plan
verifies that do not pay here (docs/profiling.md)."""

from __future__ import annotations

import platform
import re
import warnings

import torch


def _cpuinfo(fields: tuple[str, ...]) -> dict[str, str]:
    """The first value of each of ``fields`` in ``/proc/cpuinfo`` (empty off Linux)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in fields and key not in found:
                    found[key] = value.strip()
                if len(found) == len(fields):
                    break
    except OSError:
        pass
    return found


def machine_name(device: torch.device) -> str:
    """The GPU's name on CUDA; on CPU the model name with its family and the vector ISA torch uses, e.g.
    ``"AMD EPYC (family 25, AVX2)"``: virtual machines often report a bare model name that one generation
    shares with the next, and the ISA sets what a CPU linear costs."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    info = _cpuinfo(("model name", "cpu family"))
    model = info.get("model name") or platform.processor() or platform.machine()
    details = [f"family {info['cpu family']}"] if "cpu family" in info else []
    details.append(torch.backends.cpu.get_cpu_capability())
    return f"{model} ({', '.join(details)})"


# the details machine_name appends to a CPU's model name (which may hold parentheses itself: "Intel(R) Xeon(R)")
_DETAILS = re.compile(r" \([^()]*\)$")


def same_machine(profiled: str, here: str) -> bool:
    """Whether a table's ``device_name`` names this machine; a name written before the family and ISA were
    recorded (no trailing details) is compared with the model name alone."""
    return profiled == here or (not _DETAILS.search(profiled) and profiled == _DETAILS.sub("", here))


def profiled_elsewhere(metadata: dict, device: torch.device) -> str | None:
    """How the machine in a cost table's ``metadata`` differs from this one on ``device`` (its name, or on
    CPU its thread count), or None when it matches or the table does not say."""
    name, threads = metadata.get("device_name"), metadata.get("threads")
    differences = []
    here = machine_name(device) if name else None
    if name and not same_machine(name, here):
        differences.append(f"on {name!r} (here: {here!r})")
    if device.type == "cpu" and isinstance(threads, int) and threads != torch.get_num_threads():
        differences.append(f"with {threads} threads (here: {torch.get_num_threads()})")
    return " and ".join(differences) or None


def warn_if_profiled_elsewhere(metadata: dict, device: torch.device) -> str | None:
    """A ``UserWarning`` naming the difference when :func:`profiled_elsewhere` finds one; returns it."""
    difference = profiled_elsewhere(metadata, device)
    if difference is not None:
        warnings.warn(
            f"sps_table: the cost table was profiled {difference}; the planner prices verify and drafter "
            "times from it, so its verify lengths may not pay on this machine. Profile this one with `dspark "
            "profile --target ... --drafter ... --out DIR` and pass sps_table=DIR/costs.json, or pass "
            "sps_table=dspark.profiling.local_cost_table(target, drafter) (profiled once, cached).",
            UserWarning,
            stacklevel=3,
        )
    return difference
