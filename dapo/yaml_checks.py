"""Checks for the plain YAML files beside experiment configs: sweep specs and cluster profiles.

Their values are checked with the rules of a config field (:func:`dapo.config._coerce`: no
bools for integers, finite numbers) and fail with one :class:`~dapo.config.ConfigError`
naming the file, the key and what is allowed. Pure: imports neither torch nor submitit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dapo.config import NAME_RE, ConfigError, _coerce, name_problem, safe_yaml_file, show

__all__ = ["NAME_RE", "REPO_ROOT", "check_int", "check_mapping", "check_name", "check_number", "check_path",
           "check_text", "find_file", "yaml_mapping_file"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def _is(value: Any, tp: Any) -> bool:
    """Whether ``value`` passes :func:`_coerce` as annotation ``tp``."""
    try:
        _coerce(value, tp, "", "")
    except ConfigError:
        return False
    return True


def check_name(value: Any, key: str, where: str) -> str:
    """A name that reaches a job script or a path: ``^[A-Za-z0-9._-]+$`` (no spaces, quotes, ``;``, ``$``),
    at most :data:`dapo.config.MAX_NAME_CHARS` characters (the rule of a config's ``name``).

    A full match: ``re.match`` with ``$`` would accept a trailing newline, which breaks a script's quoting."""
    problem = name_problem(value)
    if problem:
        raise ConfigError(f"{where}: {key} = {show(value)}: {problem}")
    return value


def check_int(value: Any, key: str, where: str, lo: int | None = None) -> int:
    """An integer (a config ``int``: bools refused) that is ``>= lo``."""
    if not _is(value, int) or (lo is not None and value < lo):
        raise ConfigError(f"{where}: {key} = {show(value)}: expected an integer" + (f" >= {lo}" if lo is not None else ""))
    return value


def check_number(value: Any, key: str, where: str, allow_none: bool = False) -> float | None:
    """A finite number (a config ``float``), or None when ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, str) or not _is(value, float):    # a spec's numbers are YAML numbers, not strings
        raise ConfigError(f"{where}: {key} = {show(value)}: expected a number" + (" or null" if allow_none else ""))
    return _coerce(value, float, key, where)


def check_text(value: Any, key: str, where: str) -> str:
    """A non-empty one-line string."""
    if not _is(value, str) or not value.strip() or any(c in value for c in "\n\r\0"):
        raise ConfigError(f"{where}: {key} = {show(value)}: expected a non-empty one-line string")
    return value


def check_path(value: Any, key: str, where: str) -> str:
    """A path that reaches a job script (``#SBATCH --output=...``): non-empty, no control characters
    (a newline would end the ``#SBATCH`` line and start a command)."""
    if not isinstance(value, str) or not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{where}: {key} = {show(value)}: expected a path without control characters "
                          f"(newline, carriage return, NUL, ...)")
    return value


def find_file(value: str, roots: tuple[Path, ...]) -> Path | None:
    """``value`` as an absolute file path, or relative to the first of ``roots`` that has it; None if none does."""
    for root in roots:
        p = (root / Path(value).expanduser()).resolve()
        if p.is_file():
            return p
    return None


def check_mapping(value: Any, key: str, where: str) -> dict:
    """A mapping (None reads as an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} = {show(value)}: expected a mapping")
    return value


def yaml_mapping_file(path: Path) -> dict:
    """:func:`safe_yaml_file` of a file whose top level must be a mapping (a sweep spec, a cluster profile)."""
    raw = safe_yaml_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return raw
