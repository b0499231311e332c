"""Submit and cancel a sweep's jobs through submitit (Slurm job array, or local); the sweep's names in one place.

    submit(spec, profile)  one Slurm job array (executor.batch()), at most max_concurrent at a time;
                           or submitit's LocalExecutor, the same jobs, in the foreground
    status(spec)           per run: pending / running / requeued / done / failed (dapo.sweep.state)
    cancel(spec)           scancel the sweep's unfinished jobs (a local job: its whole process tree)

What a job runs is :mod:`dapo.sweep.jobs` (the commands, :class:`RunJob`, requeued on preemption or the time
limit until ``max_requeues``); the submission records are :mod:`dapo.sweep.records`; where each job is,
:mod:`dapo.sweep.state`. A finished run (``summary.json``) is never run again; a resubmitted sweep skips
finished and still-queued runs and resumes the others.

Each submission is recorded in ``<output>/sweeps/<name>/submissions.json``; submitit's files
(pickles, one log per job) go to ``<output>/sweeps/<name>/submitit/<timestamp>/``.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import submitit

from dapo.config import ConfigError, to_dict
from dapo.store_checks import sqlite_path
from dapo.sweep.cluster import ClusterProfile, check_resources
from dapo.sweep.jobs import RunJob, _environ, _python, accelerate_command, sbatch_parameters, setup_lines, train_command
from dapo.sweep.records import _latest_entries, _now, _records_path, _save_record, _write_json, load_records
from dapo.sweep.spec import Job, Spec, expand
from dapo.sweep.state import LOCAL_JOB_ENV, SLURM_ACTIVE, _kill_local, status

__all__ = ["RunJob", "accelerate_command", "train_command", "sbatch_parameters", "setup_lines", "submit", "status",
           "cancel", "load_records", "SLURM_ACTIVE"]


def job_tracking_uri(job: Job, profile: ClusterProfile) -> str:
    """Where ``job`` logs: its ``logging.tracking_uri``, else the profile's, else the sqlite default."""
    from dapo.tracking.tracker import default_tracking_uri
    return job.config.logging.tracking_uri or profile.tracking_uri or default_tracking_uri(job.config.output_dir)


def _check_tracking(jobs: list[Job], profile: ClusterProfile) -> None:
    """Before anything is submitted: no URI holds a password, and every tracking server answers.

    Raises :class:`dapo.tracking.tracker.TrackingError` (one line, naming the URI without a password).
    """
    from dapo.tracking.tracker import TrackingError, check_server, refuse_password, use_credentials
    for uri in dict.fromkeys(job_tracking_uri(j, profile) for j in jobs):
        refuse_password(uri, "logging.tracking_uri" if uri != profile.tracking_uri else
                        f"cluster profile {profile.path or profile.name}")
        if uri.startswith("sqlite:") or "://" not in uri:
            continue
        if uri == profile.tracking_uri:
            use_credentials(uri, password_env=profile.tracking_password_env,
                            password_file=profile.tracking_password_file)
        try:
            check_server(uri)
        except TrackingError as exc:
            where = f"tracking_uri in {profile.path}" if uri == profile.tracking_uri and profile.path \
                else "logging.tracking_uri"
            raise TrackingError(f"{exc}; nothing was submitted. Start the server (python -m dapo.tracking.mlflow_server "
                                f"--help) or fix {where}") from None


