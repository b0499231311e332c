"""What one job of a sweep runs: the ``dapo train`` / ``accelerate launch`` command of a job, the sbatch
parameters and setup lines of a profile (pure builders), and :class:`RunJob`, the submitit job that runs it.

:class:`RunJob` is a ``submitit.helpers.Checkpointable``: on preemption or the time limit submitit calls its
``checkpoint()``, which resubmits it (the training loop resumes from the run directory's last checkpoint)
until ``max_requeues``, then fails clearly. The job only builds the Config and starts
``python -m dapo.train`` (under ``accelerate launch`` for several processes); it knows nothing about losses.

Shell safety: names that reach the sbatch script are checked against ``^[A-Za-z0-9._-]+$`` when the spec and
profile are loaded; everything else (setup words, env values, paths) goes through ``shlex.quote``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import submitit

from dapo.config import ConfigError, build_config, to_dict
from dapo.preflight import check_compile_toolchain, finished_summary
from dapo.sweep.cluster import ClusterProfile
from dapo.sweep.records import _now, _requeue_count, _write_json, _write_text
from dapo.sweep.spec import Job, Spec, arms
from dapo.sweep.state import catches_signal, process_tree

__all__ = ["RunJob", "accelerate_command", "train_command", "sbatch_parameters", "setup_lines", "run_launcher"]

EXPECT_CUDA_ENV = "DAPO_EXPECT_CUDA"   # dapo.dist.distributed.EXPECT_CUDA_ENV (that module imports torch)


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
