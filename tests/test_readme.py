"""The README's `dapo` commands stay true: each names a real subcommand, flags that its `--help`
lists, files that exist and config keys that exist. (Running them is `make demo` / the first hour;
this catches a renamed flag, file or key the day it changes.)"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """Every `dapo ...` line inside the README's fenced blocks, comments and `$ ` prompts removed."""
    out, fenced = [], False
    for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        cmd = re.sub(r"^\$ |^\.venv/bin/", "", line.strip())
        if fenced and cmd.startswith("dapo "):
            out.append(re.sub(r"\s+(#.*|\(abridged\))$", "", cmd).strip())
    return out


@lru_cache(maxsize=None)
def _help(*words: str) -> str:
    p = subprocess.run([sys.executable, "-m", "dapo.cli", *words, "--help"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, (words, p.stderr[-500:])
    return p.stdout


@lru_cache(maxsize=None)
def _keys() -> frozenset[str]:
    from dapo.config import field_docs
    return frozenset(k for k, _, _ in field_docs())


def test_the_readme_has_commands():
    assert len(readme_commands()) >= 15


@pytest.mark.parametrize("cmd", readme_commands())
def test_a_readme_command_names_real_flags_files_and_keys(cmd):
    words = shlex.split(cmd)[1:]
    if words == ["--help"]:
        return
    sub = words[:2] if words[0] == "sweep" else words[:1]
    text = _help(*sub)
    for w in words[len(sub):]:
        if w.startswith("--"):
            assert re.search(rf"(^|\s|\[){re.escape(w.split('=')[0])}\b", text), f"{cmd}: {w} not in `dapo {' '.join(sub)} --help`"
        elif re.fullmatch(r"(experiments|sweeps|slurm)/[\w.-]+\.yaml", w):
            assert (REPO / w).is_file(), f"{cmd}: {w} does not exist"
        elif "=" in w and not w.startswith("-") and re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+=.*", w):
            assert w.split("=")[0] in _keys(), f"{cmd}: {w.split('=')[0]} is not a config key"


PARSED = ("diff", "export", "eval")
"""Subcommands whose module has a ``parser()``: their README lines must also parse with it (a missing
positional, a flag's bad value or a wrong choice fails here, not on the user's first try)."""


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if c.split()[1] in PARSED])
def test_a_readme_command_parses_with_its_commands_own_parser(cmd):
    import importlib

    from dapo.cli import COMMANDS
    words = shlex.split(cmd)[1:]
    parser = importlib.import_module(COMMANDS[words[0]][0]).parser()
    try:
        parser.parse_intermixed_args(words[1:])
    except SystemExit as exc:
        pytest.fail(f"{cmd}: `dapo {words[0]}` refuses it (exit {exc.code})")


def test_the_readme_shows_dapo_diff_and_dapo_export():
    """Issue 41: the two run-inspection commands each have a line the tests above check."""
    subs = [shlex.split(c)[1] for c in readme_commands()]
    assert subs.count("diff") >= 2 and subs.count("export") >= 2
    assert any("--json" in c for c in readme_commands() if c.startswith("dapo diff "))
