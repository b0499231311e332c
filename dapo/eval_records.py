"""Per-sample evaluation records: the one format every evaluation writes (docs/METRICS.md).

An evaluation (step 8 of the loop) draws k samples for each of the P problems of each eval
set; besides the aggregates (``eval/<set>/avg_at_k``, ...) it keeps one record per sample,
so that problems can be resampled and the aggregates recomputed. A record is one JSON object
with the fields of :data:`FIELDS`:

    version      RECORD_VERSION of the writer
    set          the eval set, named as in the metrics ``eval/<set>/...``
    problem      stable problem id ``<source>:<row index>`` (``problem_id(dapo.data.run_data.example_key(ex))``)
    sample       0 .. k-1 within the problem
    step         rollout step of the evaluation (0: before training); null if the caller has none
    grad_step    gradient step of the evaluation; null if the caller has none
    seed         seed of the evaluation's generation call (each prompt's own seed derives from it)
    prompt_hash  the first 16 hex digits of sha256 over the prompt's token ids (``prompt_hash``)
    answer       the extracted answer (``dapo.data.rewards.extract_answer``), null if none
    correct      whether the problem's scorer scored the sample correct
    length       response tokens (the EOS token included when there is one)
    finished     true: ended by EOS; false: cut at the token cap
    response     the response text

A file holds one evaluation: gzipped JSON lines, ``eval-step<rollout step:05d>.jsonl.gz``, in
``<run dir>/eval_records/``. Plain Python (gzip + json); pandas only in :func:`records_frame`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["RECORD_VERSION", "FIELDS", "DIRNAME", "make_record", "problem_id", "prompt_hash", "records_path",
           "write_records", "read_records", "records_frame", "table_columns"]

RECORD_VERSION = 1
FIELDS = ("version", "set", "problem", "sample", "step", "grad_step", "seed", "prompt_hash", "answer",
          "correct", "length", "finished", "response")
"""The fields of a record, in the order they are written."""
DIRNAME = "eval_records"
"""The folder of a run dir (and of its MLflow artifacts) that holds the record files."""


def problem_id(key: Sequence[Any]) -> str:
    """``("arith-eval", 3)`` (an example key: source, row index) -> ``"arith-eval:3"``."""
    return ":".join(str(part) for part in key)


def prompt_hash(token_ids: Sequence[int]) -> str:
    """The first 16 hex digits of sha256 over the prompt's token ids, written ``1,2,3``."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def make_record(**fields: Any) -> dict[str, Any]:
    """One record: every field of :data:`FIELDS` but ``version`` (added) must be given, ``step`` and
    ``grad_step`` may be left out (null); any other name is refused."""
    fields = {"step": None, "grad_step": None, **fields, "version": RECORD_VERSION}
    if set(fields) != set(FIELDS):
        missing, extra = sorted(set(FIELDS) - set(fields)), sorted(set(fields) - set(FIELDS))
        raise ValueError(f"an eval record needs exactly the fields {FIELDS}: missing {missing}, unknown {extra}")
    return {name: fields[name] for name in FIELDS}


def records_path(run_dir: str | os.PathLike, rollout_step: int) -> Path:
    """``<run_dir>/eval_records/eval-step00005.jsonl.gz`` for rollout step 5."""
    return Path(run_dir) / DIRNAME / f"eval-step{int(rollout_step):05d}.jsonl.gz"


def write_records(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> Path:
    """Write ``records`` to ``path`` (gzipped JSON lines), atomically: into a temporary file beside
    it, then renamed over it, so ``path`` is never half written and a second write replaces the
    first. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                for rec in records:
                    gz.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of one file, in file order; a record of a newer format version is refused."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("version", RECORD_VERSION) > RECORD_VERSION:
                raise ValueError(f"{path}: line {n}: eval record version {rec['version']} is newer than "
                                 f"this reader's ({RECORD_VERSION})")
            out.append(rec)
    return out


def records_frame(paths: str | os.PathLike | Iterable[str | os.PathLike]):
    """A pandas DataFrame with one row per sample (columns :data:`FIELDS`) of the given record files;
    a folder (a run dir's ``eval_records/``) stands for its ``eval-step*.jsonl.gz`` files.

    ``answer`` is an object column that keeps None for "no answer" (pandas would read a missing
    string as NaN, which ``dapo.algo.cons_at_k`` would count as an answer)."""
    import pandas as pd
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("eval-step*.jsonl.gz")) if p.is_dir() else [p]
    rows = [rec for f in files for rec in read_records(f)]
    frame = pd.DataFrame(rows, columns=list(FIELDS))
    frame["answer"] = pd.Series([rec.get("answer") for rec in rows], dtype=object, index=frame.index)
    return frame


def table_columns(records: Sequence[dict[str, Any]], response_chars: int = 1000) -> dict[str, list]:
    """The records as columns for a table in the MLflow UI: every field, but of the response only its
    last ``response_chars`` characters (``response_tail``, where the answer is); the full text is in the file."""
    cols = {name: [rec[name] for rec in records] for name in FIELDS if name != "response"}
    cols["response_tail"] = [rec["response"][-response_chars:] for rec in records]
    return cols
