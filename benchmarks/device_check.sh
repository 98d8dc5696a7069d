#!/usr/bin/env bash
# The GPU check, run on a lent GPU machine from the repository root, as one command:
#   1. build dspark there with CUDA kernels (the machine's own torch, nvcc, cmake, ninja);
#   2. pytest -m cuda (every op's CUDA result against its CPU result with the same inputs and seeds, opcheck,
#      CUDA-graph replay);
#   3. every microbenchmark with --device cuda;
# writing env.txt, build.log, pytest_cuda.log, bench.md, bench.json and summary.txt under $OUT.
#
# The nvidia-cutlass wheel (headers for the CUDA build) is not on such machines; put it in .whl/ first:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps -d .whl nvidia-cutlass==4.2.0.0
# and carry .whl with the command. Target: under 8 minutes on an H200.
set -uo pipefail
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
START=$(date +%s)
say() { echo "[device_check $(( $(date +%s) - START ))s] $*" | tee -a "$OUT/summary.txt"; }

{ nvidia-smi; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } \
  >"$OUT/env.txt" 2>&1
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/dspark-deps .whl/*.whl >>"$OUT/env.txt" 2>&1
  export PYTHONPATH="/tmp/dspark-deps${PYTHONPATH:+:$PYTHONPATH}"
fi

say "building (DSPARK_ENABLE_CUDA=ON, archs ${DSPARK_CUDA_ARCHS:=90a})"
export DSPARK_CUDA_ARCHS CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
if ! DSPARK_ENABLE_CUDA=ON "$PY" -m pip install --no-build-isolation --no-deps --target /tmp/dspark-site \
  -Cbuild-dir=/tmp/dspark-build . >"$OUT/build.log" 2>&1; then
  say "BUILD FAILED"; tail -60 "$OUT/build.log"; exit 1
fi
export PYTHONPATH="/tmp/dspark-site:$PYTHONPATH"
"$PY" -c "import dspark; print(dspark.build_info())" | tee -a "$OUT/summary.txt"

say "pytest -m cuda"
"$PY" -m pytest tests -m cuda -q -p no:cacheprovider >"$OUT/pytest_cuda.log" 2>&1
rc_test=$?
tail -3 "$OUT/pytest_cuda.log" | tee -a "$OUT/summary.txt"

say "microbenchmarks"
mkdir -p /tmp/dspark-bench
: >"$OUT/bench.md"
for b in benchmarks/bench_*.py; do
  name=$(basename "$b" .py)
  "$PY" "$b" --device cuda --json "/tmp/dspark-bench/$name.json" >>"$OUT/bench.md" 2>&1 || say "$name FAILED"
  echo >>"$OUT/bench.md"
done
"$PY" - "$OUT/bench.json" <<'PY'
import glob, json, sys
out = {p.split("/")[-1][:-5]: json.load(open(p)) for p in sorted(glob.glob("/tmp/dspark-bench/*.json"))}
json.dump(out, open(sys.argv[1], "w"), indent=1)
PY
say "done (pytest exit $rc_test)"
exit $rc_test
