#!/usr/bin/env bash
# `pip wheel --no-build-isolation .` (reusing the editable build directory, so only changed files recompile) makes a wheel that installs into a fresh venv holding the same torch, and
# a plain `pip install .` (build isolation) stops at once with a message that explains --no-build-isolation.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY=.venv/bin/python
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PY" -m pip wheel --no-build-isolation --no-deps -w "$WORK/wheels" . >"$WORK/wheel.log" 2>&1 \
  || { tail -40 "$WORK/wheel.log"; exit 1; }
ls "$WORK"/wheels/dspark-*.whl

python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "torch==$TORCH_VERSION" >"$WORK/torch.log" 2>&1 || { tail -20 "$WORK/torch.log"; exit 1; }
"$WORK/venv/bin/pip" install -q --no-deps "$WORK"/wheels/dspark-*.whl
(cd "$WORK" && "$WORK/venv/bin/pip" install -q numpy tqdm >/dev/null 2>&1 && "$WORK/venv/bin/python" - <<'PY'
import torch, dspark
print("wheel OK:", dspark.build_info())
s = torch.tensor([[0.9, 0.5, 0.1]])
print(dspark.ops.plan_verify(s, torch.tensor([1, 2, 4]), torch.tensor([100.0, 95.0, 60.0], dtype=torch.float64)))
from dspark.models.bundled import bundled_drafter
b = bundled_drafter()  # the shipped drafter and its STS / SPS files are package data
assert b.sts is not None and b.sps is not None, b
print("bundled drafter in the wheel:", b.path.name, sorted(p.name for p in b.path.iterdir()))
PY
)

echo "plain 'pip install .' (with build isolation) must stop with a clear message:"
if "$WORK/venv/bin/pip" install --no-deps "$ROOT" >"$WORK/iso.log" 2>&1; then
  echo "unexpected: an isolated build succeeded"; exit 1
fi
grep -q -- "--no-build-isolation" "$WORK/iso.log" || { tail -40 "$WORK/iso.log"; echo "no explanation printed"; exit 1; }
grep -m1 -- "--no-build-isolation" "$WORK/iso.log"