def shared_sqlite_problem(spec: Spec, jobs: list[Job], profile: ClusterProfile, output: Path,
                          parallel: int) -> str | None:
    """A GPU sweep that runs more than one job at a time, logging to a sqlite store: what is wrong and how to
    start a tracking server instead (None when nothing is). sqlite on NFS or Lustre, where a cluster's
    output lives, is not safe for concurrent writers (docs/RELIABILITY.md); a CPU sweep on one machine is."""
    at_once = min(parallel, len(jobs))
    if not spec.resources.gpus_per_node or at_once <= 1:
        return None
    dbs = sorted({str(db) for j in jobs if (db := sqlite_path(job_tracking_uri(j, profile))) is not None})
    if not dbs:
        return None
    where = f"tracking_uri: http://<that host>:5000 in {profile.path}" if profile.path else \
        "--set logging.tracking_uri=http://<that host>:5000"
    return (f"{spec.path}: {at_once} GPU jobs at a time (max_concurrent {spec.max_concurrent}, profile "
            f"{profile.name} max_array_parallel {profile.max_array_parallel}) would write one sqlite MLflow store "
            f"({dbs[0]}{' and more' if len(dbs) > 1 else ''}), which is not safe on a shared file system; start a "
            f"tracking server on a host the nodes reach (python -m dapo.tracking.mlflow_server --root {output} --host "
            f"<that host's address> --port 5000) and set {where}, or set max_concurrent: 1; nothing was submitted")


def _init_tracking(jobs: list[Job], profile: ClusterProfile) -> None:
    """Create a new sqlite MLflow store (tables + experiment) once, before jobs race to do it.

    Jobs starting together on an empty sqlite file all run MLflow's table migrations and
    collide; an existing store or a tracking server needs nothing (the Tracker copes with
    two jobs creating the experiment at once).
    """
    seen = set()
    for j in jobs:
        uri = job_tracking_uri(j, profile)
        db = sqlite_path(uri)
        if db is None or db.exists() or uri in seen:
            continue
        seen.add(uri)
        from mlflow.tracking import MlflowClient

        from dapo.tracking.tracker import artifact_location, store_lock
        with store_lock(uri):   # the lock the trainer takes: another submit (or a job) may be creating it too
            client = MlflowClient(tracking_uri=uri)
            if client.get_experiment_by_name(j.config.logging.experiment) is None:
                try:
                    client.create_experiment(j.config.logging.experiment,
                                             artifact_location=artifact_location(uri, j.config.logging.experiment))
                except Exception:  # noqa: BLE001 - created concurrently
                    pass


def _make_job(spec: Spec, job: Job, profile: ClusterProfile) -> RunJob:
    for stale in ("requeues.json", "failed.json"):   # a new submission gets a fresh requeue budget
        (job.run_dir / stale).unlink(missing_ok=True)
    config = to_dict(job.config)
    if profile.tracking_uri and not config["logging"].get("tracking_uri"):   # the cluster's server
        config["logging"]["tracking_uri"] = profile.tracking_uri
    return RunJob(config, str(job.run_dir), max_requeues=spec.max_requeues, python=profile.python,
                  accelerate_config=str(job.accelerate_config) if job.accelerate_config else None,
                  gpus_per_node=spec.resources.gpus_per_node, signal_delay_s=profile.signal_delay_s)


