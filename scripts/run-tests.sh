#!/usr/bin/env bash
# The test suite as CI runs it. The Slurm tests start (and stop) a real one-node cluster
# through tests/slurm_cluster.py; nothing here is skipped for lack of a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DAPO_SLURM_REQUIRED=1  # CI must run the Slurm tests, never skip them
exec .venv/bin/python -m pytest -q "$@"
