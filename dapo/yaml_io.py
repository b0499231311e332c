"""Reading user YAML safely, and the one error type of bad user input.

:class:`ConfigError` is what every loader of user input (experiments, overrides, sweep specs,
cluster profiles) raises: one message naming the file, the key and what is allowed, never a
traceback. :func:`show` bounds how much of a user value an error message may print.
:func:`safe_yaml_text` / :func:`safe_yaml_file` are the project's one YAML loader: PyYAML's safe
loader that also refuses alias bombs, recursive aliases and a key given twice in one mapping.

A leaf: the standard library and PyYAML only (``dapo.config`` re-exports these names).
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "RefusedYaml", "show", "SHOW_CHARS", "MAX_ALIAS_NODES", "safe_yaml_text", "safe_yaml_file"]


class ConfigError(ValueError):
    """A configuration problem; the message names the file, the key and what is allowed."""


SHOW_CHARS = 200
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, SHOW_CHARS, SHOW_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


def show(value: Any, limit: int = SHOW_CHARS) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters: a user value is never
    printed whole (reprlib walks at most a few levels and items, so a huge value costs nothing)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


MAX_ALIAS_NODES = 10_000   # nodes that YAML aliases (*name) may add to a document, expanded


class RefusedYaml(yaml.YAMLError):
    """Valid YAML this project refuses: an alias bomb, a recursive alias, a repeated key."""


def _expanded_nodes(node: yaml.Node, memo: dict[int, int], busy: set[int]) -> int:
    """Nodes of ``node`` with every alias expanded (memoised per node, so linear in the document)."""
    if id(node) in memo:
        return memo[id(node)]
    if id(node) in busy:
        raise RefusedYaml(f"line {node.start_mark.line + 1}: a recursive alias (an anchor used inside itself)")
    busy.add(id(node))
    kids: list = []
    if isinstance(node, yaml.SequenceNode):
        kids = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        kids = [n for pair in node.value for n in pair]
    n = 1 + sum(_expanded_nodes(k, memo, busy) for k in kids)
    busy.discard(id(node))
    memo[id(node)] = n
    return n


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses alias bombs and repeated mapping keys."""

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            distinct: set[int] = set()
            todo = [node]
            while todo:                       # the document's own nodes, each once
                n = todo.pop()
                if id(n) in distinct:
                    continue
                distinct.add(id(n))
                if isinstance(n, yaml.SequenceNode):
                    todo += n.value
                elif isinstance(n, yaml.MappingNode):
                    todo += [x for pair in n.value for x in pair]
            expanded = _expanded_nodes(node, {}, set())
            if expanded - len(distinct) > MAX_ALIAS_NODES:
                raise RefusedYaml(f"aliases (*name) expand to {expanded} nodes, more than {MAX_ALIAS_NODES} "
                                   f"beyond the {len(distinct)} written (an alias bomb?)")
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    if key in seen:
                        raise RefusedYaml(f"line {key_node.start_mark.line + 1}: key {show(key)} is given twice "
                                           f"in one mapping (first on line {seen[key]}); give each key once")
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:   # an unhashable key: SafeConstructor reports it
                    pass
        return super().construct_mapping(node, deep=deep)


def safe_yaml_text(text: str, where: str) -> Any:
    """``yaml.safe_load`` of ``text`` without alias bombs or repeated keys; a ConfigError naming ``where``."""
    try:
        loader = _Loader(text)      # what yaml.safe_load does, with this SafeLoader subclass
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except RecursionError:
        raise ConfigError(f"{where}: YAML nested too deeply") from None
    except RefusedYaml as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {show(str(exc), 400)}") from exc


def safe_yaml_file(path: Path) -> Any:
    """:func:`safe_yaml_text` of a file; any way the file can be unreadable is a ConfigError naming it.

    The one YAML loader of experiments, sweep specs and cluster profiles."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    return safe_yaml_text(text, str(path))
