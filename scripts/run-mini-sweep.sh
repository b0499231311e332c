#!/usr/bin/env bash
# Runs a mini sweep through the local executor, seed-major (every arm's first seed, then every
# arm's second, ...: `dapo sweep submit` orders local jobs so), max_concurrent at a time, so a
# partial sweep still covers every arm. Finished runs are reused, so rerunning resumes (stop it
# any time). Then regenerates results/<sweep name>/ from MLflow.
#   bash scripts/run-mini-sweep.sh [SPEC=sweeps/table1-mini.yaml] [OUTPUT=runs/<sweep name>]
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${1:-sweeps/table1-mini.yaml}
NAME=$(.venv/bin/python -c "import sys; from dapo.sweep.spec import load_spec; print(load_spec(sys.argv[1]).name)" "$SPEC")
OUT=${2:-runs/$NAME}
.venv/bin/dapo sweep submit "$SPEC" --cluster local --output "$OUT"
.venv/bin/dapo sweep status "$SPEC" --output "$OUT" || true
.venv/bin/dapo figures "$SPEC" --runs "$OUT" --to "results/$NAME"
