#!/usr/bin/env bash
# Runs sweeps/table1-mini.yaml seed-major (all arms for seed 0, then 1, then 2) through the
# local executor, so a partial sweep still covers every arm. Finished runs are reused, so
# rerunning resumes. Then regenerates results/table1-mini/ from MLflow.
#   bash scripts/run-mini-sweep.sh [OUTPUT=runs/table1-mini]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/table1-mini}
SPEC=sweeps/table1-mini.yaml
TMP=$(mktemp -d)
for seeds in "[0]" "[0, 1]" "[0, 1, 2]"; do
  sed "s/^seeds: .*/seeds: $seeds/" "$SPEC" > "$TMP/table1-mini.yaml"
  .venv/bin/dapo sweep submit "$TMP/table1-mini.yaml" --cluster local --output "$OUT"
done
rm -rf "$TMP"
.venv/bin/dapo sweep status "$SPEC" --output "$OUT" || true
.venv/bin/dapo figures "$SPEC" --runs "$OUT" --to results/table1-mini
