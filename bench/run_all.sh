#!/usr/bin/env bash
# `make bench`: every benchmark table. Run on a quiet machine; results go to results/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results/bench
PY=.venv/bin/python
{ echo "# make bench, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)"; echo
  $PY -m bench.bench_rollout || true; echo
  $PY -m bench.bench_analysis || true; echo
  $PY -m bench.step_breakdown || true; echo
  $PY -m bench.scaling_sketch || true; } 2>&1 | tee results/bench/latest.md
