#!/usr/bin/env bash
# The GPU check, run on a machine with a CUDA GPU from the repository root, as one command:
#   1. build dspark there with CUDA kernels (the machine's own torch, nvcc, cmake, ninja) and check that the
#      build has them (a build without them would only skip the CUDA tests);
#   2. pytest -m cuda (every op's CUDA result against its CPU result with the same inputs and seeds, opcheck,
#      CUDA-graph replay, the decoder's greedy output and host-sync count on CUDA), one line per test, so a
#      kernel that hangs until the timeout is named by the log's last line;
#   3. the end-to-end round benchmark (bench_e2e_gpu.py: random SmolLM2-135M- and Qwen3-8B-shaped targets,
#      per-stage CUDA-event times, HF generate baselines, eager vs CUDA-graph rounds, greedy canary), the full run when enough of the budget
#      is left, else its --quick run;
#      then bench_round_profile.py (the device's busy share of a graphed round and its top kernels) and
#      bench_compile_target.py --graphs (decoder.compile(target=True) against eager, both in CUDA graphs);
#   4. the per-op microbenchmarks with --device cuda, while the time budget lasts;
#   5. compute-sanitizer memcheck over the CUDA op tests, if time is left.
# writing eight files under $OUT, the most a device run returns: summary.txt, build.log (the machine, then the
# build), pytest_cuda.log, e2e_gpu.md, e2e_gpu_json.tar.gz (e2e_gpu.json and the measured cost tables),
# bench.md, bench.json and memcheck.log (each is written as its step runs, so a run stopped at its limit still
# returns what it did). A ninth file would not come back: keep new output inside these.
#
# The nvidia-cutlass wheel (headers for the CUDA build) is not on such machines; put it in .whl/ first:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps -d .whl nvidia-cutlass==4.2.0.0
# and carry .whl with the command.
#
# Within one session's device time (15 minutes, the machine's start of 1-2 minutes included) everything but the
# memcheck fits in two calls on one warm machine (it stays warm 30 s after a call: send the second at once).
# Measured on an H100: the build 90 s, pytest -m cuda about 3.5 min over 6 workers, bench_e2e_gpu 124 s.
#   1. DEVICE_CHECK_BUDGET=480 DEVICE_CHECK_E2E=off bash benchmarks/device_check.sh   (timeout_s 520)
#   2. DEVICE_CHECK_BUDGET=250 DEVICE_CHECK_REUSE_BUILD=1 DEVICE_CHECK_TESTS=off DEVICE_CHECK_BENCHES=none \
#      DEVICE_CHECK_E2E=full bash benchmarks/device_check.sh                          (timeout_s 280)
# (the second runs bench_e2e_gpu, bench_round_profile, and bench_compile_target if a minute is left).
#
# Environment: DEVICE_CHECK_BUDGET (seconds for the whole script, default 420), DEVICE_CHECK_TESTS (on / off),
# DEVICE_CHECK_WORKERS (pytest-xdist processes, default 8), DEVICE_CHECK_TEST_TIMEOUT (seconds per test, default
# 240: a capture-heavy graph test over 8 workers on one GPU may take minutes), DEVICE_CHECK_E2E (auto: the
# full bench_e2e_gpu run when at least DEVICE_CHECK_E2E_FULL_S seconds (default 200; the full run took 124 s on an
# H100) would be left for it, else --quick; full, quick, or off),
# DEVICE_CHECK_E2E_ARGS (more bench_e2e_gpu arguments, e.g. --no-graphs: the full run measures eager and CUDA-graph
# rounds, two more engine runs per batch size), DEVICE_CHECK_BENCHES (the ops to benchmark, default all eight;
# none for no op benchmark),
# DEVICE_CHECK_PROFILE, DEVICE_CHECK_COMPILE (on / off: bench_round_profile, bench_compile_target after
# bench_e2e_gpu),
# DEVICE_CHECK_MEMCHECK_K (pytest -k expression for the memcheck run, default "not graph"),
# DEVICE_CHECK_REUSE_BUILD=1 (skip the build when /tmp/dspark-site holds one: a second call on the same warm
# machine, e.g. DEVICE_CHECK_TESTS=off DEVICE_CHECK_E2E=off for the op benchmarks alone), DSPARK_CUDA_ARCHS
# (default 90a), DSPARK_ENABLE_CUDA (default ON; OFF with BENCH_DEVICE=cpu rehearses the script on a machine
# without a GPU; bench_e2e_gpu then runs --quick on the CPU).
set -uo pipefail
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
BUDGET="${DEVICE_CHECK_BUDGET:-420}"
BENCH_DEVICE="${BENCH_DEVICE:-cuda}"
START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "[device_check $(($(date +%s) - START))s] $*" | tee -a "$OUT/summary.txt"; }

