"""Prompt data sets: loading, templating, validation and a resumable sampler.

Everything here is plain Python (no torch, no transformers import). Tokenizers are passed
in as objects to :func:`render_prompt`.

Data flow::

    load_dataset(name) ──> loader rows ──> (prompt, answer) ──> checks ──> template ──> dedup
                                                                  │
                                   bad rows: counted per reason in LoadReport; dropped or DataError

Registry (``DATASETS``), shipped files in ``dapo/datasets/`` (see PROVENANCE.md there):

==============  =====================================  ========  ================  ===========
name            file                                   rows      default template  scorer
==============  =====================================  ========  ================  ===========
dapo-math-17k   dapo_math_17k.dedup.jsonl (train)      17,290    dapo              dapo
aime24          aime-2024.dedup.jsonl (test)           30        dapo (as shipped) dapo
aime25          aime25.math-ai.test.jsonl (test)       30        dapo              dapo
math500         math-500.test.jsonl (test)             500       boxed             math_verify
gsm8k           gsm8k.test.jsonl (test)                1,319     dapo              dapo
==============  =====================================  ========  ================  ===========

The scorer follows the template: ``"dapo"`` asks for a final ``Answer:`` line, which the
DAPO scorer reads; ``"boxed"`` asks for ``\\boxed{}``, which math-verify reads; with
``"none"`` the dataset's own scorer is used. ``scorer=`` overrides. GSM8K defaults to the
DAPO template because small models follow "Answer: 18" far more reliably than
``\\boxed{18}``; ``template="boxed"`` gives the math-verify variant.

Any other name is a file path (``.jsonl``, ``.json``, ``.parquet``) or ``hf:<id>[:split]``
(needs the optional ``datasets`` package). Columns are auto-detected, first match wins:
prompt from ``prompt`` | ``problem`` | ``question``; answer from ``answer`` |
``ground_truth`` | ``reward_model.ground_truth`` (``prompt_field=`` / ``answer_field=``
override, dotted paths reach into nested objects). A ``prompt`` may be a string or a list of
chat messages ``[{"role": ..., "content": ...}]``. A string answer containing a GSM8K-style
``#### `` line is reduced to the text after the last ``#### `` (commas removed). Files
default to ``template="none"`` and scorer ``"dapo"``.

Other modules add generated data sets with :func:`register` (``dapo.minitask`` is imported
lazily by :func:`load_dataset`, so it may ``import dapo.data`` at its top).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "BOXED_TEMPLATE_SUFFIX",
    "DAPO_TEMPLATE_PREFIX",
    "DAPO_TEMPLATE_SUFFIX",
    "DATASETS",
    "DATASET_DIR",
    "DataError",
    "DatasetEntry",
    "Example",
    "LoadReport",
    "PromptSampler",
    "Row",
    "TEMPLATES",
    "batches",
    "dataset_names",
    "drop_long_prompts",
    "load_dataset",
    "register",
    "render_prompt",
    "wrap_boxed",
    "wrap_dapo",
]

DATASET_DIR = Path(__file__).resolve().parent / "datasets"
"""Folder holding the shipped data files (inside the package)."""

# --------------------------------------------------------------------------- templates

DAPO_TEMPLATE_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    "problem.\n\n"
)
DAPO_TEMPLATE_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
BOXED_TEMPLATE_SUFFIX = (
    "\n\nPlease reason step by step, and put your final answer within \\boxed{}."
)

Template = Literal["dapo", "boxed", "none"]
TEMPLATES: tuple[str, ...] = ("dapo", "boxed", "none")
SCORERS: tuple[str, ...] = ("dapo", "math_verify")
_TEMPLATE_SCORER = {"dapo": "dapo", "boxed": "math_verify"}


def wrap_dapo(problem: str) -> str:
    """The DAPO user message: prefix + problem + suffix, concatenated exactly (no strip)."""
    return DAPO_TEMPLATE_PREFIX + problem + DAPO_TEMPLATE_SUFFIX


def wrap_boxed(problem: str) -> str:
    """Problem followed by the usual "put your final answer within \\boxed{}" instruction."""
    return problem + BOXED_TEMPLATE_SUFFIX


def _apply_template(text: str, template: str) -> str:
    if template == "dapo":
        return wrap_dapo(text)
    if template == "boxed":
        return wrap_boxed(text)
    return text


# --------------------------------------------------------------------------- records


class DataError(ValueError):
    """A data set could not be loaded; the message names the path (and row) at fault."""


@dataclass(frozen=True)
class Example:
    """One prompt with its ground truth.

    prompt: the user text, already wrapped in its template, or a list of chat messages
        ``[{"role": "user", "content": ...}, ...]``.
    answer: ground truth as a string (ints are converted).
    source: data set name (or path) it came from.
    index: 0-based row number in the source stream (file line / parquet row).
    scorer: ``"dapo"`` (last ``Answer:`` line) or ``"math_verify"`` (``\\boxed{}``).
    meta: extra fields kept for analysis (e.g. MATH-500 ``level``); not part of equality.
    """

    prompt: str | list[dict]
    answer: str
    source: str
    index: int
    scorer: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


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


@dataclass
class LoadReport:
    """What happened while loading one data set.

    Invariant: ``total == kept + sum(bad.values()) + (duplicates if deduplicated else 0)
    + limited``.
    """

    source: str  # registry name, path or hf id as given
    path: str  # file (or hf id) actually read
    total: int = 0  # rows seen in the source
    kept: int = 0  # examples returned
    bad: dict[str, int] = field(default_factory=dict)  # reason -> count (dropped or fatal)
    duplicates: int = 0  # rows whose final prompt equals an earlier valid row's
    deduplicated: bool = False  # True: duplicates were dropped; False: only counted
    limited: int = 0  # valid rows left out by ``limit``
    template: str = "none"
    scorer: str = "dapo"
    examples_of_bad: list[str] = field(default_factory=list)  # first few "row 12: reason"

    def summary(self) -> str:
        bad = ", ".join(f"{k}: {v}" for k, v in sorted(self.bad.items())) or "none"
        dup = f"{self.duplicates} {'dropped' if self.deduplicated else 'kept'}"
        return (
            f"{self.source} ({self.path}): {self.kept}/{self.total} rows kept; bad: {bad}; "
            f"duplicates: {dup}; limited: {self.limited}; template={self.template} "
            f"scorer={self.scorer}"
        )


_MAX_BAD_EXAMPLES = 5

# --------------------------------------------------------------------------- registry

Loader = Callable[..., Iterable[Any]]


@dataclass(frozen=True)
class DatasetEntry:
    """A registered data set: the loader plus its defaults. Calling the entry calls the loader.

    loader: ``fn()`` or ``fn(split=...)``, returning an iterable of :class:`Example`,
        :class:`Row` or mappings (columns auto-detected as for files).
    template: default template when ``load_dataset(template=None)``.
    scorer: scorer used with ``template="none"`` (and for :class:`Example` items).
    dedup: drop rows whose final prompt repeats an earlier one.
    splits: splits the loader accepts; ``split=None`` means the first.
    path: file the loader reads (for reports and errors), if any.
    """

    name: str
    loader: Loader
    template: str = "none"
    scorer: str = "dapo"
    dedup: bool = False
    splits: tuple[str, ...] = ()
    path: str = ""
    description: str = ""

    def __call__(self, split: str | None = None) -> Iterable[Any]:
        if _accepts_split(self.loader):
            return self.loader(split=split)
        return self.loader()


DATASETS: dict[str, DatasetEntry] = {}
"""Registry: name -> :class:`DatasetEntry` (callable like its loader)."""


def _accepts_split(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "split" or p.kind is p.VAR_KEYWORD for p in params)


def register(
    name: str,
    loader: Loader | None = None,
    *,
    template: str = "none",
    scorer: str = "dapo",
    dedup: bool = False,
    splits: Sequence[str] = (),
    path: str = "",
    description: str = "",
    overwrite: bool = False,
) -> Any:
    """Register a data set under ``name``; use as ``@register("arith-train")`` or directly.

    The loader takes no arguments (or ``split=``) and returns an iterable of
    :class:`Example`, :class:`Row` or mappings. Generated data sets usually yield
    ``Example`` objects with their prompts final, so the default template is ``"none"``.
    Registering a name twice raises unless it is the same function (module reload) or
    ``overwrite=True``. Returns the loader unchanged (decorator-friendly).
    """
    if template not in TEMPLATES:
        raise ValueError(f"register({name!r}): template={template!r}; allowed: {TEMPLATES}")
    if scorer not in SCORERS:
        raise ValueError(f"register({name!r}): scorer={scorer!r}; allowed: {SCORERS}")

    def deco(fn: Loader) -> Loader:
        old = DATASETS.get(name)
        if old is not None and not overwrite and not _same_function(old.loader, fn):
            raise ValueError(
                f"dataset {name!r} is already registered (by {_qualname(old.loader)}); "
                "pass overwrite=True to replace it"
            )
        DATASETS[name] = DatasetEntry(
            name=name,
            loader=fn,
            template=template,
            scorer=scorer,
            dedup=dedup,
            splits=tuple(splits),
            path=path,
            description=description or (inspect.getdoc(fn) or "").split("\n")[0],
        )
        return fn

    return deco if loader is None else deco(loader)


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    return a is b or _qualname(a) == _qualname(b)


def dataset_names() -> list[str]:
    """Registered names (after trying to import ``dapo.minitask``), sorted."""
    _import_plugins()
    return sorted(DATASETS)


def _import_plugins() -> None:
    try:
        import dapo.minitask  # noqa: F401  (registers generated data sets)
    except ImportError as e:  # only a missing minitask module is fine; its own bugs are not
        if e.name not in ("dapo.minitask",):
            raise


# --------------------------------------------------------------------------- file reading


def _read_jsonl(path: Path) -> Iterator[Any]:
    """Yield one parsed object per non-empty line; an unparsable line yields a bad Row."""
    with path.open("r", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                yield Row(prompt=None, answer=None, bad=f"invalid JSON ({e.msg})")


def _read_json(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
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
    return pq.read_table(path).to_pylist()


_READERS: dict[str, Callable[[Path], Iterable[Any]]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".parquet": _read_parquet,
}


def _read_file(path: Path) -> Iterable[Any]:
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(_READERS)}")
    if not path.is_file():
        raise DataError(f"no such data file: {path}")
    return reader(path)


def _get(row: Mapping[str, Any], dotted: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"``; a top-level key containing dots wins. None if absent."""
    if dotted in row:
        return row[dotted]
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _has(row: Mapping[str, Any], dotted: str) -> bool:
    if dotted in row:
        return True
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return False
        cur = cur[part]
    return True


