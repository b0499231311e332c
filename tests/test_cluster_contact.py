"""The process and file-system side of a first cluster run (issue 38, defects 2-6 and the checkpoint fsync
waste; issue 41, item 3): preemption reaching torchrun's ranks, a killed local job leaving nothing behind,
the example profile's environment, the compiled-engine toolchain check, locks on file systems without
them, a shared sqlite store under concurrent jobs, and who makes a sharded checkpoint durable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dapo.sweep import jobs as sweep_jobs, state as sweep_state

REPO = Path(__file__).resolve().parents[1]


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


# =========================================================================== sharded checkpoint: fsync once
def test_a_sharded_checkpoint_fsyncs_each_file_once_dcp_its_shards_each_rank_its_own(tmp_path, monkeypatch):
    """DCP's FileSystemWriter (sync_files=True) fsyncs every shard file and .metadata; rank 0's publish
    used to open and fsync every rank's files again (393 GB at 32B, serially, while the other ranks wait).
    Now each file of the published checkpoint is fsynced exactly once, before the rename that publishes it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dapo.train.checkpoint import SHARDS, save_checkpoint
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(_fd_path(fd))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        final = save_checkpoint(tmp_path / "run", 1, model=model, optimizer=opt, scheduler=None,
                                state={"rollout_step": 1})
    finally:
        dist.destroy_process_group()
    tmp_prefix = str(tmp_path / "run" / "checkpoints" / ".tmp_step_000001_")
    files = [f.relative_to(final).as_posix() for f in final.rglob("*") if f.is_file()]
    assert any(f.startswith(f"{SHARDS}/") and f.endswith(".distcp") for f in files), files
    assert f"{SHARDS}/.metadata" in files and "rng_rank0.pt" in files and "state.json" in files
    per_file: dict[str, int] = {}
    for p in synced:
        if p.startswith(tmp_prefix):                   # the temporary directory, before the publish
            rel = p[len(tmp_prefix):].split("/", 1)[1].replace(".metadata.tmp", ".metadata")   # DCP renames it
            per_file[rel] = per_file.get(rel, 0) + 1
    assert per_file == {f: 1 for f in files}, per_file


# =========================================================================== preemption reaches torchrun's ranks
_TORCHRUN_RANK = """
import datetime, os, pathlib, sys, time
import torch.distributed as dist
from dapo.dist.preemption import StepBoundarySignal
out, rank, world = pathlib.Path(sys.argv[1]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
sig = StepBoundarySignal().install()
try:
    for r in range(1, 2000):
        (out / f"step{rank}").write_text(str(r))
        time.sleep(0.2)                                  # a rollout step
        if sig.pending(world):                           # an all-reduce: every rank stops at the same step
            (out / f"checkpoint{rank}").write_text(str(r))
            sig.hand_over()
except SystemExit as e:
    (out / f"exit{rank}").write_text(str(e.code))
    raise
"""


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(cond, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_usr2_reaches_the_ranks_that_torchrun_starts_in_sessions_of_their_own(tmp_path):
    """A real `torchrun` (what `accelerate launch` runs) with 2 gloo ranks, started as run_launcher starts it
    (a session of its own, USR2 ignored). Its agent puts every worker in a new session, so the old
    `os.killpg(launcher, USR2)` never reached them and the job waited signal_delay_s - 30 s for nothing.
    on_preempt immediate: RunJob.checkpoint requeues at once and leaves the ranks alone (the requeue ends them);
    step_boundary: every rank gets USR2, they stop at the same step, checkpoint, exit 75, and the wait ends."""
    from dapo.dist.preemption import PREEMPTED_EXIT
    from dapo.sweep import launcher
    script = tmp_path / "rank.py"
    script.write_text(_TORCHRUN_RANK)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(script), str(tmp_path)]
    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=sweep_jobs._ignore_usr2, env=env,
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "torchrun.log").open("w"))
    try:
        _wait_for(lambda: (tmp_path / "step0").exists() and (tmp_path / "step1").exists(), 90, "both ranks' first step")
        ranks = [p for p in sweep_state.process_tree(proc.pid) if sweep_state.catches_signal(p, signal.SIGUSR2)]
        assert len(ranks) == 2 and all(os.getsid(p) not in (proc.pid, os.getsid(0)) for p in ranks)  # own sessions
        assert not sweep_state.catches_signal(proc.pid, signal.SIGUSR2)        # the agent ignores it

        immediate = launcher.RunJob({"checkpoint": {"on_preempt": "immediate"}}, str(tmp_path), max_requeues=1,
                                    signal_delay_s=60)
        immediate._proc = proc
        t = time.monotonic()
        immediate._let_the_ranks_checkpoint()
        assert time.monotonic() - t < 5 and immediate._proc is None         # not the 30 s wait
        assert not list(tmp_path.glob("checkpoint*")) and proc.poll() is None   # the ranks were left alone

        boundary = launcher.RunJob({"checkpoint": {"on_preempt": "step_boundary"}}, str(tmp_path), max_requeues=1,
                                   signal_delay_s=60)
        boundary._proc = proc
        t = time.monotonic()
        boundary._let_the_ranks_checkpoint()
        waited = time.monotonic() - t
        assert [(tmp_path / f"exit{r}").read_text() for r in (0, 1)] == [str(PREEMPTED_EXIT)] * 2
        assert (tmp_path / "checkpoint0").read_text() == (tmp_path / "checkpoint1").read_text()   # the same step
        assert waited < 25, waited                                          # back when torchrun ended, not at 30 s
    finally:
        for p in reversed(sweep_state.process_tree(proc.pid)):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(30)


# =========================================================================== a killed local job leaves nothing
_TRAINER = """
import os, pathlib, subprocess, sys, time
out = pathlib.Path(sys.argv[1])
# the trainer in a session of its own (as torchrun starts its ranks): a signal to the job's group misses it
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
(out / f"trainer.{os.environ['SUBMITIT_LOCAL_JOB_ID']}").write_text(str(child.pid))
child.wait()
"""


@pytest.mark.slow
def test_killing_the_printed_local_job_or_cancelling_the_sweep_leaves_no_trainer_running(tmp_path, monkeypatch):
    """`kill -9 <local job N>` (the id `dapo sweep submit` prints) killed only the shell wrapper: the trainer
    went on, the launcher recorded FAILED and started the next job, so two trained at once under
    max_concurrent 1 (issue 41). Now the launcher stops every process of the ended job (each carries the
    job's DAPO_LOCAL_JOB tag) before it says so and starts the next; `dapo sweep cancel` leaves nothing."""
    import functools
    import threading

    from dapo.sweep import launcher
    from dapo.sweep.cluster import load_profile
    from dapo.sweep.spec import load_spec
    from tests.test_sweep import write_spec
    spec = load_spec(write_spec(tmp_path, seeds=[0], max_concurrent=1))          # 2 arms x 1 seed
    out, logs = tmp_path / "out", []
    fake = functools.partial(subprocess.call, [sys.executable, "-c", _TRAINER, str(tmp_path)])
    monkeypatch.setattr(launcher, "_make_job", lambda spec, job, profile: fake)
    monkeypatch.setattr(launcher, "_init_tracking", lambda jobs, profile: None)   # no store needed
    alive = lambda pid: sweep_state._local_alive(str(pid), "")                        # noqa: E731 (a zombie is dead)
    trainers: list[int] = []

    def started(n: int) -> tuple[int, int]:
        _wait_for(lambda: sum("as local job" in l for l in logs) >= n, 60, f"job {n} to start")
        job_id = int([l for l in logs if "as local job" in l][n - 1].rsplit(" ", 1)[1])
        f = tmp_path / f"trainer.{job_id}"
        _wait_for(f.exists, 60, f"job {n}'s trainer")
        trainers.append(int(f.read_text()))
        return job_id, trainers[-1]
    thread = threading.Thread(target=launcher.submit, args=(spec, load_profile("local"), out),
                              kwargs={"log": logs.append}, daemon=True)
    thread.start()
    try:
        job1, trainer1 = started(1)
        os.kill(job1, signal.SIGKILL)                                   # the printed id
        _wait_for(lambda: any(l.startswith("ended") for l in logs), 60, "the launcher to notice")
        assert not alive(trainer1), logs                                # stopped before the next job starts
        ended = next(l for l in logs if l.startswith("ended"))
        assert "FAILED" in ended and "of its processes were still running: stopped" in ended, ended
        job2, trainer2 = started(2)
        assert alive(trainer2)
        launcher.cancel(spec, out, log=logs.append)
        assert not alive(trainer2) and not sweep_state.job_processes(
            launcher.load_records(out, spec.name)["submissions"][-1]["jobs"][1]["tag"])
        thread.join(30)
        assert not thread.is_alive()
    finally:
        for pid in trainers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# =========================================================================== the example profile's environment
