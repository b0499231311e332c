"""Submit, watch and cancel a sweep's jobs through submitit (Slurm job array, or local).

    submit(spec, profile)  one Slurm job array (executor.batch()), at most max_concurrent at a time;
                           or submitit's LocalExecutor, the same jobs, in the foreground
    status(spec)           per run: pending / running / requeued / done / failed (sacct + run dirs)
    cancel(spec)           scancel the sweep's unfinished jobs

Every job runs :class:`RunJob`, a ``submitit.helpers.Checkpointable``: on preemption or the
time limit submitit calls its ``checkpoint()``, which resubmits it (the training loop resumes
from the run directory's last checkpoint) until ``max_requeues``, then fails clearly.
A finished run (``summary.json``) is never run again; a resubmitted sweep skips finished and
still-queued runs and resumes the others.

Each submission is recorded in ``<output>/sweeps/<name>/submissions.json``; submitit's files
(pickles, one log per job) go to ``<output>/sweeps/<name>/submitit/<timestamp>/``.

Shell safety: names that reach the sbatch script are checked against ``^[A-Za-z0-9._-]+$``
when the spec and profile are loaded; everything else (setup words, env values, paths) goes
through ``shlex.quote``. The launcher knows nothing about losses: a job only builds the
Config and calls :func:`dapo.train.loop.train` (or ``accelerate launch -m dapo.train``).
"""

from __future__ import annotations

import dataclasses
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import submitit

from dapo.config import ConfigError, build_config, to_dict
from dapo.file_lock import held_flock
from dapo.preflight import check_compile_toolchain, finished_summary
from dapo.store_checks import sqlite_path
from dapo.sweep.cluster import ClusterProfile, check_resources
from dapo.sweep.spec import Job, Spec, arms, expand

__all__ = ["RunJob", "accelerate_command", "train_command", "sbatch_parameters", "setup_lines", "submit", "status",
           "cancel", "load_records", "SLURM_ACTIVE"]

# sacct (without --duplicates) shows a job's newest record: a requeued job reads REQUEUED, then
# PENDING / RUNNING again; PREEMPTED as the newest record means it was not requeued.
SLURM_ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                "SUSPENDED", "RESIZING", "STAGE_OUT", "SIGNALING"}
LOG_TAIL = 20
EXPECT_CUDA_ENV = "DAPO_EXPECT_CUDA"   # dapo.dist.distributed.EXPECT_CUDA_ENV (that module imports torch)
LOCAL_JOB_ENV = "DAPO_LOCAL_JOB"      # set for a local job's controller, so inherited by all its processes
UNKNOWN_AFTER_S = 600   # a job sacct still does not know this long after submission is gone


# =========================================================================== pure builders
def accelerate_command(*, python: str, config_path: str, run_dir: str, nodes: int, gpus_per_node: int,
                       machine_rank: int, main_ip: str, main_port: int, fsdp: bool,
                       accelerate_config: str | None = None, mixed_precision: str = "no") -> list[str]:
    """The ``accelerate launch`` argv that starts the training loop on one node of a job.

    ``num_processes`` = nodes × gpus_per_node (accelerate counts all machines),
    ``num_machines`` = nodes; ``--config_file`` is ``slurm/accelerate-fsdp.yaml`` when ``fsdp``
    or whatever ``launch.accelerate_config`` names. Accelerate only starts the processes (and
    exports RANK / WORLD_SIZE / MASTER_ADDR ...): with more than one, the loop shards the model
    with FSDP2 and runs one vLLM engine per rank itself (:mod:`dapo.dist.distributed`), whatever the file.
    """
    argv = [python, "-m", "accelerate.commands.launch",
            "--num_processes", str(nodes * gpus_per_node), "--num_machines", str(nodes),
            "--machine_rank", str(machine_rank), "--main_process_ip", main_ip,
            "--main_process_port", str(main_port), "--mixed_precision", mixed_precision]
    cfg_file = accelerate_config or (str(Path(__file__).resolve().parents[2] / "slurm" / "accelerate-fsdp.yaml")
                                     if fsdp else None)
    if cfg_file:
        argv += ["--config_file", cfg_file]
    elif nodes * gpus_per_node > 1:
        argv += ["--multi_gpu"]
    if nodes > 1:
        argv += ["--rdzv_backend", "static", "--same_network"]
    # the run dir is named by the run id, so only resource-only keys can differ from its config.yaml
    # (a resubmission with another --set train.threads=...): resume as a one-process job does
    return argv + ["-m", "dapo.train", "--allow-resource-change", config_path, "--run-dir", run_dir]


