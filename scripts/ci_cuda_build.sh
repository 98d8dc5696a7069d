#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Proves that every CUDA source compiles, on a machine without a GPU.
#
#   bash scripts/ci_cuda_build.sh
#
# 1. Creates (once) a second virtual environment .venv-cuda with the CUDA 13.0 build of torch and the build
#    tools (torch==2.14.1, nvidia-cutlass, scikit-build-core, ninja, cmake, numpy, and cuobjdump / nvdisasm
#    from nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm).
# 2. Builds the extension with DSPARK_ENABLE_CUDA=ON for DSPARK_CUDA_ARCHS (default "80;90a") into build-cuda/
#    (kept between runs, so a rebuild only recompiles what changed) and installs the wheel into .venv-cuda.
# 3. Imports it there (a CUDA build imports without a GPU; its CPU kernels run) and checks dspark.build_info():
#    cuda is True and every requested architecture was compiled.
# 4. Compiles and runs the host checks of tests/cuda_host/*.cu: the kernels' planning functions (__host__
#    __device__) tested on the CPU.
# 5. Gates the compiled kernels (tools/cuda_kernel_gates.py): no stack frame or local memory (register spills)
#    beyond the listed exceptions, and tensor-core instructions in every kernel that claims them.
# Any compile error, failed install or failed check exits non-zero.
#
# Environment: PYTHON (interpreter for the venv, default python3), DSPARK_CUDA_ARCHS, CMAKE_BUILD_PARALLEL_LEVEL.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv-cuda"
PY="$VENV/bin/python"
TORCH_VERSION="2.14.1"
ARCHS="${DSPARK_CUDA_ARCHS:-80;90a}"
START=$(date +%s)

log() { printf '[ci_cuda_build %4ds] %s\n' "$(($(date +%s) - START))" "$*"; }

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "ci_cuda_build: nvcc not found (needs a CUDA toolkit; no GPU needed)" >&2
  exit 1
fi

# --- 1. the CUDA venv (idempotent) ------------------------------------------------------------------------
venv_ready() {
  [ -x "$PY" ] && "$PY" - "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import sys
import os, nvidia, torch, cutlass_library, scikit_build_core, ninja, cmake, numpy  # noqa: F401
bins = os.path.join(list(nvidia.__path__)[0], "cu13", "bin")
assert all(os.path.exists(os.path.join(bins, t)) for t in ("cuobjdump", "nvdisasm")), "no cuobjdump / nvdisasm"
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
assert torch.version.cuda is not None, "torch is a CPU build"
EOF
}
if venv_ready; then
  log "reusing $VENV"
else
  log "creating $VENV (torch==$TORCH_VERSION, CUDA build)"
  [ -x "$PY" ] || "${PYTHON:-python3}" -m venv "$VENV"
  "$PY" -m pip install --quiet "torch==$TORCH_VERSION" nvidia-cutlass scikit-build-core ninja 'cmake>=3.26' numpy \
    'nvidia-cuda-cuobjdump>=13,<14' 'nvidia-cuda-nvdisasm>=13,<14'
  venv_ready || { echo "ci_cuda_build: $VENV is not usable after installing" >&2; exit 1; }
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# --- 2. build the wheel with the CUDA kernels -------------------------------------------------------------
log "building dspark with DSPARK_ENABLE_CUDA=ON, archs $ARCHS"
rm -rf build-cuda/wheel
export PATH="$VENV/bin:$PATH"  # this venv's cmake and ninja
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
mkdir -p build-cuda
LOG="build-cuda/build.log"
# The full log goes to $LOG; the terminal gets the compile/link steps and diagnostics.
set +e
DSPARK_ENABLE_CUDA=ON DSPARK_CUDA_ARCHS="$ARCHS" "$PY" -m pip wheel --no-build-isolation --no-deps \
  -w build-cuda/wheel \
  -Cbuild-dir="build-cuda/{wheel_tag}" \
  -v \
  . >"$LOG" 2>&1
rc=$?
set -e
grep -E '^ *\[[0-9]+/[0-9]+\] |warning|error|dspark:' "$LOG" | sed -E 's/^ +//' | cut -c1-240 || true
if [ "$rc" -ne 0 ]; then
  echo "ci_cuda_build: the CUDA build FAILED (exit $rc; full log: $LOG); last lines:" >&2
  tail -n 80 "$LOG" >&2
  exit 1
fi
WHEEL=$(ls build-cuda/wheel/dspark-*.whl)
log "built $WHEEL"
"$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEEL"

# --- 3. import it without a GPU and check what was compiled -----------------------------------------------
log "importing the CUDA build"
cd /  # import the installed wheel, not the source tree
"$PY" - "$ARCHS" <<'EOF'
import sys

import torch
import dspark

info = dspark.build_info()
print("dspark.build_info():", info)
assert info["cuda"] is True, f"the extension was built without CUDA kernels: {info}"
want = ["sm_" + a for a in sys.argv[1].split(";") if a]
missing = [a for a in want if a not in info["cuda_archs"]]
assert not missing, f"architectures {missing} missing from {info['cuda_archs']}"
for op in ("philox_draw", "confidence", "plan_verify"):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"dspark::{op}", "CUDA"), f"no CUDA kernel for {op}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"dspark::{op}", "CPU"), f"no CPU kernel for {op}"
# Its CPU kernels run without a GPU.
i = torch.arange(4)
u, g = dspark.ops.philox_draw(0, 0, i * 0, i * 0, 0, i)
assert bool(((u > 0) & (u < 1)).all())
print("cuda available:", torch.cuda.is_available(), "| CUDA kernels registered for philox_draw, confidence, plan_verify")
EOF

# --- 4. host checks of the kernels' planning functions ---------------------------------------------------
cd "$ROOT"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
CUTLASS_INC="$("$PY" -c 'import os, cutlass_library; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include"))')"
mkdir -p build-cuda/host-checks
for src in tests/cuda_host/*.cu; do
  bin="build-cuda/host-checks/$(basename "$src" .cu)"
  "$NVCC" -std=c++17 -O1 -I include -isystem "$CUTLASS_INC" -o "$bin" "$src"
  "$bin"
done

# --- 5. gates on the compiled kernels ---------------------------------------------------------------------
NV_BIN="$("$PY" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "bin"))')"
LIB="$("$PY" -c 'import dspark, pathlib; print(next(pathlib.Path(dspark.__file__).parent.glob("_C*.so")))')"
PATH="$NV_BIN:$PATH" "$PY" tools/cuda_kernel_gates.py "$LIB"
log "OK: every .cu compiled for $ARCHS, the build imports, the host checks and the kernel gates pass"
