"""Reading rows: ``.jsonl`` / ``.json`` / ``.parquet`` files and ``hf:<id>`` data sets, and
finding their prompt and answer columns.

A row becomes a :class:`Row` (an extracted, untemplated prompt and answer, or the reason it
is bad); :func:`dapo.data.datasets.load_dataset` validates, templates and deduplicates them. Columns
are auto-detected, first match wins: prompt from ``prompt`` | ``problem`` | ``question``;
answer from ``answer`` | ``ground_truth`` | ``reward_model.ground_truth``; dotted names reach
into nested objects; a GSM8K-style ``#### `` answer is reduced to its final number.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.data.prompts import DataError, Example

__all__ = ["ANSWER_FIELDS", "PROMPT_FIELDS", "READERS", "LineRows", "Row", "generic_rows", "get_field", "gsm8k_final",
           "hf_items", "read_file"]


@dataclass(frozen=True)
class Row:
    """What a registered loader may yield instead of a mapping: an extracted, untemplated row.

    prompt: raw problem text (the template is applied later) or chat messages.
    answer: ground truth (str or int; anything else is a bad row).
    meta: extra fields copied into ``Example.meta``.
    bad: a reason string when the loader already knows the row is bad.
    """

    prompt: Any
    answer: Any
    meta: Mapping[str, Any] = field(default_factory=dict)
    bad: str | None = None


class LineRows(list):
    """The rows of a JSONL file; ``line_of[i]`` is the 1-based line of row ``i`` (blank lines are skipped)."""

    def __init__(self):
        super().__init__()
        self.line_of: list[int] = []


def _read_jsonl(path: Path) -> LineRows:
    """One parsed object per non-empty line; an unparsable or non-UTF-8 line is a bad Row."""
    rows = LineRows()
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                rows.append(Row(prompt=None, answer=None, bad=f"not UTF-8 text ({e.reason} at byte {e.start} "
                                                              f"of the line; save the file as UTF-8)"))
                rows.line_of.append(n)
                continue
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                rows.append(Row(prompt=None, answer=None, bad=f"invalid JSON ({e.msg})"))
            rows.line_of.append(n)
    return rows


def _read_json(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from e
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1:
            return lists[0]
    raise DataError(
        f"{path}: expected a JSON list of rows (or an object with exactly one list of rows)"
    )


def _read_parquet(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - pyarrow is a project dependency
        raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from e
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises its own error types for a damaged file
        raise DataError(f"{path}: not a readable parquet file ({type(e).__name__}: {str(e)[:200]})") from None


READERS: dict[str, Callable[[Path], Iterable[Any]]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".parquet": _read_parquet,
}


def read_file(path: Path) -> Iterable[Any]:
    """The rows of a ``.jsonl`` / ``.json`` / ``.parquet`` file (an unparsable JSONL line: a bad Row)."""
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(READERS)}")
    if not path.is_file():
        raise DataError(f"no such data file: {path}")
    return reader(path)


_MISSING = object()


def _lookup(row: Mapping[str, Any], dotted: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"``; a top-level key containing dots wins. ``_MISSING`` if absent."""
    if dotted in row:
        return row[dotted]
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def get_field(row: Mapping[str, Any], dotted: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"`` (a top-level key containing dots wins); None if absent."""
    value = _lookup(row, dotted)
    return None if value is _MISSING else value


def _has(row: Mapping[str, Any], dotted: str) -> bool:
    return _lookup(row, dotted) is not _MISSING


PROMPT_FIELDS: tuple[str, ...] = ("prompt", "problem", "question")
ANSWER_FIELDS: tuple[str, ...] = ("answer", "ground_truth", "reward_model.ground_truth")


def gsm8k_final(answer: str) -> str:
    """Text after the last ``#### `` with thousands separators removed."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def generic_rows(
    items: Iterable[Any], where: str, prompt_field: str | None, answer_field: str | None
) -> Iterator[Any]:
    """Mappings -> Rows with columns detected from the union of keys; passes others through."""
    items = list(items)
    mappings = [r for r in items if isinstance(r, Mapping)]

    def detect(kind: str, given: str | None, candidates: tuple[str, ...]) -> str | None:
        if given is not None:
            return given
        for c in candidates:
            if any(_has(r, c) for r in mappings):
                return c
        if mappings:
            keys = sorted({k for r in mappings for k in r})
            raise DataError(
                f"{where}: no {kind} column found; looked for {list(candidates)}, "
                f"columns are {keys} (pass {kind}_field=...)"
            )
        return None

    pf = detect("prompt", prompt_field, PROMPT_FIELDS)
    af = detect("answer", answer_field, ANSWER_FIELDS)
    for r in items:
        if isinstance(r, (Example, Row)):
            yield r
        elif isinstance(r, Mapping):
            answer = get_field(r, af) if af else None
            if isinstance(answer, str) and "####" in answer:
                answer = gsm8k_final(answer)
            meta = {k: v for k, v in r.items()
                    if k not in (pf, af) and isinstance(v, (str, int, float, bool))}
            yield Row(prompt=get_field(r, pf) if pf else None, answer=answer, meta=meta)
        else:
            yield Row(prompt=None, answer=None, bad=f"not an object ({type(r).__name__})")


def hf_items(spec: str, split: str | None) -> tuple[Iterable[Any], str, str]:
    """``<id>[:split]`` from the Hugging Face hub (optional ``datasets`` package): (rows, "hf:<id>", split)."""
    hf_id, _, hf_split = spec.partition(":")
    if split is not None and hf_split and split != hf_split:
        raise DataError(f"hf:{spec}: split given twice ({hf_split!r} and split={split!r})")
    hf_split = split or hf_split or "train"
    if not hf_id:
        raise DataError("hf: needs a dataset id, e.g. hf:openai/gsm8k:test")
    try:
        import datasets as hf_datasets  # optional, heavy
    except ImportError as e:
        raise DataError(
            f"hf:{spec}: loading from the Hugging Face hub needs the optional 'datasets' "
            "package (pip install datasets), which DAPO Lab does not install; "
            "or download the file and pass its path"
        ) from e
    try:
        ds = hf_datasets.load_dataset(hf_id, split=hf_split)
    except Exception as e:  # noqa: BLE001 - re-raised with the id named
        raise DataError(f"hf:{hf_id} split {hf_split!r}: {type(e).__name__}: {e}") from e
    return iter(ds), f"hf:{hf_id}", hf_split
