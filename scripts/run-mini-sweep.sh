#!/usr/bin/env bash
# Runs a mini sweep seed-major (all arms for its first seed, then the second, ...) through
# the local executor, so a partial sweep still covers every arm. Finished runs are reused,
# so rerunning resumes (stop it any time). Then regenerates results/<sweep name>/ from MLflow.
#   bash scripts/run-mini-sweep.sh [SPEC=sweeps/table1-mini.yaml] [OUTPUT=runs/<sweep name>]
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${1:-sweeps/table1-mini.yaml}
NAME=$(.venv/bin/python -c "import sys; from dapo.sweep_spec import load_spec; print(load_spec(sys.argv[1]).name)" "$SPEC")
SEEDS=$(.venv/bin/python -c "import sys; from dapo.sweep_spec import load_spec; print(' '.join(map(str, load_spec(sys.argv[1]).seeds)))" "$SPEC")
OUT=${2:-runs/$NAME}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
done_seeds=""
for s in $SEEDS; do
  done_seeds="${done_seeds:+$done_seeds, }$s"
  sed "s/^seeds: .*/seeds: [$done_seeds]/" "$SPEC" > "$TMP/$(basename "$SPEC")"
  .venv/bin/dapo sweep submit "$TMP/$(basename "$SPEC")" --cluster local --output "$OUT"
done
.venv/bin/dapo sweep status "$SPEC" --output "$OUT" || true
.venv/bin/dapo figures "$SPEC" --runs "$OUT" --to "results/$NAME"
