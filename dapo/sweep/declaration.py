"""Pre-registration as a record: what a sweep declares about its analysis, and when.

``dapo sweep submit`` calls :func:`declare` before it starts or queues any job. The declaration
holds what a reader must be able to check was fixed before the runs: the sweep's primary family
(the spec's ``family``, or ``"default"``: the rule of docs/STATISTICS.md for the sweep's kind), the
equivalence margins, the metric and its final value, the seeds, the stopping rule (looks and alpha
spending), every run id the full spec expands to (so the base experiment and every override are
pinned), the git commit and an absolute UTC time. It is written to::

    <output root>/sweeps/<name>/declarations/<UTC time>-<hash>.json

and its id rides on every run as the MLflow tag ``dapo.declaration`` (``logging.declaration``, which
the run id leaves out). A submission whose declared content is the latest record's makes no new
record; any change (a margin, the family, a seed, a look) makes a new one with its own time, and the
old ones are kept. The report (analysis.declared) derives its sentence about the declaration from
these records and the runs' absolute start and end times, never from a constant.

Standard library only, plus the spec; the one writer is :func:`declare`.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dapo.sweep.spec import Spec, arms, expand

__all__ = ["DECLARATION_VERSION", "declaration_content", "content_hash", "declarations_dir", "read_declarations",
           "declare"]

DECLARATION_VERSION = 1


def declaration_content(spec: Spec, run_ids: list[str]) -> dict[str, Any]:
    """What a sweep declares (no time, no commit): a pure function of the full spec and its run ids.

    ``run_ids``: the run ids of every job of the *full* spec (not a ``--seeds``/``--arms`` subset).
    """
    return {
        "sweep": spec.name,
        "kind": spec.kind,
        "metric": spec.metric,
        "final_k": spec.final_k,
        "family": [list(p) for p in spec.family] if spec.family else "default",
        "margins": dict(sorted(spec.margins.items())),
        "seeds": list(spec.seeds),
        "stopping": spec.stopping.to_dict() if spec.stopping else None,
        "arms": [a.name for a in arms(spec)],
        "run_ids": sorted(run_ids),
    }


def content_hash(content: dict[str, Any]) -> str:
    """sha256 of the content's canonical JSON (sorted keys): equal content, equal hash."""
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def declarations_dir(output: str | os.PathLike, sweep: str) -> Path:
    return Path(output) / "sweeps" / sweep / "declarations"


def read_declarations(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """Every declaration record in ``folder``, oldest first; [] when there is none. A record that does
    not parse is skipped (it was never published: :func:`declare` writes atomically)."""
    out = []
    for p in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and "time" in rec and "hash" in rec:
            out.append(rec)
    return sorted(out, key=lambda r: r["time"])


def declare(spec: Spec, output: str | os.PathLike, *, now: datetime | None = None,
            commit: str | None = None) -> tuple[dict[str, Any], bool]:
    """The declaration the spec's runs start under: the latest record if its content is the spec's,
    else a new record (written atomically before any job starts). Returns (record, is_new)."""
    run_ids = [j.run_id for j in expand(spec, output)]
    content = declaration_content(spec, run_ids)
    h = content_hash(content)
    folder = declarations_dir(output, spec.name)
    existing = read_declarations(folder)
    if existing and existing[-1]["hash"] == h:
        return existing[-1], False
    if commit is None:
        from dapo.tracking.tracker import git_commit
        commit = git_commit()
    t = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    rec_id = f"{t.strftime('%Y%m%dT%H%M%S.%fZ')}-{h[:12]}"
    record = {"version": DECLARATION_VERSION, "id": rec_id, "time": t.isoformat(timespec="microseconds"),
              "hash": h, "commit": commit, "spec": str(spec.path),
              "supersedes": existing[-1]["id"] if existing else None, "content": content}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{rec_id}.json.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, folder / f"{rec_id}.json")
    return record, True
