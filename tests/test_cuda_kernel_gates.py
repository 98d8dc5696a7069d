# SPDX-License-Identifier: Apache-2.0
"""tools/cuda_kernel_gates.py: the parsers and rules of the CUDA build's stack-frame and tensor-core gates, on
text in cuobjdump's formats (the gates themselves run in scripts/ci_cuda_build.sh)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "cuda_kernel_gates", Path(__file__).resolve().parents[1] / "tools" / "cuda_kernel_gates.py"
)
gates = importlib.util.module_from_spec(_spec)
sys.modules["cuda_kernel_gates"] = gates  # dataclasses look their module up
_spec.loader.exec_module(gates)

SPLIT = "_ZN6dspark7kernels14PvaSplitKernelIfLi64EEEvPKT_S4_S4_PS2_PfS6_S6_PKiNS0_8PvaIndexEi"
REJECT = "_ZN6dspark7kernels21RejectionSampleKernelIfEEvPKT_NS0_15RejectionParamsE"


def usage_dump(split_stack=0, split_local=0, reject_stack=48):
    return f"""
Fatbin elf code:
================
arch = sm_90a
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function {SPLIT}:
  REG:79 STACK:{split_stack} SHARED:0 LOCAL:{split_local} CONSTANT[0]:620 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {REJECT}:
  REG:80 STACK:{reject_stack} SHARED:4112 LOCAL:0 CONSTANT[0]:696 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN2at6native13foreign_kernelEv:
  REG:8 STACK:64 SHARED:0 LOCAL:0 CONSTANT[0]:352 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_parses_the_dspark_kernels_with_their_architecture_and_name():
    usages = gates.parse_resource_usage(usage_dump())
    assert [(u.kernel, u.arch, u.registers, u.stack, u.local) for u in usages] == [
        ("PvaSplitKernel", "sm_90a", 79, 0, 0),
        ("RejectionSampleKernel", "sm_90a", 80, 48, 0),
    ]  # other libraries' kernels are not dspark's to gate


def test_stack_gate_passes_an_allowed_frame_and_fails_any_other():
    allowed = {"RejectionSampleKernel": 48}
    assert gates.stack_failures(gates.parse_resource_usage(usage_dump()), allowed) == []
    unlisted = gates.stack_failures(gates.parse_resource_usage(usage_dump()), {})
    assert len(unlisted) == 1 and "RejectionSampleKernel" in unlisted[0] and "allowed 0" in unlisted[0]
    grown = gates.stack_failures(gates.parse_resource_usage(usage_dump(reject_stack=64)), allowed)
    assert len(grown) == 1 and "RejectionSampleKernel" in grown[0] and "STACK 64" in grown[0]
    new_frame = gates.stack_failures(gates.parse_resource_usage(usage_dump(split_stack=16)), allowed)
    assert len(new_frame) == 1 and "PvaSplitKernel" in new_frame[0]
    spilled = gates.stack_failures(gates.parse_resource_usage(usage_dump(split_local=8)), allowed)
    assert len(spilled) == 1 and "LOCAL 8" in spilled[0]


def sass_dump(body):
    return f"""
	code for sm_90a
		Function : {SPLIT}
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   {body} ;
        /*0020*/                   EXIT ;
		Function : {REJECT}
        /*0000*/                   FFMA R0, R1, R2, R3 ;
"""


def test_tensor_core_gate_needs_an_mma_in_every_claimed_kernel():
    with_mma = gates.sass_functions(sass_dump("HMMA.16816.F32.BF16 R4, R8, R12, R4"))
    assert set(with_mma) == {SPLIT, REJECT}
    assert gates.tensor_core_failures(with_mma, ("PvaSplitKernel",)) == []
    without = gates.sass_functions(sass_dump("FFMA R4, R8, R12, R4"))
    assert gates.tensor_core_failures(without, ("PvaSplitKernel",)) == [
        f"PvaSplitKernel: no HMMA/HGMMA in {SPLIT}"
    ]
    assert gates.tensor_core_failures(with_mma, ("RejectionSampleKernel", "MissingKernel")) == [
        f"RejectionSampleKernel: no HMMA/HGMMA in {REJECT}",
        "MissingKernel: not found in the SASS",
    ]


def test_async_copy_gate_needs_an_ldgsts_in_every_claimed_kernel():
    with_copy = gates.sass_functions(sass_dump("LDGSTS.E.BYPASS.128 [R4], desc[UR4][R2.64]"))
    assert gates.async_copy_failures(with_copy, ("PvaSplitKernel",)) == []
    mma_only = gates.sass_functions(sass_dump("HMMA.16816.F32.BF16 R4, R8, R12, R4"))
    assert gates.async_copy_failures(mma_only, ("PvaSplitKernel",)) == [
        f"PvaSplitKernel: no LDGSTS/UTMALDG in {SPLIT}"
    ]
