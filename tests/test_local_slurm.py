"""Smoke tests of the local Slurm cluster: sbatch + sacct, and a submitit round trip."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

try:  # tests/ is on sys.path (pytest's default rootdir-less import mode) ...
    from slurm_cluster import slurm_cluster, slurm_env  # noqa: F401  (fixtures)
except ImportError:  # ... or tests is a package
    from tests.slurm_cluster import slurm_cluster, slurm_env  # noqa: F401

pytestmark = pytest.mark.slurm

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def _sacct_state(cluster, job_id: str, timeout: float = 90) -> str:
    """Poll sacct until the job reaches a terminal state (sacct lags the job by ~1-2 s)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        out = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", check=False).stdout
        state = out.strip().split("\n")[0].split(" ")[0] if out.strip() else ""
        if state in TERMINAL:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {state!r} after {timeout}s\n{cluster.logs()}")


def _result(job, cluster, timeout: float = 120):
    """job.result() with a deadline (submitit's own wait has none)."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job.job_id} not done after {timeout}s: {job.state}\n{cluster.logs()}")
        time.sleep(0.5)
    return job.result()


def _square(x: int) -> int:
    return x * x


def test_sbatch_job_completes_and_sacct_reports_it(slurm_cluster, tmp_path: Path):
    out = tmp_path / "job.out"
    job_id = slurm_cluster.run(
        "sbatch", "--parsable", "-p", slurm_cluster.partition, "-o", str(out),
        "--wrap", "echo hello from $SLURM_JOB_ID",
    ).stdout.strip().split(";")[0]
    assert _sacct_state(slurm_cluster, job_id) == "COMPLETED"
    assert out.read_text().strip() == f"hello from {job_id}"


def test_submitit_round_trip_and_map_array(slurm_env, tmp_path: Path):
    submitit = pytest.importorskip("submitit")
    import cloudpickle

    # The job's python cannot import this test module by name; ship _square by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
        executor.update_parameters(timeout_min=5, slurm_partition=slurm_env.partition,
                                   cpus_per_task=1)
        job = executor.submit(_square, 7)
        assert _result(job, slurm_env) == 49

        jobs = executor.map_array(_square, [1, 2, 3])
        assert len(jobs) == 3
        assert [_result(j, slurm_env) for j in jobs] == [1, 4, 9]
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])

    # job.state comes from sacct and lags result() by a few seconds: poll it.
    for j in [job, *jobs]:
        assert _sacct_state(slurm_env, j.job_id) == "COMPLETED"


def _listening_inodes() -> dict[str, str]:
    """inode -> local address (hex ip:port) of every listening TCP socket."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found[fields[9]] = fields[1]
    return found


def test_servers_listen_on_loopback_only(slurm_cluster):
    listening = _listening_inodes()
    seen = {}
    for pid_file in sorted((slurm_cluster.base / "pids").glob("*.pid")):
        pid = pid_file.read_text().strip()
        try:
            links = [Path(f"/proc/{pid}/fd", fd).readlink() for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in map(str, links):
            if link.startswith("socket:[") and link[8:-1] in listening:
                seen.setdefault(pid_file.stem, []).append(listening[link[8:-1]])
    assert {"mariadbd", "slurmdbd", "slurmctld", "slurmd"} <= set(seen), seen
    for daemon, addrs in seen.items():
        for addr in addrs:
            ip = addr.split(":")[0]
            # 127.0.0.1 in /proc/net/tcp (little-endian hex), or ::ffff:127.0.0.1 / ::1 in tcp6
            assert ip in {"0100007F", "0000000000000000FFFF00000100007F",
                          "00000000000000000000000001000000"}, (daemon, addr)
