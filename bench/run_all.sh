#!/usr/bin/env bash
# `make bench`: every benchmark table (issue #7). Run it on a quiet machine: the TRL
# comparison alone takes about an hour on 2 cores. Output: results/bench/latest.md (the
# tables, with the command, commit and machine) and results/bench/trl.json (every step time).
# BENCH_QUICK=1 runs the CI-sized smoke of each instead (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results/bench
# vLLM's and transformers' start-up logs and progress bars: not part of the tables
NOISE='Writing model shards|^\(MainProcess|^\(EngineCore|^INFO |^WARNING |Loading safetensors|^\[W[0-9]|FutureWarning|hasattr\(value|wrapper = lookup|Triton is installed|^Loading weights|it/s\]$'
PY=.venv/bin/python
export OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [ "${BENCH_QUICK:-0}" = 1 ]; then
  TRL="--smoke"; FLOPS="--smoke"; ROLL="--prompts 4 --n 2 --max-tokens 8 --repeats 1 --hf-repeats 1"; ANA="--steps 20 --seeds 1"
  TRACK="--writers 2 --steps 20 --metrics 5 --stores sqlite --out /dev/null"; COV="--reps 200"; SEQ="--n-sim 20 --effects 1"
  OUT=results/bench/quick.md
else
  TRL="--json results/bench/trl.json"; FLOPS="--micro 8,16,64 --repeats 2"; ROLL=""; ANA=""; TRACK=""; COV=""; SEQ=""
  OUT=results/bench/latest.md
fi
{ echo "# make bench, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- dapo bench || echo ' (+ uncommitted changes)')"
  echo; echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; load before: $(cut -d' ' -f1-3 /proc/loadavg)"; echo
  echo '```'; echo "\$ python -m bench.bench_trl $TRL"; echo '```'
  $PY -m bench.bench_trl $TRL || echo "bench_trl FAILED"; echo
  echo '```'; echo "\$ python -m bench.bench_flops $FLOPS"; echo '```'
  $PY -m bench.bench_flops $FLOPS || echo "bench_flops FAILED"; echo
  echo '```'; echo "\$ python -m bench.bench_rollout $ROLL"; echo '```'
  $PY -m bench.bench_rollout $ROLL || echo "bench_rollout FAILED"; echo
  echo '```'; echo "\$ python -m bench.bench_sequential $SEQ"; echo '```'
  $PY -m bench.bench_sequential $SEQ || echo "bench_sequential FAILED"; echo
  echo '```'; echo "\$ python -m bench.step_breakdown"; echo '```'
  $PY -m bench.step_breakdown || echo "step_breakdown FAILED"; echo
  echo '```'; echo "\$ python -m bench.step_breakdown --snapshot results/mismatch-mini/snapshot --thresholds 0.2,0.21"; echo '```'
  $PY -m bench.step_breakdown --snapshot results/mismatch-mini/snapshot --thresholds 0.2,0.21 || echo "step_breakdown FAILED"; echo
  echo '```'; echo "\$ python -m bench.bench_analysis $ANA"; echo '```'
  $PY -m bench.bench_analysis $ANA || echo "bench_analysis FAILED"; echo
  echo '```'; echo "\$ python -m bench.bench_coverage $COV"; echo '```'
  $PY -m bench.bench_coverage $COV || echo "bench_coverage FAILED"; echo
  echo '```'; echo "\$ python -m bench.bench_tracking $TRACK"; echo '```'
  $PY -m bench.bench_tracking $TRACK || echo "bench_tracking FAILED"; echo
  echo '```'; echo "\$ python -m bench.scaling_sketch"; echo '```'
  $PY -m bench.scaling_sketch || echo "scaling_sketch FAILED"; } 2>&1 | grep --line-buffered -Ev "$NOISE" | tee "$OUT"
