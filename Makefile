# DAPO Lab. A newcomer needs two commands: `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export OMP_WAIT_POLICY := PASSIVE

.PHONY: setup demo test test-fast figures base bench slurm-up slurm-down clean help

help:            ## list targets
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

setup:           ## create .venv with the pinned stack (idempotent; seconds when done)
	@bash scripts/setup.sh

demo: setup      ## build the tiny base model, run GRPO vs DAPO locally, write results/demo/
	@$(PY) -m dapo.commands.demo

test: setup      ## the whole suite, real vLLM/MLflow/Slurm included (what CI runs)
	@bash scripts/run-tests.sh

test-fast: setup ## unit tests only (no Slurm, no end-to-end runs)
	@$(PY) -m pytest -q -m "not slow and not slurm"

SWEEP ?= table1-mini
figures: setup   ## regenerate results/$(SWEEP)/ from its snapshot
	@$(PY) -m dapo.cli figures sweeps/$(SWEEP).yaml --from-snapshot

base: setup      ## build (or reuse) the tiny supervised base model of the mini reproduction
	@$(PY) -m dapo.cli base

bench: setup     ## print every benchmark table (results/bench/)
	@bash bench/run_all.sh

slurm-up:        ## start the one-node local Slurm cluster used by the tests
	@bash slurm/local-cluster.sh start

slurm-down:      ## stop it (only the daemons it started)
	@bash slurm/local-cluster.sh stop

clean:           ## remove run outputs (keeps .venv and results/)
	rm -rf runs mlruns.db .pytest_cache