def _override_text(value: Any) -> str:
    """An override value as ``dapo train`` reads it back (:func:`dapo.config.parse_value`)."""
    from dapo.config import parse_value
    if isinstance(value, str) and parse_value(value) == value:
        return value
    return json.dumps(value)   # JSON is YAML flow: numbers, booleans, lists, mappings, quoted strings


def train_command(spec: Spec, job: Job, profile: ClusterProfile | None = None) -> list[str]:
    """The ``dapo train`` argv that runs ``job`` as its array task does: the spec's base experiment,
    base_overrides, the arm's overrides, the seed and the launcher's keys, in the job's run dir."""
    arm = next(a for a in arms(spec) if a.name == job.arm)
    ov: dict[str, Any] = {**spec.base_overrides, **arm.overrides, "train.seed": job.seed,
                          "logging.sweep": spec.name, "logging.arm": arm.name, "logging.experiment": spec.name,
                          "output_dir": job.config.output_dir}
    if profile is not None and profile.tracking_uri and not job.config.logging.tracking_uri:
        ov["logging.tracking_uri"] = profile.tracking_uri
    return ["dapo", "train", str(spec.base), *(f"{k}={_override_text(v)}" for k, v in ov.items()),
            "--run-dir", str(job.run_dir)]


def _mem(mem_gb: float) -> str:
    return f"{int(mem_gb)}GB" if float(mem_gb).is_integer() else f"{int(mem_gb * 1024)}MB"


def setup_lines(profile: ClusterProfile) -> list[str]:
    """The profile's setup commands (each word quoted: a simple command, no shell operators) and env exports.

    A profile's ``tracking_uri`` is exported as ``MLFLOW_TRACKING_URI`` and its password's *source*
    (a file or a variable name, never the password) as ``DAPO_TRACKING_PASSWORD_FILE`` / ``_ENV``,
    which :class:`dapo.tracking.tracker.Tracker` reads in the job.
    """
    from dapo.tracking.tracker import PASSWORD_ENV_VAR, PASSWORD_FILE_VAR
    lines = [" ".join(shlex.quote(w) for w in shlex.split(line)) for line in profile.setup]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in profile.env.items()]
    for var, value in (("MLFLOW_TRACKING_URI", profile.tracking_uri),
                       (PASSWORD_FILE_VAR, profile.tracking_password_file),
                       (PASSWORD_ENV_VAR, profile.tracking_password_env)):
        if value:
            lines.append(f"export {var}={shlex.quote(value)}")
    return lines


