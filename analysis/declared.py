"""What a report may say about its declaration: derived from the records, never a constant.

``dapo sweep submit`` writes a declaration record (dapo.sweep.declaration) before any job starts; a
snapshot keeps the records (``meta.json: declarations``) and each run's absolute start and end time
(``meta.json: run_times``). :func:`declaration_sentence` turns those facts into the report's one
sentence: "declared at T, before the first run started (T0)", "declared at T, after N runs had
finished", or "no declaration record". The words "declared before" appear only where the times say
so. The same for the margins and the stopping rule, which may have been declared later than the
family. Pure: records and times in, text out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["declaration_facts", "declaration_sentence", "NO_RECORD"]

NO_RECORD = ("**Declaration: no declaration record.** The snapshot holds no record of when the primary family, "
             "the margins or the seeds were chosen, so nothing here shows that they were fixed before the runs "
             "were seen; read every verdict below with that in mind.")


def _t(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def _short(iso: str) -> str:
    return _t(iso).strftime("%Y-%m-%d %H:%M UTC")


def _first_with(records: list[dict], key: str) -> dict:
    """The earliest record from which ``content[key]`` has had its latest value without a change."""
    latest = records[-1]["content"].get(key)
    first = records[-1]
    for rec in reversed(records):
        if rec["content"].get(key) != latest:
            break
        first = rec
    return first


def declaration_facts(records: list[dict], run_times: dict[str, dict], run_ids: list[str]) -> dict[str, Any]:
    """The facts the sentence is made of: for the latest record, and for the record since which the family,
    the margins and the stopping rule have held their values, how many of ``run_ids`` had started and
    finished before it; the first start (T0); how many runs have no recorded time."""
    times = [run_times.get(r) or {} for r in run_ids]
    starts = [_t(x.get("start")) for x in times]
    ends = [_t(x.get("end")) for x in times]
    known = [s for s in starts if s is not None]
    facts: dict[str, Any] = {"n_runs": len(run_ids), "n_untimed": sum(s is None for s in starts),
                             "first_start": min(known).isoformat() if known else None, "records": len(records)}
    if not records:
        return facts
    for key in ("family", "margins", "stopping"):
        rec = _first_with(records, key)
        t = _t(rec["time"])
        facts[key] = {"id": rec["id"], "time": rec["time"], "commit": rec.get("commit"),
                      "value": rec["content"].get(key),
                      "started_before": sum(s is not None and s < t for s in starts),
                      "finished_before": sum(e is not None and e < t for e in ends)}
    return facts


def _when(f: dict, first_start: str | None, n_untimed: int, n_runs: int) -> str:
    if n_untimed == n_runs:
        return f"at {_short(f['time'])}; the runs' start times are not recorded, so its order with the runs is unknown"
    if f["started_before"] == 0 and not n_untimed:
        return f"at {_short(f['time'])}, before the first run started ({_short(first_start)})"
    if f["finished_before"]:
        return (f"at {_short(f['time'])}, after {f['finished_before']} of the {n_runs} runs had finished "
                f"({f['started_before']} had started)")
    if f["started_before"]:
        return f"at {_short(f['time'])}, after {f['started_before']} of the {n_runs} runs had started (none finished)"
    return (f"at {_short(f['time'])}, before every run whose start is recorded ({n_untimed} of {n_runs} runs have "
            f"no recorded time)")


def declaration_sentence(records: list[dict], run_times: dict[str, dict], run_ids: list[str]) -> str:
    """The report's paragraph about the declaration (see the module docstring)."""
    if not records:
        return NO_RECORD
    f = declaration_facts(records, run_times, run_ids)
    latest = records[-1]
    fam = f["family"]
    before = all(f[k]["started_before"] == 0 for k in ("family", "margins", "stopping")) and not f["n_untimed"]
    head = "**Declared before the runs.**" if before else "**Declaration.**"
    parts = [f"{head} The primary family was declared {_when(fam, f['first_start'], f['n_untimed'], f['n_runs'])} "
             f"(record `{fam['id']}`, commit {str(fam.get('commit') or '?')[:12]})."]
    for key, what in (("margins", "equivalence margins"), ("stopping", "stopping rule")):
        g = f[key]
        if g["value"] in (None, {}, []):
            continue
        if g["id"] == fam["id"]:
            parts.append(f"Its {what} are in the same record." if key == "margins" else
                         f"Its {what} is in the same record.")
        else:
            parts.append(f"The {what} {'were' if key == 'margins' else 'was'} last changed "
                         f"{_when(g, f['first_start'], f['n_untimed'], f['n_runs'])} (record `{g['id']}`).")
    if len(records) > 1:
        parts.append(f"{len(records)} declaration records in all (the first at {_short(records[0]['time'])}); "
                     f"the report uses the latest, `{latest['id']}`.")
    return " ".join(parts)