def test_the_example_gpu_profile_loads_no_cuda_or_nccl_module_and_keeps_compile_caches_node_local():
    """A module that sets LD_LIBRARY_PATH can put an older libnccl.so.2 before the one the pip wheels bring,
    and `import torch` fails (docs/SCALING.md). The template users copy loads no such module and sets no
    library path; vLLM's and Triton's compile caches go to node-local disk, not the shared home."""
    from dapo.sweep.cluster import load_profile
    from dapo.sweep.launcher import setup_lines
    prof = load_profile("example-gpu-cluster")
    lines = setup_lines(prof)
    assert not [l for l in lines if l.split()[:1] == ["module"] and any(
        w in l.lower() for w in ("cuda", "nccl", "cudnn", "purge"))], lines
    assert not {"LD_LIBRARY_PATH", "LD_PRELOAD"} & set(prof.env)
    for key in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert prof.env[key].startswith("/tmp/"), (key, prof.env[key])         # node-local, not /shared or ~
        assert f"export {key}={prof.env[key]}" in lines


# =========================================================================== vLLM's compiled CUDA path: the toolchain
def _vllm_cfg(tmp_path, *overrides: str):
    from dapo.config import load_config
    if not any(o.startswith("rollout.engine=") for o in overrides):
        overrides = ("rollout.engine=vllm", *overrides)
    return load_config(REPO / "experiments" / "tiny-random-smoke.yaml", [f"output_dir={tmp_path}", *overrides])


def test_the_compile_toolchain_is_checked_only_where_vllm_compiles_and_names_the_fallback(tmp_path, monkeypatch):
    from dapo.preflight import ToolchainError, check_compile_toolchain, toolchain_problem
    monkeypatch.delenv("CC", raising=False)
    nothing = lambda name: None                                                  # noqa: E731
    problem = toolchain_problem(nothing, str(tmp_path))
    assert "a C compiler ($CC unset, no gcc or clang on PATH)" in problem and "no Python.h in" in problem
    with pytest.raises(ToolchainError) as exc:
        check_compile_toolchain(_vllm_cfg(tmp_path), True, which=nothing, include_dir=str(tmp_path))
    msg = str(exc.value)
    assert "\n" not in msg and "rollout.enforce_eager=true" in msg and "C compiler" in msg and "Python's headers" in msg
    (tmp_path / "Python.h").write_text("")
    with pytest.raises(ToolchainError, match=r"lacks a C compiler \(\$CC unset.*rollout.enforce_eager=true"):
        check_compile_toolchain(_vllm_cfg(tmp_path), True, which=nothing, include_dir=str(tmp_path))
    gcc = lambda name: "/usr/bin/gcc" if name == "gcc" else None                 # noqa: E731
    check_compile_toolchain(_vllm_cfg(tmp_path), True, which=gcc, include_dir=str(tmp_path))    # both there
    monkeypatch.setenv("CC", "/opt/cc")                                          # $CC is what Triton takes first
    check_compile_toolchain(_vllm_cfg(tmp_path), True, which=lambda n: n if n == "/opt/cc" else None,
                            include_dir=str(tmp_path))
    # nothing compiles: eager on request, on CPU, or the transformers engine (the CUDA question is not even asked)
    never = lambda: pytest.fail("asked about CUDA")                              # noqa: E731
    for cfg, cuda in ((_vllm_cfg(tmp_path, "rollout.enforce_eager=true"), never), (_vllm_cfg(tmp_path), False),
                      (_vllm_cfg(tmp_path, "rollout.engine=hf"), never)):
        check_compile_toolchain(cfg, cuda, which=nothing, include_dir=str(tmp_path / "none"))


