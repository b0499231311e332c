#!/usr/bin/env bash
# One-GPU check of the training half, for a machine with one CUDA GPU and a preinstalled image
# (Python, torch, transformers, accelerate; no vLLM, no MLflow, no package index). In one run of a
# few minutes (limit: 8) scripts/device_check.py measures the bf16 matmul rate, runs one FSDP2 update
# (world 1, NCCL, bf16 compute, gradient checkpointing, chunked log-probs) on tiny-25m and on a
# Qwen2.5-0.5B-shaped random model, printing MFU and the peak memory against `dapo plan`, checks the
# padding-free update (packed log-probs = padded ones; MFU of uniform vs mixed lengths, padded vs
# packed), saves and resumes a DCP checkpoint (bit-for-bit check), and runs 2 rollout steps with the
# transformers engine. Before those, five probes (scripts/device_probes.py; --probes only|none) print
# one line each beside `dapo plan`'s number: the runtime's memory overhead, the paper-shape logits path
# (2,048 x 152,064), one Qwen2.5-32B-shaped decoder layer at 22,528 tokens (flash/efficient SDPA only),
# a DCP async_save of 3 GB, and the C compiler / Python.h with one torch.compile'd step; a probe that
# fails says why in its line and the rest still run.
#
#   bash scripts/device-check.sh [--cpu] [--wheels DIR] [extra arguments of scripts/device_check.py]
#   bash scripts/device-check.sh --fetch-wheels DIR     # on a machine with a package index, beforehand
#
# --cpu: CPU + gloo and small shapes (checks the script itself on any machine). --wheels DIR: wheels
# carried for packages the image lacks (its transformers brings numpy, PyYAML, safetensors, tokenizers;
# accelerate and its psutil may be missing); --fetch-wheels DIR downloads those two for CPython 3.12 on
# x86-64 Linux. PYTHON picks the interpreter (default: python3, the image's). Output: the terminal and
# runs/device-check/check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n '2,23p' "$0"; exit 0; fi
if [ "${1:-}" = "--fetch-wheels" ]; then
  [ -n "${2:-}" ] || { echo "usage: bash scripts/device-check.sh --fetch-wheels DIR" >&2; exit 2; }
  exec "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$2" accelerate psutil
fi
OUT=runs/device-check
mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "${1:-}" != "--cpu" ] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
exec timeout 480 "$PYTHON" scripts/device_check.py --workdir "$OUT" "$@"
