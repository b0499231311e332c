#!/usr/bin/env bash
# The test suite as CI runs it. The Slurm tests start (and stop) a real one-node cluster
# through tests/slurm_cluster.py; the tracking-server tests use the throwaway PostgreSQL
# cluster started here (scripts/setup-postgres.sh installs Debian's postgresql if missing)
# and stopped, by its pid, when the suite ends. Nothing here is skipped for lack of a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DAPO_SLURM_REQUIRED=1  # CI must run the Slurm tests, never skip them
export DAPO_PG_REQUIRED=1     # ... and the PostgreSQL ones
eval "$(bash scripts/setup-postgres.sh start)"   # DAPO_PG_DIR, DAPO_PG_URI, DAPO_PG_PASSWORD_FILE
trap 'bash scripts/setup-postgres.sh stop "$DAPO_PG_DIR"; rm -rf "$DAPO_PG_DIR"' EXIT
.venv/bin/python -m pytest -q "$@"