PROMPT_FIELDS: tuple[str, ...] = ("prompt", "problem", "question")
ANSWER_FIELDS: tuple[str, ...] = ("answer", "ground_truth", "reward_model.ground_truth")


def _gsm8k_final(answer: str) -> str:
    """Text after the last ``#### `` with thousands separators removed."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def _generic_rows(
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
            answer = _get(r, af) if af else None
            if isinstance(answer, str) and "####" in answer:
                answer = _gsm8k_final(answer)
            meta = {k: v for k, v in r.items()
                    if k not in (pf, af) and isinstance(v, (str, int, float, bool))}
            yield Row(prompt=_get(r, pf) if pf else None, answer=answer, meta=meta)
        else:
            yield Row(prompt=None, answer=None, bad=f"not an object ({type(r).__name__})")


# --------------------------------------------------------------------------- shipped data sets


def _shipped(filename: str) -> Path:
    return DATASET_DIR / filename


@register(
    "dapo-math-17k",
    template="dapo",
    scorer="dapo",
    dedup=True,
    splits=("train",),
    path=str(_shipped("dapo_math_17k.dedup.jsonl")),
    description="DAPO-Math-17k, 17,290 distinct problems (training set of the paper)",
)
def _load_dapo_math_17k() -> Iterator[Row]:
    for r in _read_file(_shipped("dapo_math_17k.dedup.jsonl")):
        if isinstance(r, Row):
            yield r
            continue
        msgs = r.get("prompt") or [{}]
        yield Row(
            prompt=msgs[0].get("content") if len(msgs) == 1 else None,
            answer=_get(r, "reward_model.ground_truth"),
            meta={"block_index": _get(r, "extra_info.index")},
        )


@register(
    "aime24",
    template="dapo",
    scorer="dapo",
    splits=("test",),
    path=str(_shipped("aime-2024.dedup.jsonl")),
    description="AIME 2024 (I+II), 30 problems, the paper's evaluation set",
)
def _load_aime24() -> Iterator[Row]:
    path = _shipped("aime-2024.dedup.jsonl")
    for i, r in enumerate(_read_file(path)):
        if isinstance(r, Row):
            yield r
            continue
        raw = _get(r, "extra_info.raw_problem")
        content = (r.get("prompt") or [{}])[0].get("content")
        if isinstance(raw, str) and content != wrap_dapo(raw):
            # The shipped file is checksummed; a mismatch means the file was altered.
            raise DataError(f"{path}: row {i}: prompt is not the DAPO template around raw_problem")
        yield Row(prompt=raw, answer=_get(r, "reward_model.ground_truth"),
                  meta={"aime_index": _get(r, "extra_info.index")})


@register(
    "aime25",
    template="dapo",
    scorer="dapo",
    splits=("test",),
    path=str(_shipped("aime25.math-ai.test.jsonl")),
    description="AIME 2025 (I+II), 30 problems (math-ai/aime25 copy)",
)
def _load_aime25() -> Iterator[Row]:
    for r in _read_file(_shipped("aime25.math-ai.test.jsonl")):
        if isinstance(r, Row):
            yield r
            continue
        yield Row(prompt=r.get("problem"), answer=r.get("answer"), meta={"id": r.get("id")})


@register(
    "math500",
    template="boxed",
    scorer="math_verify",
    splits=("test",),
    path=str(_shipped("math-500.test.jsonl")),
    description="MATH-500 (PRM800K test split), 500 problems, LaTeX answers",
)
def _load_math500() -> Iterator[Row]:
    for r in _read_file(_shipped("math-500.test.jsonl")):
        if isinstance(r, Row):
            yield r
            continue
        meta = {k: r.get(k) for k in ("subject", "level", "unique_id")}
        yield Row(prompt=r.get("problem"), answer=r.get("answer"), meta=meta)


@register(
    "gsm8k",
    template="dapo",
    scorer="math_verify",
    splits=("test",),
    path=str(_shipped("gsm8k.test.jsonl")),
    description="GSM8K test, 1,319 problems, answer = number after '#### '",
)
def _load_gsm8k() -> Iterator[Row]:
    for r in _read_file(_shipped("gsm8k.test.jsonl")):
        if isinstance(r, Row):
            yield r
            continue
        sol = r.get("answer")
        if isinstance(sol, str) and "####" not in sol:
            yield Row(prompt=r.get("question"), answer=None, bad="no '#### ' answer line")
            continue
        yield Row(prompt=r.get("question"), answer=_gsm8k_final(sol) if isinstance(sol, str) else sol)


# --------------------------------------------------------------------------- validation


def _check_messages(p: list[Any]) -> bool:
    return bool(p) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in p
    )


def _prompt_problem(prompt: Any) -> str | None:
    """Why a prompt is bad, or None."""
    if prompt is None:
        return "missing prompt"
    if isinstance(prompt, str):
        return "empty prompt" if not prompt.strip() else None
    if isinstance(prompt, list) and _check_messages(prompt):
        return None if any(m["content"].strip() for m in prompt) else "empty prompt"
    return "non-string prompt"


def _answer_or_problem(answer: Any) -> tuple[str | None, str | None]:
    """(answer as str, None) or (None, reason)."""
    if answer is None:
        return None, "missing answer"
    if isinstance(answer, bool) or not isinstance(answer, (str, int)):
        return None, "non-string answer"
    s = str(answer)
    if not s.strip():
        return None, "empty answer"
    return s, None


def _templated(prompt: str | list[dict], template: str) -> str | list[dict]:
    if template == "none":
        return prompt
    if isinstance(prompt, str):
        return _apply_template(prompt, template)
    # chat messages: wrap the last user message's content
    out = [dict(m) for m in prompt]
    for m in reversed(out):
        if m["role"] == "user":
            m["content"] = _apply_template(m["content"], template)
            break
    return out


def _prompt_key(prompt: str | list[dict]) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def _prompt_len(prompt: str | list[dict]) -> int:
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


# --------------------------------------------------------------------------- load_dataset


def _resolve(
    name_or_path: str, split: str | None
) -> tuple[DatasetEntry | None, Iterable[Any], str, str | None]:
    """(entry or None, items, path for reports, split used)."""
    entry = DATASETS.get(name_or_path)
    if entry is not None:
        if split is not None and entry.splits and split not in entry.splits:
            raise DataError(
                f"dataset {name_or_path!r} has no split {split!r}; splits: {list(entry.splits)}"
            )
        if split is not None and not entry.splits and not _accepts_split(entry.loader):
            raise DataError(f"dataset {name_or_path!r} takes no split (got {split!r})")
        return entry, entry(split), entry.path or f"<{_qualname(entry.loader)}>", split

    if name_or_path.startswith("hf:"):
        return None, *_hf_items(name_or_path[3:], split)

    path = Path(name_or_path).expanduser()
    if split is not None:
        raise DataError(f"{path}: split= only applies to registered and hf: data sets")
    if path.suffix.lower() not in _READERS or not path.is_file():
        known = ", ".join(sorted(DATASETS))
        if path.suffix.lower() in _READERS:
            what = f"no such data file: {path.resolve()}"
        else:
            what = f"unknown dataset {name_or_path!r} (not a registered name nor a .jsonl/.json/.parquet file)"
        raise DataError(f"{what}; registered data sets: {known}; or use hf:<dataset id>[:split]")
    return None, _read_file(path), str(path), None


def _hf_items(spec: str, split: str | None) -> tuple[Iterable[Any], str, str]:
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


def load_dataset(
    name_or_path: str,
    *,
    split: str | None = None,
    limit: int | None = None,
    on_bad: Literal["drop", "fail"] = "drop",
    template: Template | Literal["default"] | None = None,
    max_prompt_chars: int | None = None,
    scorer: str | None = None,
    dedup: bool | None = None,
    prompt_field: str | None = None,
    answer_field: str | None = None,
) -> tuple[list[Example], LoadReport]:
    """Load a registered data set, a local file or ``hf:<id>[:split]`` as Examples.

    name_or_path: registry name (see ``dataset_names()``), a ``.jsonl`` / ``.json`` /
        ``.parquet`` path, or ``hf:<dataset id>[:split]``.
    split: for registered / hf data sets; the shipped ones each hold one split.
    limit: keep only the first ``limit`` valid examples (file order).
    on_bad: ``"drop"`` bad rows (counted in the report) or ``"fail"`` with a DataError
        naming the path and row.
    template: ``"dapo"`` | ``"boxed"`` | ``"none"``; None or ``"default"`` = the data
        set's default (files: ``"none"``).
    max_prompt_chars: rows whose final prompt (after templating) is longer are bad.
    scorer: ``"dapo"`` | ``"math_verify"``; None = follows the template (see module doc).
    dedup: drop rows whose final prompt repeats an earlier one; None = data set default
        (only dapo-math-17k).
    prompt_field / answer_field: column names (dotted for nested) for mapping rows.

    Returns (examples, report). Bad rows are never kept silently.
    """
    if on_bad not in ("drop", "fail"):
        raise ValueError(f"on_bad={on_bad!r}; allowed: 'drop', 'fail'")
    if template == "default":
        template = None
    if template is not None and template not in TEMPLATES:
        raise ValueError(f"template={template!r}; allowed: {TEMPLATES}")
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"scorer={scorer!r}; allowed: {SCORERS}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit={limit!r} must be >= 0")
    if max_prompt_chars is not None and max_prompt_chars <= 0:
        raise ValueError(f"max_prompt_chars={max_prompt_chars!r} must be > 0")

    if name_or_path not in DATASETS:
        _import_plugins()
    entry, items, where, _ = _resolve(name_or_path, split)

    tmpl = template or (entry.template if entry else "none")
    base_scorer = entry.scorer if entry else "dapo"
    scr = scorer or _TEMPLATE_SCORER.get(tmpl, base_scorer)
    do_dedup = dedup if dedup is not None else (entry.dedup if entry else False)
    source = name_or_path

    report = LoadReport(source=source, path=where, template=tmpl, scorer=scr, deduplicated=do_dedup)
    seen: set[str] = set()
    out: list[Example] = []

    def bad(i: int, reason: str) -> None:
        report.bad[reason] = report.bad.get(reason, 0) + 1
        if len(report.examples_of_bad) < _MAX_BAD_EXAMPLES:
            report.examples_of_bad.append(f"row {i}: {reason}")
        if on_bad == "fail":
            raise DataError(f"{where}: row {i}: {reason}")

    for i, item in enumerate(_generic_rows(items, where, prompt_field, answer_field)):
        report.total += 1
        if isinstance(item, Example):
            raw_prompt, raw_answer, meta, reason = item.prompt, item.answer, item.meta, None
            # a generated Example keeps its own scorer unless a template or scorer is asked for
            ex_scorer = scorer or _TEMPLATE_SCORER.get(template or "", item.scorer)
            index, ex_source = item.index, item.source or source
        else:
            raw_prompt, raw_answer, meta, reason = item.prompt, item.answer, item.meta, item.bad
            index, ex_scorer, ex_source = i, scr, source
        if reason is None:
            reason = _prompt_problem(raw_prompt)
        answer = None
        if reason is None:
            answer, reason = _answer_or_problem(raw_answer)
        prompt: Any = None
        if reason is None:
            prompt = _templated(raw_prompt, tmpl)
            if max_prompt_chars is not None and _prompt_len(prompt) > max_prompt_chars:
                reason = "prompt too long"
        if reason is not None:
            bad(i, reason)
            continue
        key = _prompt_key(prompt)
        if key in seen:
            report.duplicates += 1
            if do_dedup:
                continue
        seen.add(key)
        if limit is not None and len(out) >= limit:
            report.limited += 1
            continue
        out.append(
            Example(prompt=prompt, answer=answer, source=ex_source, index=index,
                    scorer=ex_scorer, meta=dict(meta or {}))
        )
    report.kept = len(out)
    return out, report


# --------------------------------------------------------------------------- rendering


_CHAT_ALIASES: dict[Any, Any] = {"yes": True, "no": False}  # config spells them so


def render_prompt(
    example: Example | str | list[dict],
    tokenizer: Any = None,
    use_chat_template: bool | Literal["auto"] = "auto",
) -> str:
    """The exact string fed to the policy.

    With a tokenizer that has a chat template and ``use_chat_template`` True or "auto":
    ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``,
    where a string prompt becomes ``[{"role": "user", "content": text}]``. Otherwise the raw
    text (chat messages without a template: their contents joined by a blank line).
    ``use_chat_template=True`` without a chat template is an error; ``"yes"`` / ``"no"``
    (the config's spelling) mean True / False.
    """
    use_chat_template = _CHAT_ALIASES.get(use_chat_template, use_chat_template)  # type: ignore[arg-type]
    prompt = example.prompt if isinstance(example, Example) else example
    has_template = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template not in (True, False, "auto"):
        raise ValueError(
            f"use_chat_template={use_chat_template!r}; allowed: True, False, 'auto', 'yes', 'no'"
        )
    if use_chat_template is True and not has_template:
        raise DataError(
            "use_chat_template=True but "
            + ("no tokenizer was given" if tokenizer is None else "the tokenizer has no chat_template")
        )
    if use_chat_template and has_template:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):  # pragma: no cover - defensive, depends on tokenizer
            raise DataError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(m["content"] for m in prompt)


def drop_long_prompts(
    examples: Sequence[Example],
    tokenizer: Any,
    max_tokens: int,
    *,
    use_chat_template: bool | str = "auto",
    on_bad: Literal["drop", "fail"] = "drop",
    report: LoadReport | None = None,
) -> list[Example]:
    """Keep examples whose rendered prompt is at most ``max_tokens`` tokens.

    Tokens are counted on ``render_prompt(ex, tokenizer, use_chat_template)`` with
    ``add_special_tokens=False`` (the chat template already holds its special tokens).
    Dropped rows are added to ``report`` under "prompt too long (tokens)"; with
    ``on_bad="fail"`` the first one raises a DataError naming its source and index.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens!r} must be > 0")
    texts = [render_prompt(ex, tokenizer, use_chat_template) for ex in examples]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    reason = "prompt too long (tokens)"
    kept: list[Example] = []
    for ex, toks in zip(examples, ids):
        if len(toks) <= max_tokens:
            kept.append(ex)
            continue
        msg = f"row {ex.index}: {reason} ({len(toks)} > {max_tokens})"
        if on_bad == "fail":
            raise DataError(f"{ex.source}: {msg}")
        if report is not None:
            report.bad[reason] = report.bad.get(reason, 0) + 1
            if len(report.examples_of_bad) < _MAX_BAD_EXAMPLES:
                report.examples_of_bad.append(msg)
    if report is not None:
        report.kept -= len(examples) - len(kept)
    return kept


