"""A config loaded: a YAML file (``inherit:`` another), dotted ``KEY=VALUE`` overrides, merged and built."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import yaml

from dapo.config.checks import build_config
from dapo.config.sections import Config
from dapo.yaml_io import ConfigError, RefusedYaml, safe_yaml_file, safe_yaml_text, show


def parse_value(text: str) -> Any:
    """Parse an override's value with YAML rules (``0.28`` → float, ``true`` → bool, ``[a, b]`` → list).

    Text that is not YAML stays a string; an alias bomb or a repeated key is an error."""
    if text == "":
        return ""
    try:
        return safe_yaml_text(text, "override value")
    except ConfigError as exc:
        if isinstance(exc.__cause__, yaml.YAMLError) and not isinstance(exc.__cause__, RefusedYaml):
            return text
        raise


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` → ``{"a.b": 1, "c": "x"}``; an item without ``=`` is an error."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {show(item)}: expected KEY=VALUE, e.g. algo.clip.eps_high=0.28")
        k, v = item.split("=", 1)
        k = k.strip()
        if not k:
            raise ConfigError(f"override {show(item)}: empty key")
        if k in out:
            raise ConfigError(f"override {show(k)} is given twice on the command line; give each key once")
        out[k] = parse_value(v)
    return out


def _known_keys(cls: type = Config, prefix: str = "") -> set[str]:
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        full = f"{prefix}.{f.name}" if prefix else f.name
        keys.add(full)
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= _known_keys(hints[f.name], full)
    return keys


def apply_overrides(data: dict, overrides: dict[str, Any], where: str = "<overrides>") -> dict:
    """Return a deep copy of ``data`` with dotted ``overrides`` applied.

    A key that names no config field is an error listing the closest valid keys.
    """
    out = json.loads(json.dumps(data, default=list))
    known = _known_keys()
    for key, value in overrides.items():
        if key not in known:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            near = sorted(k for k in known if k.startswith(parent + ".") and k.count(".") == key.count("."))
            hint = f"; keys under {show(parent)}: {', '.join(near)}" if parent and near else ""
            raise ConfigError(f"{where}: unknown key {show(key)}{hint}")
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return out


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_yaml(path: str | Path, _seen: tuple = ()) -> dict:
    """Read an experiment YAML, resolving ``inherit: other.yaml`` (relative to the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such experiment file")
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: inherit cycle through {' -> '.join(str(p) for p in _seen)}")
    data = safe_yaml_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    parent = data.pop("inherit", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: inherit = {show(parent)}: expected a file name")
        base = read_yaml(path.parent / parent, _seen + (path.resolve(),))
        data = _deep_merge(base, data)
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Load an experiment YAML (or the defaults when ``path`` is None) plus dotted overrides."""
    data = read_yaml(path) if path is not None else {}
    where = str(path) if path is not None else "<defaults>"
    ov: dict = {}
    if overrides:
        ov = parse_overrides(overrides) if isinstance(overrides, (list, tuple)) else dict(overrides)
        data = apply_overrides(data, ov, where=f"{where} (overrides)")
    try:
        return build_config(data, where)
    except ConfigError as exc:   # a bad KEY=VALUE typed on the command line is blamed on it, not on the file
        text = str(exc)
        if isinstance(overrides, (list, tuple)):
            for k in sorted(ov, key=len, reverse=True):
                if text.startswith((f"{where}: {k} = ", f"{where}: {k}: ", f"{where}: {k}[")):
                    raise ConfigError(f"command line: {text[len(where) + 2:]} (overriding {where})") from None
        raise
