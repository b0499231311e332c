"""Where each job of a sweep is: pending / running / requeued / done / failed, from ``sacct`` and the run
directories, or from the local job's process tree (which ``dapo sweep cancel`` stops whole)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dapo.sweep.records import _failure_reason, _latest_entries, _requeue_count, load_records
from dapo.sweep.spec import Job, Spec, expand

__all__ = ["SLURM_ACTIVE", "status", "process_tree", "catches_signal", "job_processes"]

# sacct (without --duplicates) shows a job's newest record: a requeued job reads REQUEUED, then
# PENDING / RUNNING again; PREEMPTED as the newest record means it was not requeued.
SLURM_ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                "SUSPENDED", "RESIZING", "STAGE_OUT", "SIGNALING"}
LOG_TAIL = 20
LOCAL_JOB_ENV = "DAPO_LOCAL_JOB"      # set for a local job's controller, so inherited by all its processes
UNKNOWN_AFTER_S = 600   # a job sacct still does not know this long after submission is gone


def _sacct(job_ids: list[str]) -> dict[str, str] | None:
    """job id → Slurm state (first word), from one sacct call; None when sacct cannot answer."""
    mains = sorted({j.split("_")[0] for j in job_ids if j})
    if not mains:
        return {}
    cmd = ["sacct", "-o", "JobID,State", "--parsable2"] + [a for m in mains for a in ("-j", m)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    out = proc.stdout
    from submitit.slurm.slurm import SlurmInfoWatcher
    info = SlurmInfoWatcher().read_info(out)
    return {k: (v.get("State") or "UNKNOWN").split()[0] for k, v in info.items()}


def _proc_children() -> dict[int, list[int]]:
    """parent pid → its child pids, from one pass over ``/proc``."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (by parent pid, whatever their session or process group),
    parents before children; [] when ``pid`` is gone."""
    if not Path(f"/proc/{int(pid)}").is_dir():
        return []
    children, out, todo = _proc_children(), [], [int(pid)]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def catches_signal(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (its ``SigCgt`` mask)."""
    try:
        line = next(l for l in Path(f"/proc/{int(pid)}/status").read_text().splitlines() if l.startswith("SigCgt:"))
        return bool(int(line.split()[1], 16) >> (int(signum) - 1) & 1)
    except (OSError, StopIteration, ValueError, IndexError):
        return False


def _local_alive(pid: str | None, needle: str = "submitit") -> bool:
    """A live (not zombie) process whose command line contains ``needle`` (pids get reused)."""
    try:
        cmd = Path(f"/proc/{int(pid)}/cmdline").read_bytes().decode(errors="replace")
        stat = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (OSError, ValueError, TypeError, IndexError):
        return False
    return needle in cmd and stat not in ("Z", "X")


def _local_tree(pid: str) -> list[int]:
    """A local job's processes under ``pid`` (its shell, the controller, the task, and whatever the task
    started: accelerate's ranks, vLLM's engine processes), leaves first; [] unless ``pid`` is a live
    submitit process (pids get reused)."""
    return process_tree(int(pid))[::-1] if _local_alive(pid) else []


def job_processes(tag: str | None) -> list[int]:
    """Live processes whose environment carries ``DAPO_LOCAL_JOB=<tag>``: every process of one local job,
    wherever it now hangs in the process tree (a killed parent's children are adopted elsewhere, and
    torchrun's ranks run in sessions of their own), since each inherits the variable from the controller."""
    if not tag:
        return []
    needle = f"{LOCAL_JOB_ENV}={tag}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0") and \
                    (d / "stat").read_text().rsplit(") ", 1)[1].split()[0] not in ("Z", "X"):
                out.append(int(d.name))
        except (OSError, IndexError):
            continue
    return out


def _kill_local(pid: str | None, tag: str | None = None, wait_s: float = 30.0) -> list[int]:
    """Stop a local job for good and wait until none of its processes is left (at most ``wait_s``):
    SIGKILL its tree under ``pid`` and every process carrying its ``tag`` (the run keeps its
    checkpoints). Returns the pids that were still alive when it was called.

    Signals to the top are not enough: the task ignores SIGTERM (submitit's handler), SIGINT is ignored
    by processes started from a background shell, and a killed shell or controller leaves its children
    running (the trainer went on while the launcher started the next job, issue 41).
    """
    found: list[int] = []
    end = time.monotonic() + wait_s
    while True:
        alive = list(dict.fromkeys((_local_tree(pid) if pid else []) + job_processes(tag)))
        found += [p for p in alive if p not in found]
        if not alive or time.monotonic() > end:
            return found
        for p in alive:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _log_path(sub: dict, job: dict) -> Path | None:
    if not job.get("job_id"):
        return None
    from submitit.core.utils import JobPaths
    return JobPaths(sub["folder"], job_id=str(job["job_id"]), task_id=0).stdout


