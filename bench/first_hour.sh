#!/usr/bin/env bash
# A newcomer's first hour, timed: a fresh clone of this repository, an empty model cache and no pip
# cache, then every command of the README's "Two commands" (make demo) and "Using it" blocks, in order,
# each timed. Prints a Markdown table (command, exit status, wall seconds) and keeps each command's
# output under WORK/logs/. About 17 minutes on an idle 2-core CPU; run it on a quiet machine.
#
#   bash bench/first_hour.sh [WORK]        WORK: a scratch directory (default /tmp/dapo-first-hour; wiped)
#
# Left out: the 60-run `sweep submit sweeps/table1-mini.yaml --cluster local` (about 95 minutes here;
# its --dry-run is timed) and `make test` (CI times it on every push).
set -uo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/dapo-first-hour}"
rm -rf "$WORK" && mkdir -p "$WORK/logs" "$WORK/cache"
export DAPO_LAB_CACHE="$WORK/cache" PIP_NO_CACHE_DIR=1
git clone -q "$SRC" "$WORK/repo" && cd "$WORK/repo" || exit 1
ROWS=()
step() {   # step NAME COMMAND...: run COMMAND in a subshell, record its exit status and wall time
  local name=$1; shift
  local t0 t1 rc
  t0=$(date +%s.%N)
  ( eval "$@" ) > "$WORK/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  ROWS+=("| \`$*\` | $rc | $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') |")
  echo "[first-hour] $name: exit $rc" >&2
}
step demo "make demo"
step help ".venv/bin/dapo --help"
step train ".venv/bin/dapo train experiments/mini-dapo.yaml train.rollout_steps=5"
step resume ".venv/bin/dapo train experiments/mini-dapo.yaml train.rollout_steps=5"
step config ".venv/bin/dapo config experiments/paper-dapo-32b.yaml algo.clip.eps_high=0.3"
step keys ".venv/bin/dapo config experiments/tiny-dapo.yaml --keys"
step expand ".venv/bin/dapo sweep expand sweeps/table1.yaml"
step plan ".venv/bin/dapo plan experiments/paper-dapo-32b.yaml --cluster example-gpu-cluster"
step smoke ".venv/bin/dapo sweep submit sweeps/smoke-slurm.yaml --cluster local"
step dryrun ".venv/bin/dapo sweep submit sweeps/table1-mini.yaml --cluster local --dry-run"
step runs ".venv/bin/dapo runs --sweep sweeps/table1-mini.yaml"
step figures ".venv/bin/dapo figures sweeps/table1-mini.yaml --from-snapshot"
step eval ".venv/bin/dapo eval \$(ls -d runs/runs/mini-dapo-* | head -1) --step 5"
# the browser's first page: seconds until the MLflow UI answers, then it is stopped
step mlflow_ui "(timeout 90 .venv/bin/mlflow ui --backend-store-uri sqlite:///\$PWD/runs/mlruns.db --port 5077 & \
  for i in \$(seq 90); do curl -sf localhost:5077 > /dev/null && echo up after \$i s && break; sleep 1; done; kill %1)"
echo "First hour from a fresh clone of $(git -C "$SRC" rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
echo
echo "| command | exit | wall (s) |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