def test_a_job_without_the_toolchain_stops_at_its_start_with_one_line(tmp_path, monkeypatch, capsys):
    """Where a job starts: `dapo train` (every rank under accelerate runs it) prints one `error:` line and
    exits 1 before the run dir is touched; a sweep's RunJob on a GPU node raises before anything loads."""
    import shutil

    from dapo import cli
    from dapo.config import to_dict
    from dapo.preflight import ToolchainError
    from dapo.sweep import launcher
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(cli, "_cuda_available", lambda: True)
    rc = cli.train_main([str(REPO / "experiments" / "tiny-random-smoke.yaml"), "rollout.engine=vllm",
                         f"output_dir={tmp_path}", "--run-dir", str(tmp_path / "run")],
                        train_fn=lambda cfg, run_dir: pytest.fail("trained"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("error: rollout.engine = vllm on CUDA compiles"), err
    assert "rollout.enforce_eager=true" in err[0] and not (tmp_path / "run").exists()
    job = launcher.RunJob(to_dict(_vllm_cfg(tmp_path)), str(tmp_path / "run"), max_requeues=1, gpus_per_node=8)
    with pytest.raises(ToolchainError, match="rollout.enforce_eager=true"):
        job()
    assert not (tmp_path / "run").exists()


# =========================================================================== locks: busy vs no locks at all
def _failing(err: int, then_ok_after: int | None = None):
    """A lock call that fails with ``err`` (``then_ok_after`` times, then succeeds; None: always)."""
    calls = []

    def lock(fd, op, *a):
        calls.append(op)
        if then_ok_after is None or len(calls) <= then_ok_after:
            raise OSError(err, os.strerror(err))
    lock.calls = calls
    return lock


@pytest.mark.parametrize("err", ["ENOLCK", "ENOSYS", "EOPNOTSUPP"])
def test_a_file_system_without_locks_is_said_as_such_not_in_use(tmp_path, monkeypatch, err):
    """Lustre without -o flock, NFSv3 without lockd: every lock call fails with ENOLCK / ENOSYS / EOPNOTSUPP.
    That used to read "in use by a process that has not written its pid yet" (run dir) or a traceback (flock)."""
    import errno
    import fcntl

    from dapo.file_lock import NoLocksError, try_flock
    from dapo.run_dir import RunDirBusy, RunDirNoLocks, hold_run_dir
    code = getattr(errno, err)
    monkeypatch.setattr(fcntl, "lockf", _failing(code))
    monkeypatch.setattr(fcntl, "flock", _failing(code))
    with pytest.raises(RunDirNoLocks) as exc:
        with hold_run_dir(tmp_path / "run"):
            pass
    msg = str(exc.value)
    assert not isinstance(exc.value, RunDirBusy) and "in use" not in msg and "\n" not in msg
    name = errno.errorcode[code]                                         # EOPNOTSUPP is ENOTSUP on Linux
    assert f"does not support file locks ({name}" in msg and "run.lock" in msg and "-o flock" in msg
    with pytest.raises(NoLocksError, match=rf"x.lock: this file system does not support file locks \({name}"):
        try_flock(tmp_path / "x.lock")


@pytest.mark.parametrize("err", ["EAGAIN", "EACCES"])
def test_a_busy_lock_held_on_this_host_is_busy_at_once(tmp_path, monkeypatch, err):
    import errno
    import fcntl
    import socket

    from dapo.file_lock import try_flock
    from dapo.run_dir import RunDirBusy, hold_run_dir
    monkeypatch.setattr(fcntl, "lockf", _failing(getattr(errno, err)))
    monkeypatch.setattr(fcntl, "flock", _failing(getattr(errno, err)))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.lock").write_text(f"4242 {socket.gethostname()}\n")
    t = time.monotonic()
    with pytest.raises(RunDirBusy, match=r"is in use by pid 4242 on "):
        with hold_run_dir(tmp_path / "run", foreign_wait_s=30, poll_s=0.01):
            pass
    assert time.monotonic() - t < 5                                      # no wait: the holder is alive here
    assert try_flock(tmp_path / "x.lock") is None                         # busy, not an error


def test_a_holder_on_another_host_is_waited_for_a_bounded_time(tmp_path, monkeypatch):
    """After a node failure its POSIX lock can outlive it on the server for minutes: the requeued job on
    another node waits for it (one line), then takes it; a holder that stays is busy after the bound."""
    import errno
    import fcntl

    from dapo.run_dir import RunDirBusy, hold_run_dir
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.lock").write_text("4242 dead-node-07\n")
    lines: list[str] = []
    stale = _failing(errno.EAGAIN, then_ok_after=3)                       # the lock lapses on the 4th try
    monkeypatch.setattr(fcntl, "lockf", stale)
    with hold_run_dir(run, foreign_wait_s=30, poll_s=0.01, log=lines.append):
        assert (run / "run.lock").read_text().split()[0] == str(os.getpid())
    assert len(stale.calls) == 4 and len(lines) == 1
    assert "held by pid 4242 on 'dead-node-07', another host" in lines[0] and "waiting up to 30 s" in lines[0]
    (run / "run.lock").write_text("4242 dead-node-07\n")
    monkeypatch.setattr(fcntl, "lockf", _failing(errno.EAGAIN))
    t = time.monotonic()
    with pytest.raises(RunDirBusy, match=r"in use by pid 4242 on 'dead-node-07' .*still held after 1 s of waiting"):
        with hold_run_dir(run, foreign_wait_s=1, poll_s=0.05, log=lines.append):
            pass
    assert 1 <= time.monotonic() - t < 10


def test_dapo_train_and_sweep_submit_on_a_file_system_without_locks_say_so_in_one_line(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    from dapo import cli
    from dapo.commands import sweep
    from tests.test_sweep import write_spec
    monkeypatch.setattr(fcntl, "lockf", _failing(errno.ENOLCK))
    monkeypatch.setattr(fcntl, "flock", _failing(errno.ENOLCK))
    rc = cli.train_main([str(REPO / "experiments" / "tiny-random-smoke.yaml"), f"output_dir={tmp_path}",
                         "--run-dir", str(tmp_path / "run")], train_fn=lambda cfg, run_dir: pytest.fail("trained"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "run.lock: this file system does not support file locks (ENOLCK" in err[0], err
    rc = sweep.main(["submit", str(write_spec(tmp_path, seeds=[0])), "--output", str(tmp_path / "out")])
    err = [l for l in capsys.readouterr().err.strip().splitlines() if "Traceback" in l or l.startswith("error:")]
    assert rc == 1 and len(err) == 1 and "does not support file locks (ENOLCK" in err[0], err


# =========================================================================== several GPU jobs, one sqlite store
def test_a_gpu_sweep_running_jobs_together_on_a_sqlite_store_is_refused_with_the_server_command(tmp_path, capsys):
    """sweeps/table1.yaml runs 2 jobs of 16 nodes at a time; with the example profile (no tracking_uri) both
    would write <output>/mlruns.db on the cluster's shared file system. `dapo sweep submit` refuses in one
    line naming the command that starts a tracking server; --dry-run warns; a server URI passes this check."""
    from dapo.commands import sweep
    out = tmp_path / "out"
    args = ["submit", str(REPO / "sweeps" / "table1.yaml"), "--cluster", "example-gpu-cluster", "--output", str(out)]
    assert sweep.main(args) == 2
    err = [l for l in capsys.readouterr().err.strip().splitlines() if l.startswith("error") or "Traceback" in l]
    assert len(err) == 1 and err[0].startswith("error: ") and "2 GPU jobs at a time" in err[0], err
    assert f"sqlite MLflow store ({out / 'mlruns.db'})" in err[0]
    assert f"python -m dapo.tracking.mlflow_server --root {out} --host" in err[0] and "max_concurrent: 1" in err[0]
    assert not (out / "sweeps").exists()                                     # nothing submitted or declared
    assert sweep.main([*args, "--dry-run"]) == 0
    assert "warning: submitting would be refused: " in capsys.readouterr().out
    # a tracking server instead: this check passes (the next one finds no server answering: nothing submitted)
    assert sweep.main([*args, "--set", "logging.tracking_uri=http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "GPU jobs at a time" not in err and "http://127.0.0.1:9" in err
    assert not (out / "sweeps" / "table1" / "submissions.json").exists()
