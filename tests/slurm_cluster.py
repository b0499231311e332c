"""The local one-node Slurm cluster (slurm/local-cluster.sh) as a pytest fixture.

Use in a test module::

    from slurm_cluster import slurm_cluster, slurm_env  # noqa: F401  (fixtures)

    def test_x(slurm_cluster):          # session-scoped: started once, stopped at the end
        slurm_cluster.run("sbatch", "--wrap", "true")   # a client command with its env

    def test_y(slurm_env, tmp_path):    # also sets os.environ for this test (submitit)
        ex = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")

``slurm_cluster`` yields a :class:`SlurmCluster`: ``.env`` (``{"SLURM_CONF": ...}``; merge
into a subprocess env or os.environ), ``.partition`` (``"local"``), ``.conf_path``,
``.base``, ``.run(*argv)``, ``.logs()``. It skips when the cluster cannot run here (not
root, no apt-get) unless ``DAPO_SLURM_REQUIRED=1``; it stops the cluster at the end only
if it started it (``DAPO_SLURM_KEEP=1`` keeps it running).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "slurm" / "local-cluster.sh"
UNSUPPORTED = 4  # the script's exit status for "cannot run on this machine"


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    conf_path: Path
    partition: str
    base: Path
    env: dict[str, str]
    started_here: bool

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, sacct, ...) against this cluster."""
        return subprocess.run(
            list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
            check=check, timeout=timeout,
        )

    def logs(self) -> str:
        """The tail of every daemon log (for failure messages)."""
        return _script("logs", check=False).stdout


def _script(command: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{SCRIPT.name} {command} failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    return proc


def _export_value(stdout: str) -> Path:
    last = stdout.strip().splitlines()[-1]
    prefix = "export SLURM_CONF="
    if not last.startswith(prefix):
        raise RuntimeError(f"unexpected last line from {SCRIPT.name}: {last!r}")
    return Path(last[len(prefix):])


def start_cluster() -> SlurmCluster:
    """Start the cluster (or find it running); skip the tests if it cannot run here."""
    required = os.environ.get("DAPO_SLURM_REQUIRED") == "1"
    if not sys.platform.startswith("linux") and not required:
        pytest.skip("the local Slurm cluster needs Linux")
    was_running = _script("status", check=False).returncode == 0
    proc = _script("start", check=False)
    if proc.returncode == UNSUPPORTED and not required:
        pytest.skip(f"local Slurm cluster unavailable: {proc.stderr.strip().splitlines()[-1]}")
    if proc.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} start failed (exit {proc.returncode}):\n{proc.stderr}")
    conf = _export_value(proc.stdout)
    env = {"SLURM_CONF": str(conf)}
    return SlurmCluster(conf_path=conf, partition="local", base=conf.parent.parent, env=env,
                        started_here=not was_running)


def stop_cluster() -> None:
    _script("stop")


@pytest.fixture(scope="session")
def slurm_cluster():
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        if cluster.started_here and os.environ.get("DAPO_SLURM_KEEP") != "1":
            stop_cluster()


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch):
    """slurm_cluster, with its env also set in os.environ for this test (for submitit)."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster
