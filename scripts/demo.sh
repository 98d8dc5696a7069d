#!/usr/bin/env bash
# The README's demo command: set up the environment (first run only) and run `dspark demo`.
set -euo pipefail
PY="$(bash "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh")"
exec "$PY" -m dspark.cli demo "$@"
