# SPDX-License-Identifier: Apache-2.0
"""Gates on the compiled CUDA kernels, run by ``scripts/ci_cuda_build.sh`` (no GPU needed).

1. **No stack frame and no local memory** in any ``dspark::kernels`` function, for every compiled architecture
   (``cuobjdump --dump-resource-usage``: ``STACK`` and ``LOCAL`` bytes; register spills land there). A kernel
   with a known frame may be listed in :data:`STACK_ALLOWED` with its size (none is): the gate then fails if
   the frame grows or appears anywhere else.
2. **Tensor-core instructions** (``HMMA`` / ``HGMMA`` in ``cuobjdump -sass``) in every kernel listed in
   :data:`TENSOR_CORE_KERNELS`, the ops that claim tensor cores, and **asynchronous copies** (``LDGSTS`` /
   ``UTMALDG``) in every kernel listed in :data:`ASYNC_COPY_KERNELS`.

    python tools/cuda_kernel_gates.py path/to/_C.cpython-311-x86_64-linux-gnu.so [--cuobjdump PATH]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

KERNEL_PREFIX = "_ZN6dspark7kernels"  # mangled dspark::kernels::

# kernel name (unmangled identifier) -> the stack frame it is allowed, in bytes (none: the one-block
# rejection_sample kernel's 48 bytes went with its per-row function and Philox's select)
STACK_ALLOWED: dict[str, int] = {}

# kernels that claim tensor cores
TENSOR_CORE_KERNELS: tuple[str, ...] = (
    "PvaMmaKernel",  # paged_verify_attention, bf16 / fp16
    "MarkovMmaStepKernel",  # markov_sample, bf16 / fp16 tables
    "MarkovHiddenMmaKernel",  # markov_sample_from_hidden: the LM head GEMM with the first step's draw
)

TENSOR_CORE_OPCODES = re.compile(r"\b(HMMA|HGMMA|IMMA|QGMMA)\b")

# kernels that claim asynchronous global -> shared copies (cp.async or TMA)
ASYNC_COPY_KERNELS: tuple[str, ...] = ("PvaMmaKernel",)  # double-buffered K / V tiles

ASYNC_COPY_OPCODES = re.compile(r"\b(LDGSTS|UTMALDG)\b")


@dataclass(frozen=True)
class Usage:
    """One compiled function's resources for one architecture."""

    mangled: str
    arch: str
    registers: int
    stack: int
    local: int

    @property
    def kernel(self) -> str:
        """The unmangled identifier after ``dspark::kernels::`` (``PvaSplitKernel``)."""
        rest = self.mangled[len(KERNEL_PREFIX) :]
        m = re.match(r"(\d+)", rest)
        return rest[len(m.group(1)) : len(m.group(1)) + int(m.group(1))] if m else rest


def parse_resource_usage(text: str) -> list[Usage]:
    """The dspark kernels of ``cuobjdump --dump-resource-usage`` output."""
    out, arch, name = [], "?", None
    for line in text.splitlines():
        a = re.match(r"\s*arch = (sm_\w+)", line)
        if a:
            arch = a.group(1)
        f = re.match(r"\s*Function (\S+):\s*$", line)
        if f:
            name = f.group(1)
            continue
        r = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", line)
        if r and name is not None:
            if name.startswith(KERNEL_PREFIX):
                out.append(Usage(name, arch, int(r.group(1)), int(r.group(2)), int(r.group(3))))
            name = None
    return out


def stack_failures(usages: list[Usage], allowed: dict[str, int] = STACK_ALLOWED) -> list[str]:
    """A line per kernel and architecture with local memory or a stack frame beyond what it is allowed."""
    bad = []
    for u in usages:
        limit = allowed.get(u.kernel, 0)
        if u.local > 0 or u.stack > limit:
            bad.append(
                f"{u.kernel} ({u.arch}): STACK {u.stack} bytes (allowed {limit}), LOCAL {u.local} bytes"
            )
    return bad


def sass_functions(text: str) -> dict[str, str]:
    """Mangled function name -> its SASS, from ``cuobjdump -sass`` output (all architectures concatenated)."""
    funcs: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        f = re.match(r"\s*Function : (\S+)", line)
        if f:
            current = f.group(1)
            funcs.setdefault(current, [])
        elif current is not None:
            funcs[current].append(line)
    return {k: "\n".join(v) for k, v in funcs.items()}


def tensor_core_failures(
    sass: dict[str, str],
    claimed: tuple[str, ...] = TENSOR_CORE_KERNELS,
    opcodes: re.Pattern = TENSOR_CORE_OPCODES,
    what: str = "HMMA/HGMMA",
) -> list[str]:
    """A line per claimed kernel that is missing or lacks ``opcodes`` (default: a tensor-core instruction) in
    some compiled copy."""
    bad = []
    for kernel in claimed:
        copies = {n: s for n, s in sass.items() if Usage(n, "", 0, 0, 0).kernel == kernel}
        if not copies:
            bad.append(f"{kernel}: not found in the SASS")
        for name, code in copies.items():
            if not opcodes.search(code):
                bad.append(f"{kernel}: no {what} in {name}")
    return bad


def async_copy_failures(sass: dict[str, str], claimed: tuple[str, ...] = ASYNC_COPY_KERNELS) -> list[str]:
    """A line per kernel that claims asynchronous copies and is missing or has none in some compiled copy."""
    return tensor_core_failures(sass, claimed, ASYNC_COPY_OPCODES, "LDGSTS/UTMALDG")


def run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"cuda_kernel_gates: {' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    return res.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("library", type=Path, help="the built extension (_C*.so)")
    ap.add_argument("--cuobjdump", default=None, help="cuobjdump to use (default: on PATH)")
    args = ap.parse_args(argv)
    tool = args.cuobjdump or shutil.which("cuobjdump")
    if tool is None:
        sys.exit(
            "cuda_kernel_gates: cuobjdump not found (pip install nvidia-cuda-cuobjdump, or pass --cuobjdump)"
        )
    if not args.library.is_file():
        sys.exit(f"cuda_kernel_gates: library {args.library} not found")
    usages = parse_resource_usage(run([tool, "--dump-resource-usage", str(args.library)]))
    if not usages:
        sys.exit(f"cuda_kernel_gates: no dspark kernel in {args.library} (built without CUDA?)")
    failures = stack_failures(usages)
    if TENSOR_CORE_KERNELS or ASYNC_COPY_KERNELS:
        sass = sass_functions(run([tool, "-sass", str(args.library)]))
        failures += tensor_core_failures(sass) + async_copy_failures(sass)
    kernels = sorted({u.kernel for u in usages})
    archs = sorted({u.arch for u in usages})
    print(
        f"cuda_kernel_gates: {len(usages)} compiled kernels ({len(kernels)} names, {', '.join(archs)}); "
        f"most registers {max(u.registers for u in usages)}; tensor-core claims: "
        f"{', '.join(TENSOR_CORE_KERNELS) or 'none'}; asynchronous-copy claims: "
        f"{', '.join(ASYNC_COPY_KERNELS) or 'none'}"
    )
    for line in failures:
        print("FAIL", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