def submit(spec: Spec, profile: ClusterProfile, output: str | os.PathLike = "runs", *, dry_run: bool = False,
           executor: str | None = None, log=print, declare=None, held: set[str] = frozenset()) -> dict[str, Any]:
    """Submit the sweep's unfinished runs; returns the submission record (``dry_run``: nothing submitted).

    ``held``: run ids an earlier snapshot holds (``dapo sweep next-look --with-snapshot``): skipped as done.

    ``declare``: called with the spec once every check has passed and before any job is created; returns
    the spec the jobs are made from (``dapo sweep submit`` writes the declaration record there).

    Slurm: one job array, returns at once. Local: runs the jobs here, seed-major (every arm's
    first seed, then every arm's second, ...), ``max_concurrent`` at a time, and returns when
    all have ended.
    """
    executor = executor or profile.executor
    check_resources(spec, profile)
    if executor == "local" and spec.resources.gpus_per_node:
        raise ConfigError(f"{spec.path}: resources.gpus_per_node = {spec.resources.gpus_per_node}: "
                          f"the local executor runs CPU jobs only (one process per run)")
    out = Path(output).resolve()
    jobs = expand(spec, out)
    rows = {r["run_id"]: r for r in status(spec, out, jobs)}
    todo, skipped = [], []
    for j in jobs:
        st = rows[j.run_id]["state"]
        if j.run_id in held and st != "done":
            skipped.append({"run_id": j.run_id, "arm": j.arm, "seed": j.seed, "reason": "in an earlier snapshot"})
        elif st == "done":
            skipped.append({"run_id": j.run_id, "arm": j.arm, "seed": j.seed, "reason": "finished"})
        elif st in ("pending", "running", "requeued", "unknown"):
            skipped.append({"run_id": j.run_id, "arm": j.arm, "seed": j.seed,
                            "reason": f"still {st} as job {rows[j.run_id]['job_id']}"})
        else:
            todo.append(j)
    if executor == "local":   # seed-major: every arm's first seed before any arm's second, so a sweep
        # stopped part-way has paired seeds for every arm, and the slots stay full (no per-seed waves)
        todo.sort(key=lambda j: spec.seeds.index(j.seed) if j.seed in spec.seeds else len(spec.seeds))
    params = sbatch_parameters(spec, profile)
    record = {"id": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ"), "time": _now(),
              "cluster": profile.name, "executor": executor, "spec": str(spec.path), "folder": None,
              "array_job_id": None, "set": spec.extra_overrides, "jobs": [], "skipped": skipped}
    for s in skipped:
        log(f"skip {s['arm']} seed {s['seed']} ({s['run_id']}): {s['reason']}")
    shared = shared_sqlite_problem(spec, todo, profile, out, params["array_parallelism"])
    if dry_run:
        if shared:
            log(f"warning: submitting would be refused: {shared}")
        from submitit.slurm.slurm import _make_sbatch_string
        folder = out / "sweeps" / spec.name / "submitit" / "<timestamp>"
        script = _make_sbatch_string(command=f"{_python(profile)} -u -m submitit.core._submit {shlex.quote(str(folder))}",
                                     folder=folder, map_count=max(len(todo), 1), **params)
        record["script"] = script
        record["jobs"] = [{"run_id": j.run_id, "arm": j.arm, "seed": j.seed, "run_dir": str(j.run_dir),
                           "job_id": None, "command": shlex.join(train_command(spec, j, profile))} for j in todo]
        return record
    if not todo:
        log("nothing to submit: every run is finished or still queued")
        return record
    if shared:   # before the declaration: a refused submission declares nothing
        raise ConfigError(shared)
    _check_tracking(todo, profile)   # likewise: no declaration when the tracking server does not answer
    if declare is not None:
        spec = declare(spec)
        todo = [dataclasses.replace(j, config=dataclasses.replace(
            j.config, logging=dataclasses.replace(j.config.logging, declaration=spec.declaration)))
            for j in todo]
    _init_tracking(todo, profile)
    folder = out / "sweeps" / spec.name / "submitit" / record["id"]
    record["folder"] = str(folder)
    path = _records_path(out, spec.name)
    save = lambda: _save_record(path, spec.name, record)  # noqa: E731
    entries = [{"run_id": j.run_id, "arm": j.arm, "seed": j.seed, "run_dir": str(j.run_dir), "job_id": None}
               for j in todo]
    record["jobs"] = entries
    if executor == "slurm":
        ex = submitit.SlurmExecutor(folder, max_num_timeout=spec.max_requeues, python=_python(profile))
        ex.update_parameters(**params)
        with ex.batch():
            sjobs = [ex.submit(_make_job(spec, j, profile)) for j in todo]
        for e, sj in zip(entries, sjobs):
            e["job_id"] = sj.job_id
        record["array_job_id"] = sjobs[0].job_id.split("_")[0]
        save()
        for j, e in zip(todo, entries):
            log(f"  {j.arm:<24} seed {j.seed:<3} {j.run_id}  job {e['job_id']}")
        log(f"submitted {len(sjobs)} jobs as Slurm job array {record['array_job_id']} (at most "
            f"{params['array_parallelism']} at a time); logs in {folder}")
        return record
    record["waiter_pid"] = str(os.getpid())
    save()
    stop = path.with_name("cancel-requested")
    stop.unlink(missing_ok=True)
    _run_local(spec, profile, params, folder, todo, entries, save, log, stop)
    return record


