#!/usr/bin/env bash
# The README's test command: set up the environment (first run only) and run the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k plan_verify`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/bootstrap.sh")"
cd "$ROOT"
exec "$PY" -m pytest tests "$@"