{
  nvidia-smi
  nvcc --version | tail -2
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
} >"$OUT/build.log" 2>&1
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/dspark-deps .whl/*.whl >>"$OUT/build.log" 2>&1
  export PYTHONPATH="/tmp/dspark-deps${PYTHONPATH:+:$PYTHONPATH}"
fi

say "building (DSPARK_ENABLE_CUDA=${DSPARK_ENABLE_CUDA:=ON}, archs ${DSPARK_CUDA_ARCHS:=90a})"
export DSPARK_ENABLE_CUDA DSPARK_CUDA_ARCHS CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
if [ "${DEVICE_CHECK_REUSE_BUILD:-0}" = 1 ] && [ -d /tmp/dspark-site/dspark ]; then
  say "reusing the build in /tmp/dspark-site (DEVICE_CHECK_REUSE_BUILD=1: a second call on a warm machine)"
elif ! { rm -rf /tmp/dspark-site && "$PY" -m pip install -v --no-build-isolation --no-deps \
  --target /tmp/dspark-site -Cbuild-dir=/tmp/dspark-build . >>"$OUT/build.log" 2>&1; }; then
  say "BUILD FAILED"
  tail -60 "$OUT/build.log"
  exit 1
fi
export PYTHONPATH="/tmp/dspark-site${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" - "$DSPARK_ENABLE_CUDA" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"; then
import sys

import dspark

info = dspark.build_info()
print("build_info:", info, "| loaded from", dspark.__file__)
assert info["cuda"] or sys.argv[1] == "OFF", "dspark was built without its CUDA kernels"
EOF
  say "the build has no CUDA kernels: stopping (build.log says why)"
  exit 1
fi

rc_test=0
if [ "${DEVICE_CHECK_TESTS:-on}" = off ]; then
  say "pytest -m cuda skipped (DEVICE_CHECK_TESTS=off)"
else
say "pytest -m cuda ($(left)s left)"
# spread over worker processes where pytest-xdist is installed (the tests are mostly host-bound launches), and
# stop any one test after DEVICE_CHECK_TEST_TIMEOUT seconds where pytest-timeout is (a hanging kernel then fails
# its own test instead of the whole step)
par=()
"$PY" -c "import xdist" 2>/dev/null && par+=(-n "${DEVICE_CHECK_WORKERS:-8}")
"$PY" -c "import pytest_timeout" 2>/dev/null &&
  par+=(--timeout "${DEVICE_CHECK_TEST_TIMEOUT:-240}" --timeout-method thread)
t=$(($(left) - 60)); [ "$t" -lt 30 ] && t=30
timeout "$t" "$PY" -m pytest tests -m cuda -v -p no:cacheprovider -rfE --tb=short --durations=10 "${par[@]}" \
  >"$OUT/pytest_cuda.log" 2>&1
rc_test=$?
tail -4 "$OUT/pytest_cuda.log" | tee -a "$OUT/summary.txt"
# the short summary's "FAILED test - why" lines, or, if the step was stopped first, the workers' "[gwN] FAILED" ones
grep -E "(^|\] )(FAILED|ERROR) |node down|Timeout" "$OUT/pytest_cuda.log" | cut -c1-300 | head -80 >>"$OUT/summary.txt"
fi

# after_e2e NAME CAP SWITCH PATTERN ARGS...: benchmarks/NAME.py ARGS, appended to e2e_gpu.md (its lines matching
# PATTERN to the summary), on CUDA, when SWITCH is on and a minute is left; at most CAP seconds
after_e2e() {
  local name=$1 cap=$2 switch=$3 pattern=$4 t=$(($(left) - 20))
  shift 4
  { [ "$BENCH_DEVICE" = cuda ] && [ "$switch" = on ] && [ "$t" -ge 60 ]; } || return 0
  [ "$t" -gt "$cap" ] && t=$cap
  say "$name (${t}s)"
  { echo; echo "# $name"; } >>"$OUT/e2e_gpu.md"
  timeout "$t" "$PY" "benchmarks/$name.py" "$@" >>"$OUT/e2e_gpu.md" 2>&1 || say "$name FAILED or timed out"
  grep -E "$pattern" "$OUT/e2e_gpu.md" | tee -a "$OUT/summary.txt"
}

# the end-to-end round: full (124 s on an H100, capped at 400 s so the op benchmarks keep some
# time) when enough is left, else the quick run (a scaled-down model, seconds); a CPU rehearsal runs quick
E2E="${DEVICE_CHECK_E2E:-auto}"
t=$(($(left) - 20))
e2e=()
rm -rf /tmp/dspark-e2e && mkdir -p /tmp/dspark-e2e
if [ "$E2E" = off ]; then
  say "bench_e2e_gpu skipped (DEVICE_CHECK_E2E=off)"
elif [ "$t" -lt 45 ]; then
  say "no time left for bench_e2e_gpu"
else
  if [ "$E2E" = quick ] || [ "$BENCH_DEVICE" != cuda ] ||
    { [ "$E2E" = auto ] && [ "$t" -lt "${DEVICE_CHECK_E2E_FULL_S:-200}" ]; }; then
    e2e=(--quick)
  fi
  [ "$t" -gt 400 ] && t=400
  say "bench_e2e_gpu ${e2e[*]:-full} (${t}s of $(left)s left)"
  # shellcheck disable=SC2086 (DEVICE_CHECK_E2E_ARGS: extra words, e.g. "--no-graphs" or "--models A")
  timeout "$t" "$PY" benchmarks/bench_e2e_gpu.py --device "$BENCH_DEVICE" "${e2e[@]}" ${DEVICE_CHECK_E2E_ARGS:-} \
    --json /tmp/dspark-e2e/e2e_gpu.json --sps /tmp/dspark-e2e/e2e_gpu_costs.json >"$OUT/e2e_gpu.md" 2>&1
  rc_e2e=$?
  tar -czf "$OUT/e2e_gpu_json.tar.gz" -C /tmp/dspark-e2e . 2>/dev/null
  [ "$rc_e2e" -ne 0 ] &&
    say "bench_e2e_gpu FAILED or timed out (exit $rc_e2e: 1 a failed greedy canary or an error, 124 out of time)"
  grep -E "^(## |total wall time|!!!|greedy canary)" "$OUT/e2e_gpu.md" | tee -a "$OUT/summary.txt"
  # where a graphed round's device time goes (busy share, top kernels); the target's norms and MLPs compiled
  # against eager, both in CUDA graphs (decoder.compile(target=True))
  after_e2e bench_round_profile 120 "${DEVICE_CHECK_PROFILE:-on}" "^R = " --device cuda
  after_e2e bench_compile_target 150 "${DEVICE_CHECK_COMPILE:-on}" "^\| [AB] \|" \
    --device cuda --graphs --batch 1 32 --repeats 2
fi

say "microbenchmarks ($(left)s left)"
mkdir -p /tmp/dspark-bench
: >"$OUT/bench.md"
BENCHES="${DEVICE_CHECK_BENCHES:-paged_verify_attention markov_sample markov_sample_from_hidden rejection_sample confidence plan_verify philox_draw few_row_linear}"
[ "$BENCHES" = none ] && BENCHES=""
n_left=$(echo "$BENCHES" | wc -w)
for name in $BENCHES; do
  # an equal share of what is left for each benchmark still to run, so that the last ones run too
  t=$((($(left) - 20) / n_left))
  n_left=$((n_left - 1))
  [ "$t" -lt 15 ] && { say "no time left for bench_$name"; continue; }
  quick=()
  [ "$t" -lt 60 ] && quick=(--quick)
  timeout "$t" "$PY" "benchmarks/bench_$name.py" --device "$BENCH_DEVICE" "${quick[@]}" \
    --json "/tmp/dspark-bench/$name.json" >>"$OUT/bench.md" 2>&1 || say "bench_$name FAILED or timed out"
  echo >>"$OUT/bench.md"
done
"$PY" - "$OUT/bench.json" <<'PY'
import glob, json, sys
out = {p.split("/")[-1][:-5]: json.load(open(p)) for p in sorted(glob.glob("/tmp/dspark-bench/*.json"))}
json.dump(out, open(sys.argv[1], "w"), indent=1)
PY

t=$(($(left) - 10))
if command -v compute-sanitizer >/dev/null && [ "$t" -gt 40 ]; then
  say "compute-sanitizer memcheck over the CUDA op tests (${t}s)"
  # no -x: a test failing for another reason (the profiler under the sanitizer) must not end the memory check
  timeout "$t" compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$PY" -m pytest tests/ops -m cuda -q -p no:cacheprovider -k "${DEVICE_CHECK_MEMCHECK_K:-not graph}" >"$OUT/memcheck.log" 2>&1
  say "memcheck exit $? (124: out of time)"
  tail -5 "$OUT/memcheck.log" >>"$OUT/summary.txt"
fi
say "done (pytest exit $rc_test, bench_e2e_gpu exit ${rc_e2e:-not run})"
exit $rc_test