def sbatch_parameters(spec: Spec, profile: ClusterProfile) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one job of ``spec`` on ``profile`` (pure)."""
    r = spec.resources
    p: dict[str, Any] = {
        "job_name": f"dapo-{spec.name}", "comment": f"dapo-sweep.{spec.name}", "time": r.time_min,
        "nodes": r.nodes, "ntasks_per_node": 1, "cpus_per_task": r.cpus_per_task, "mem": _mem(r.mem_gb),
        "array_parallelism": min(spec.max_concurrent, profile.max_array_parallel),
        "signal_delay_s": profile.signal_delay_s, "stderr_to_stdout": True, "setup": setup_lines(profile)}
    if r.gpus_per_node:
        p["gpus_per_node"] = r.gpus_per_node
    for k in ("partition", "account", "qos", "constraint"):
        if getattr(profile, k):
            p[k] = getattr(profile, k)
    return p


def _python(profile: ClusterProfile) -> str:
    return shlex.quote(profile.python or sys.executable)


# =========================================================================== the job
class RunJob(submitit.helpers.Checkpointable):
    """One training run as a submitit job; requeued on preemption / time limit, bounded."""

    def __init__(self, config: dict, run_dir: str, *, max_requeues: int, python: str | None = None,
                 accelerate_config: str | None = None, gpus_per_node: int = 0, signal_delay_s: int = 120):
        self.config = config            # the resolved config as a plain dict (pickled to the job)
        self.run_dir = run_dir
        self.max_requeues = max_requeues
        self.python = python
        self.accelerate_config = accelerate_config   # launch.accelerate_config, absolute (Job.accelerate_config)
        self.gpus_per_node = gpus_per_node           # resources.gpus_per_node: the job must find CUDA
        self.signal_delay_s = signal_delay_s         # the profile's: USR2 comes this long before the limit

    def __call__(self) -> dict | None:
        run_dir = Path(self.run_dir)
        done = run_dir / "summary.json"
        if finished_summary(run_dir) is not None:   # finished by an earlier job: reuse, never rerun
            return finished_summary(run_dir)
        cfg = build_config(self.config, f"{run_dir}/job config")
        # vLLM's compiled CUDA path needs a C compiler and Python's headers here: say so before anything loads
        check_compile_toolchain(cfg, cuda=bool(getattr(self, "gpus_per_node", 0))
                                and os.environ.get(EXPECT_CUDA_ENV, "").strip() != "0")
        env = submitit.JobEnvironment()
        if getattr(self, "gpus_per_node", 0):   # no CUDA then is an error, not a CPU run (dapo.dist.distributed.check_cuda)
            os.environ.setdefault(EXPECT_CUDA_ENV, "1")   # (a profile's env may say 0)
        world = cfg.launch.num_nodes * cfg.launch.num_processes
        if env.global_rank == 0:
            _write_json(run_dir / "job.json", {"job_id": env.job_id, "host": env.hostname,
                                               "started": _now(), "world": world})
        if world == 1:
            from dapo.logs import route_engine_logs
            from dapo.train.loop import train
            route_engine_logs(run_dir)          # vLLM's start-up lines: <run dir>/engine.log, not the job log
            return train(cfg, run_dir, tags={"dapo.job_id": env.job_id})
        import yaml
        config_path = run_dir / f".launch-config.node{env.node}.yaml"   # every node: the run dir may not
        _write_text(config_path, yaml.safe_dump(to_dict(cfg), sort_keys=False))   # exist yet (rank 0 makes it)
        cmd = accelerate_command(
            python=self.python or sys.executable, config_path=str(config_path), run_dir=str(run_dir),
            nodes=cfg.launch.num_nodes, gpus_per_node=cfg.launch.num_processes, machine_rank=env.node,
            main_ip=env.hostnames[0], main_port=20000 + int(env.raw_job_id) % 20000, fsdp=cfg.launch.fsdp,
            accelerate_config=self._accelerate_config(cfg), mixed_precision=cfg.launch.mixed_precision)
        print("[dapo] " + shlex.join(cmd), flush=True)
        rc = run_launcher(cmd, self)
        if rc != 0:
            raise RuntimeError(f"accelerate launch exited with status {rc} (node {env.node}); the run resumes "
                               f"from its last checkpoint when the sweep is resubmitted")
        return json.loads(done.read_text()) if env.node == 0 and done.is_file() else None

    def _accelerate_config(self, cfg) -> str | None:
        """``launch.accelerate_config`` as resolved when the sweep was expanded (an absolute path: the
        job's cwd is wherever it was submitted from); it must still exist on this node."""
        path = getattr(self, "accelerate_config", None) or cfg.launch.accelerate_config
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"launch.accelerate_config = {path}: no such file on {os.uname().nodename} "
                              f"(cwd {Path.cwd()}); give a path every node can read")
        return path

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Preempted or out of time: requeue (the loop resumes from its checkpoint), at most max_requeues times.

        Runs inside submitit's USR2 handler, i.e. wherever the training loop happened to be.
        Out of budget it raises SystemExit rather than returning None: submitit would then
        raise an ordinary exception from the handler, which a retry ``except Exception`` in
        the loop can swallow (the job would go on training with no requeue left).
        """
        self._let_the_ranks_checkpoint()
        path = Path(self.run_dir) / "requeues.json"
        n = _requeue_count(path) + 1
        if n > self.max_requeues:
            reason = (f"preempted or timed out {n} times; max_requeues = {self.max_requeues} reached. "
                      f"The last checkpoint is kept: resubmit the sweep to continue.")
            _write_json(Path(self.run_dir) / "failed.json", {"reason": reason, "time": _now()})
            raise SystemExit(f"[dapo] giving up: {reason}")      # exit status 1: Slurm says FAILED
        _write_json(path, {"count": n, "time": _now()})
        print(f"[dapo] requeue {n}/{self.max_requeues}: the run resumes from its last checkpoint", flush=True)
        # submitit now runs `scontrol requeue` as a child of this process, and the requeue itself
        # sends SIGTERM to every process of the job: if that lands before scontrol has returned,
        # scontrol dies and the job FAILS instead of requeueing (seen on the local cluster). A
        # blocked signal stays blocked across fork/exec, so the child finishes; this process
        # exits right after (submitit's exit), so nothing here needs SIGTERM any more.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        return super().checkpoint(*args, **kwargs)

    def _let_the_ranks_checkpoint(self) -> None:
        """Several processes: before the requeue (which ends every process of the job), and only with
        ``checkpoint.on_preempt: step_boundary``, pass USR2 to the ranks and wait, at most
        ``signal_delay_s`` - 30 s, for them to write their checkpoint at the end of the rollout step and exit
        (``dapo.dist.preemption``). With ``immediate`` (the default) the ranks have no handler: requeue at once.

        The ranks are found by what they are, not by process group: torchrun's agent (``accelerate
        launch``) starts each worker in a session of its own, so a signal to the launcher's group never
        reached them. Every process under the launcher that catches USR2 (``/proc/<pid>/status``
        ``SigCgt``: the ranks' :class:`~dapo.dist.preemption.StepBoundarySignal`) gets it; the launcher and the
        agent ignore it. No such process (the ranks are still starting): requeue at once."""
        proc, self._proc = getattr(self, "_proc", None), None     # a Popen does not pickle (the requeue does)
        if proc is None:
            return
        try:
            if os.waitpid(proc.pid, os.WNOHANG)[0] != 0:
                return                                             # already gone
        except ChildProcessError:
            return
        mode = ((getattr(self, "config", None) or {}).get("checkpoint") or {}).get("on_preempt", "immediate")
        if mode != "step_boundary":
            print("[dapo] USR2: checkpoint.on_preempt = immediate: requeue now (the run resumes from its last "
                  "periodic checkpoint)", flush=True)
            return
        ranks = [p for p in process_tree(proc.pid) if catches_signal(p, signal.SIGUSR2)]
        if not ranks:
            print("[dapo] USR2: no rank listens for it yet (still starting): requeue now", flush=True)
            return
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
        wait_s = max(0.0, getattr(self, "signal_delay_s", 120) - 30.0)
        print(f"[dapo] USR2 passed to {len(ranks)} rank(s): they checkpoint at the end of their rollout step; "
              f"waiting up to {wait_s:.0f} s before the requeue", flush=True)
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:                        # os.waitpid, not proc.poll(): the interrupted main thread may hold
                if os.waitpid(proc.pid, os.WNOHANG)[0] != 0:      # the Popen's wait lock
                    return
            except ChildProcessError:
                return
            time.sleep(0.5)


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the ``with`` block (what a child started in it inherits)."""
    was = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = was


def _ignore_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def run_launcher(cmd: list[str], job: RunJob) -> int:
    """Run ``accelerate launch`` (``cmd``) for ``job``; its exit status.

    The launcher runs in a session of its own (so that :meth:`RunJob.checkpoint` can signal all its
    ranks) with USR2 ignored (``accelerate launch`` and torchrun's agent would die of it; each rank
    installs its own handler, ``dapo.dist.preemption``), and is waited for in short polls, so that
    submitit's USR2 handler, which interrupts this wait, can wait for the ranks itself.
    """
    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_ignore_usr2)
    job._proc = proc
    try:
        while proc.poll() is None:
            time.sleep(0.5)
    finally:
        job._proc = None
    return proc.returncode


# =========================================================================== records
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


# =========================================================================== state
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


# =========================================================================== submit / cancel
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