def _tail(path: Path | None, n: int = LOG_TAIL) -> str:
    if path is None or not path.is_file():
        return f"(no log at {path})" if path else "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def _local_result(sub: dict, job: dict) -> str | None:
    """'success' / 'error' from submitit's result pickle of a local job, else None."""
    from submitit.core.utils import JobPaths, pickle_load
    p = JobPaths(sub["folder"], job_id=str(job["job_id"]), task_id=0).result_pickle
    try:
        return pickle_load(p)[0] if p.is_file() else None
    except Exception:  # noqa: BLE001 - a half-written pickle reads as "no result yet"
        return None


def _age_s(sub: dict) -> float:
    try:
        return (datetime.now(timezone.utc) - datetime.fromisoformat(sub["time"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return 0.0


def _run_state(job: Job, entry: tuple[dict, dict] | None, slurm: dict[str, str] | None) -> dict[str, Any]:
    """One status row: state, detail (Slurm state / reason), job id, requeues, progress, log."""
    row: dict[str, Any] = {"arm": job.arm, "seed": job.seed, "run_id": job.run_id, "job_id": None,
                           "state": "not submitted", "detail": "", "requeues": 0, "step": _progress(job),
                           "log": None, "log_tail": None}
    row["requeues"] = _requeue_count(job.run_dir / "requeues.json")
    failed = job.run_dir / "failed.json"
    if entry is not None:
        sub, ent = entry
        row["job_id"] = ent.get("job_id")
        row["log"] = str(_log_path(sub, ent)) if ent.get("job_id") else None
    if job.finished:
        row["state"] = "done"
        return row
    if entry is None:
        return row
    sub, ent = entry
    if sub["executor"] == "slurm" and slurm is None:
        row["state"], row["detail"] = "unknown", "sacct did not answer (is SLURM_CONF set?)"
    elif sub["executor"] == "slurm":
        st = slurm.get(str(ent["job_id"]), "")
        row["detail"] = st or "not in sacct yet"
        if not st and _age_s(sub) > UNKNOWN_AFTER_S:
            row["state"], row["detail"] = "failed", "unknown to sacct (was the cluster's state wiped?)"
        elif st in ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED") or (st == "PENDING" and row["requeues"]):
            row["state"] = "requeued"
        elif st in ("PENDING", ""):
            row["state"] = "pending"
        elif st in SLURM_ACTIVE:
            row["state"] = "running"
        else:  # a failure state, or COMPLETED without summary.json
            row["state"] = "failed"
            if st == "COMPLETED":
                row["detail"] = "COMPLETED without summary.json"
    else:
        res = _local_result(sub, ent) if ent.get("job_id") else None
        if ent.get("cancelled"):
            row["state"], row["detail"] = "failed", "cancelled before it started"
        elif not ent.get("job_id"):
            row["state"], row["detail"] = ("pending", "queued locally") if _local_alive(sub.get("waiter_pid"), "") \
                else ("failed", "never started (the submitting process ended)")
        elif _local_alive(ent["job_id"]):
            row["state"], row["detail"] = "running", f"pid {ent['job_id']}"
        elif left := job_processes(ent.get("tag")):
            row["state"], row["detail"] = "running", (f"pid {ent['job_id']} ended, but {len(left)} of its processes "
                                                      f"still run (pid {' '.join(map(str, left[:4]))}): "
                                                      f"dapo sweep cancel stops them")
        else:
            row["state"] = "failed"
            row["detail"] = {"error": "raised an exception", "success": "ended without summary.json"}.get(
                res, "process ended without a result")
    if failed.is_file() and row["state"] != "running":
        row["state"], row["detail"] = "failed", _failure_reason(failed)
    if row["state"] == "failed":
        row["log_tail"] = _tail(_log_path(sub, ent))
    return row


def _progress(job: Job) -> str:
    ckpts = sorted((job.run_dir / "checkpoints").glob("step_*")) if (job.run_dir / "checkpoints").is_dir() else []
    done = [p for p in ckpts if (p / "state.json").is_file()]
    last = int(done[-1].name.split("_")[1]) if done else 0
    return f"{last}/{job.config.train.rollout_steps}"


def status(spec: Spec, output: str | os.PathLike = "runs", jobs: list[Job] | None = None) -> list[dict[str, Any]]:
    """Per run of the sweep: state (pending / running / requeued / done / failed / not submitted) and more."""
    out = Path(output).resolve()
    jobs = jobs if jobs is not None else expand(spec, out)
    latest = _latest_entries(load_records(out, spec.name))
    slurm_ids = [str(e[1]["job_id"]) for e in latest.values() if e[0]["executor"] == "slurm" and e[1].get("job_id")]
    slurm = _sacct(slurm_ids)
    return [_run_state(j, latest.get(j.run_id), slurm) for j in jobs]