# --------------------------------------------------------------------------- sampling


def _fingerprint(examples: Sequence[Example]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(_prompt_key(ex.prompt).encode("utf-8"))
        h.update(b"\x00")
        h.update(ex.answer.encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()[:16]


class PromptSampler:
    """Shuffled prompt batches, epoch by epoch, resumable exactly.

    Epoch ``e`` visits the examples in ``permutation(e)``, a shuffle seeded by
    (seed, e) only, so it can be rebuilt after a restart. ``cursor`` is the position in the
    current epoch. A batch never spans two epochs: when fewer than ``n`` examples remain,
    ``drop_last=True`` (default) skips them and starts the next epoch (every batch full, no
    prompt twice in a batch); ``drop_last=False`` returns the short tail batch first.

    ``state_dict()`` / ``load_state_dict()`` save and restore (epoch, cursor); after loading,
    the sequence of batches continues exactly as if never interrupted. The state also holds
    the seed, the number of examples and a fingerprint of the data, checked on load.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        batch_size: int,
        seed: int,
        *,
        drop_last: bool = True,
        epoch: int = 0,
        cursor: int = 0,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be > 0")
        if not examples:
            raise ValueError("PromptSampler needs at least one example")
        if drop_last and batch_size > len(examples):
            raise ValueError(
                f"batch_size={batch_size} > {len(examples)} examples with drop_last=True"
            )
        self.examples = list(examples)
        self.batch_size = batch_size
        self.seed = int(seed)
        self.drop_last = drop_last
        self._fingerprint = _fingerprint(self.examples)
        self._perm: list[int] = []
        self._perm_epoch = -1
        self.epoch = epoch
        self.cursor = cursor
        self._check_position()

    def __len__(self) -> int:
        """Full batches per epoch (plus one short one when drop_last=False)."""
        n, b = len(self.examples), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def permutation(self, epoch: int) -> list[int]:
        """Order of example indices in ``epoch``; depends only on (seed, epoch, len)."""
        perm = list(range(len(self.examples)))
        random.Random(f"dapo-prompt-sampler:{self.seed}:{epoch}").shuffle(perm)
        return perm

    def _current_perm(self) -> list[int]:
        if self._perm_epoch != self.epoch:
            self._perm, self._perm_epoch = self.permutation(self.epoch), self.epoch
        return self._perm

    def next_batch(self, n: int | None = None) -> list[Example]:
        """The next ``n`` (default ``batch_size``) examples; advances the cursor."""
        n = self.batch_size if n is None else n
        if n <= 0 or (self.drop_last and n > len(self.examples)):
            raise ValueError(f"batch of {n} from {len(self.examples)} examples (drop_last={self.drop_last})")
        remaining = len(self.examples) - self.cursor
        if remaining <= 0 or (self.drop_last and remaining < n):
            self.epoch, self.cursor = self.epoch + 1, 0
        perm = self._current_perm()
        idx = perm[self.cursor : self.cursor + n]
        self.cursor += len(idx)
        return [self.examples[i] for i in idx]

    def __iter__(self) -> Iterator[list[Example]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "seed": self.seed,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "num_examples": len(self.examples),
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Restore (epoch, cursor). ``strict`` also requires the same seed and data."""
        missing = {"epoch", "cursor"} - set(state)
        if missing:
            raise ValueError(f"sampler state lacks {sorted(missing)}")
        if strict:
            mine = self.state_dict()
            for key in ("seed", "num_examples", "fingerprint"):
                if key in state and state[key] != mine[key]:
                    raise ValueError(
                        f"sampler state {key}={state[key]!r} does not match this sampler's "
                        f"{mine[key]!r}; the data or seed changed (load with strict=False to ignore)"
                    )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._check_position()

    def _check_position(self) -> None:
        if self.epoch < 0 or not 0 <= self.cursor <= len(self.examples):
            raise ValueError(
                f"sampler position epoch={self.epoch} cursor={self.cursor} is out of range "
                f"for {len(self.examples)} examples"
            )


def batches(
    examples: Sequence[Example],
    batch_size: int,
    seed: int,
    epoch_start: int = 0,
    cursor: int = 0,
    *,
    drop_last: bool = True,
) -> Iterator[list[Example]]:
    """Endless batches from ``PromptSampler(...)`` starting at (epoch_start, cursor)."""
    return iter(PromptSampler(examples, batch_size, seed, drop_last=drop_last,
                              epoch=epoch_start, cursor=cursor))


# --------------------------------------------------------------------------- CLI


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m dapo.data", description="Load a data set and report.")
    p.add_argument("name", nargs="?", help="registry name, file path or hf:<id>[:split]")
    p.add_argument("--template", choices=TEMPLATES)
    p.add_argument("--limit", type=int)
    p.add_argument("--show", type=int, default=1, help="print this many examples")
    args = p.parse_args(argv)
    if not args.name:
        for name in dataset_names():
            e = DATASETS[name]
            scorer = _TEMPLATE_SCORER.get(e.template, e.scorer)
            print(f"{name:16s} template={e.template:5s} scorer={scorer:11s} {e.description}")
        return 0
    examples, report = load_dataset(args.name, template=args.template, limit=args.limit)
    print(report.summary())
    for ex in examples[: args.show]:
        print(json.dumps(dataclasses.asdict(ex), ensure_ascii=False, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
