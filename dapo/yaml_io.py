"""Reading user YAML safely, and the one error type of bad user input.

:class:`ConfigError` is what every loader of user input (experiments, overrides, sweep specs,
cluster profiles) raises: one message naming the file, the key and what is allowed, never a
traceback. :func:`show` bounds how much of a user value an error message may print, and masks
any password in it (:func:`redact`; :func:`uri_password` finds one in a URI).
:func:`safe_yaml_text` / :func:`safe_yaml_file` are the project's one YAML loader: PyYAML's safe
loader that also refuses alias bombs, recursive aliases and a key given twice in one mapping.

A leaf: the standard library and PyYAML only (``dapo.config`` re-exports these names).
"""

from __future__ import annotations

import re
import reprlib
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "RefusedYaml", "show", "SHOW_CHARS", "MAX_ALIAS_NODES", "safe_yaml_text", "safe_yaml_file",
           "redact", "uri_password", "password_refusal", "PASSWORD_FILE_VAR", "PASSWORD_ENV_VAR"]


class ConfigError(ValueError):
    """A configuration problem; the message names the file, the key and what is allowed."""


_USERINFO_RE = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*):[^\s@/]*@")
_QUERY_PW_RE = re.compile(r"(?i)\b(password|passwd|pwd)=[^&\s]*")


def redact(text: str) -> str:
    """``text`` with the password of every URI in it (``scheme://user:PW@``, ``?password=PW``) masked."""
    return _QUERY_PW_RE.sub(r"\1=***", _USERINFO_RE.sub(r"\1:***@", str(text)))


def uri_password(uri: str) -> str | None:
    """The password a URI holds (user info or a ``password=`` query parameter), else None."""
    try:
        parts = urllib.parse.urlsplit(uri)
        pw = parts.password
    except ValueError:
        return None
    if pw:
        return pw
    for k, v in urllib.parse.parse_qsl(parts.query):
        if k.lower() in ("password", "passwd", "pwd") and v:
            return v
    return None


PASSWORD_FILE_VAR = "DAPO_TRACKING_PASSWORD_FILE"   # names a file holding the tracking password
PASSWORD_ENV_VAR = "DAPO_TRACKING_PASSWORD_ENV"     # names an environment variable holding it


def password_refusal(where: str, uri: str, what: str = "URI") -> str:
    """Why a URI holding a password is refused, and where the password goes instead (never the password)."""
    return (f"{where}: the {what} {redact(uri)} holds a password, which would be written to run directories, job "
            f"scripts, MLflow params and logs; remove it from the URI and put it in a file named by "
            f"${PASSWORD_FILE_VAR} (or an environment variable named by ${PASSWORD_ENV_VAR}); a cluster profile "
            f"names them as tracking_password_file / tracking_password_env")


class _Repr(reprlib.Repr):
    """reprlib that masks passwords in every string before it is cut (a cut could keep half of one)."""

    def repr_str(self, x: str, level: int) -> str:
        return super().repr_str(redact(x), level)


SHOW_CHARS = 200
_REPR = _Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, SHOW_CHARS, SHOW_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


def show(value: Any, limit: int = SHOW_CHARS) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters: a user value is never
    printed whole (reprlib walks at most a few levels and items, so a huge value costs nothing),
    and a password in it never at all (:func:`redact`)."""
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
        raise ConfigError(f"{where}: not valid YAML: {yaml_problem(exc)}") from exc


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parse error as one readable line: ``line L, column C: <problem> (<context> on line L')``,
    without PyYAML's multi-line snippet (and passwords masked, at most 300 characters)."""
    def at(mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None)
    if isinstance(exc, yaml.MarkedYAMLError) and problem:
        text = f"{at(exc.problem_mark)}: {problem}" if exc.problem_mark is not None else problem
        if exc.context:
            same = exc.context_mark is not None and exc.problem_mark is not None and \
                (exc.context_mark.line, exc.context_mark.column) == (exc.problem_mark.line, exc.problem_mark.column)
            text += f" ({exc.context}{'' if same or exc.context_mark is None else ' at ' + at(exc.context_mark)})"
    else:
        text = str(exc)
    text = " ".join(redact(text.replace('"<unicode string>", ', "")).split())
    return text if len(text) <= 300 else text[:297] + "..."


MAX_YAML_BYTES = 1024 * 1024
"""The largest YAML file :func:`safe_yaml_file` reads (the shipped ones are under 10 KB)."""


def safe_yaml_file(path: Path) -> Any:
    """:func:`safe_yaml_text` of a file; any way the file can be unreadable is a ConfigError naming it.

    The one YAML loader of experiments, sweep specs and cluster profiles."""
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: {size} bytes, more than the {MAX_YAML_BYTES // 1024} KiB an experiment, spec "
                              f"or profile may hold (a config is a few KB; parsing 50 MB of YAML takes minutes)")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    return safe_yaml_text(text, str(path))
