"""A sweep's submission records: ``<output>/sweeps/<name>/submissions.json`` (one entry per submission, its
jobs and their ids), written atomically under a lock; the requeue counts and failure reasons a job leaves in
its run directory; the latest entry of each run."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dapo.config import ConfigError
from dapo.file_lock import held_flock

__all__ = ["load_records"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data: Any) -> None:
    _write_text(path, json.dumps(data, indent=1, default=str))


def _write_text(path: Path, text: str) -> None:
    """Write ``path`` atomically (a temporary sibling, then rename), making its directory first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _records_path(output: Path, name: str) -> Path:
    return output / "sweeps" / name / "submissions.json"


def _read_record(path: Path, what: str) -> Any:
    """A JSON record file this package wrote; unreadable → one ConfigError naming it and what to do."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: {what} is not readable JSON ({type(exc).__name__}: {str(exc)[:120]}); "
                          f"move it aside (it is rebuilt from what runs next)") from None


def load_records(output: str | os.PathLike, name: str) -> dict:
    """``<output>/sweeps/<name>/submissions.json`` (empty record if none; a damaged one is a ConfigError)."""
    return _load_records_file(_records_path(Path(output).resolve(), name), name)


def _load_records_file(p: Path, name: str) -> dict:
    if not p.is_file():
        return {"sweep": name, "submissions": []}
    rec = _read_record(p, "the sweep's submission record")
    ok = isinstance(rec, dict) and isinstance(rec.get("submissions"), list) and all(
        isinstance(s, dict) and isinstance(s.get("jobs"), list) and isinstance(s.get("executor"), str)
        and all(isinstance(j, dict) and isinstance(j.get("run_id"), str) for j in s["jobs"])
        for s in rec["submissions"])
    if not ok:
        raise ConfigError(f"{p}: the sweep's submission record has an unexpected shape; move it aside "
                          f"(it is rebuilt from what runs next)")
    return rec


def _save_record(path: Path, name: str, record: dict) -> None:
    """This submission's ``record`` into the sweep's record file, replacing its earlier state (same id).
    Under a lock and re-read first: another ``dapo sweep submit`` of the same sweep (other arms or seeds,
    into the same output) may be saving its own record at the same time, and must not be overwritten."""
    with held_flock(path.with_name(".submissions.lock")):
        records = _load_records_file(path, name)
        subs = records["submissions"]
        at = next((i for i, s in enumerate(subs) if s.get("id") == record["id"]), None)
        if at is None:
            subs.append(record)
        else:
            subs[at] = record
        _write_json(path, records)


def _requeue_count(path: Path) -> int:
    """``requeues.json``'s count (0 when absent; a damaged file is a ConfigError)."""
    if not path.is_file():
        return 0
    data = _read_record(path, "the run's requeue count")
    if not isinstance(data, dict) or not isinstance(data.get("count"), int):
        raise ConfigError(f"{path}: expected {{\"count\": N}}; move it aside")
    return data["count"]


def _failure_reason(path: Path) -> str:
    """``failed.json``'s reason (a damaged file still marks the run failed)."""
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["reason"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return f"failed ({path.name} is damaged)"


def _latest_entries(records: dict) -> dict[str, tuple[dict, dict]]:
    """run_id → (submission, job entry) of the newest submission that ran it."""
    out: dict[str, tuple[dict, dict]] = {}
    for sub in records["submissions"]:
        for j in sub["jobs"]:
            out[j["run_id"]] = (sub, j)
    return out