def _run_local(spec, profile, params, folder, todo, entries, save, log, stop: Path) -> None:
    """Run jobs with submitit's LocalExecutor, at most ``array_parallelism`` at once; wait for all.

    ``dapo sweep cancel`` (another process) creates ``stop``: start nothing more, stop what runs.
    """
    ex = submitit.LocalExecutor(folder, max_num_timeout=spec.max_requeues, python=_python(profile))
    ex.update_parameters(timeout_min=spec.resources.time_min, setup=params["setup"],
                         signal_delay_s=profile.signal_delay_s, stderr_to_stdout=True)
    cap = params["array_parallelism"]
    queue = list(zip(todo, entries))
    running: list = []
    try:
        while queue or running:
            if stop.exists():
                for _, e in queue:
                    e["cancelled"] = True
                save()
                log(f"cancel requested: {len(queue)} queued job(s) dropped, {len(running)} stopped")
                raise KeyboardInterrupt
            while queue and len(running) < cap:
                j, e = queue.pop(0)
                e["tag"] = f"{folder.name}.{j.run_id}"
                with _environ(LOCAL_JOB_ENV, e["tag"]):   # inherited by every process of the job
                    sj = ex.submit(_make_job(spec, j, profile))
                e["job_id"] = sj.job_id
                save()
                log(f"started {j.arm} seed {j.seed} ({j.run_id}) as local job {sj.job_id}")
                running.append((j, sj, e["tag"]))
            time.sleep(0.5)
            for j, sj, tag in [r for r in running if r[1].done()]:
                # the job's top process ended (done, or killed: `kill -9 <local job>`); whatever of it still
                # runs (the trainer, when only the shell was killed) is stopped before another job starts
                left = _kill_local(None, tag)
                running.remove((j, sj, tag))
                note = f" (its top process ended; {len(left)} of its processes were still running: stopped)" \
                    if left else ""
                log(f"ended {j.arm} seed {j.seed} ({j.run_id}): {'done' if j.finished else 'FAILED'}{note}")
    except KeyboardInterrupt:
        for j, sj, tag in running:
            _kill_local(sj.job_id, tag)
            _write_json(j.run_dir / "failed.json", {"reason": "cancelled", "time": _now()})
        if not stop.exists():
            raise


def cancel(spec: Spec, output: str | os.PathLike = "runs", log=print) -> list[str]:
    """Cancel the sweep's unfinished jobs (scancel; local: signal the job's controller). Returns job ids."""
    out = Path(output).resolve()
    records = load_records(out, spec.name)
    if not records["submissions"]:
        raise ConfigError(f"sweep {spec.name!r} was never submitted to {out} (no "
                          f"{_records_path(out, spec.name)}): nothing to cancel; check --output")
    rows = status(spec, out)
    latest = _latest_entries(records)
    slurm_ids, local_ids = [], []
    for r in rows:
        if r["state"] not in ("pending", "running", "requeued", "unknown") or not r["job_id"] \
                or r["run_id"] not in latest:
            continue
        (slurm_ids if latest[r["run_id"]][0]["executor"] == "slurm" else local_ids).append(str(r["job_id"]))
    if slurm_ids:
        proc = subprocess.run(["scancel", *slurm_ids], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"scancel {' '.join(slurm_ids)} failed: {proc.stderr.strip()}")
    if any(r["run_id"] in latest and latest[r["run_id"]][0]["executor"] == "local"
           and r["state"] in ("pending", "running") for r in rows):
        (_records_path(out, spec.name).with_name("cancel-requested")).touch()   # the local waiter stops
    for r in rows:
        if str(r["job_id"]) in local_ids:
            _kill_local(str(r["job_id"]), latest[r["run_id"]][1].get("tag"))
            _write_json(out / "runs" / r["run_id"] / "failed.json", {"reason": "cancelled", "time": _now()})
    log(f"cancelled {len(slurm_ids) + len(local_ids)} job(s): {' '.join(slurm_ids + local_ids) or '-'}")
    return slurm_ids + local_ids
