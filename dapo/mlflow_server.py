"""A local MLflow tracking server for sweeps: many jobs, one store, no sqlite lock fights.

    python -m dapo.mlflow_server [--root runs] [--port 5000]

starts ``mlflow server`` over ``<root>/mlflow.db`` (sqlite; artifacts in
``<root>/mlartifacts``), bound to **127.0.0.1 only**, waits until it answers, prints the
tracking URI and how to use it, and runs until Ctrl-C::

    dapo sweep submit sweeps/table1-mini.yaml --set logging.tracking_uri=http://127.0.0.1:5000

Only the server process touches the sqlite file, so any number of jobs can log at once.
Jobs on this machine (the local executor, the local test Slurm) reach it; jobs on other
nodes of a real cluster do not, on purpose: the server has no authentication. To serve
other machines pass ``--host <address>`` explicitly (a warning says what that exposes),
or give the jobs a database server URI instead.

From Python (tests, notebooks): ``with start_server(root) as srv: ... srv.uri ...``.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MlflowServer", "start_server", "free_port", "main"]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class MlflowServer:
    """A running ``mlflow server`` started by :func:`start_server` (its own process group)."""
    uri: str
    host: str
    port: int
    root: Path
    log_path: Path
    proc: subprocess.Popen

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pids(self) -> list[int]:
        """The server's processes: every process of the session it leads (uvicorn workers too)."""
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] not in ("Z", "X") and int(fields[3]) == self.proc.pid:   # field 6: session id
                out.append(int(d.name))
        return out

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left after ``timeout_s``."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "MlflowServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(root: str | os.PathLike, *, host: str = LOOPBACK, port: int = 0, workers: int = 1,
                 timeout_s: float = 180.0, python: str | None = None) -> MlflowServer:
    """Start ``mlflow server`` on ``host:port`` (0 = a free port) over ``<root>/mlflow.db``.

    Returns once ``/health`` answers; raises RuntimeError with the server log's tail if it
    exits or does not answer within ``timeout_s``. ``host`` other than loopback prints a
    warning: the server has no authentication.
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not _is_loopback(host):
        print(f"[mlflow-server] WARNING: listening on {host}: anyone who can reach this address can read "
              f"and change every run (the server has no authentication)", file=sys.stderr, flush=True)
    port = port or free_port(host if _is_loopback(host) else "")
    log_path = root / "mlflow-server.log"
    cmd = [python or sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port),
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "mlartifacts"), "--workers", str(workers)]
    # MLflow 3 also starts ~8 background job consumers (GenAI jobs); a sweep's store needs none
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=root, env=env)
    connect_host = LOOPBACK if host in ("0.0.0.0", "::", "") else host
    srv = MlflowServer(uri=f"http://{connect_host}:{port}", host=host, port=port, root=root,
                       log_path=log_path, proc=proc)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with status {proc.returncode}; see {log_path}:\n"
                               + _tail(log_path))
        try:
            with urllib.request.urlopen(f"{srv.uri}/health", timeout=2) as r:
                if r.status == 200:
                    return srv
        except OSError:
            pass
        if time.monotonic() > deadline:
            srv.stop()
            raise RuntimeError(f"mlflow server did not answer on {srv.uri} within {timeout_s:.0f}s; see "
                               f"{log_path}:\n" + _tail(log_path))
        time.sleep(0.5)


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dapo.mlflow_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="runs", help="directory of mlflow.db and mlartifacts/ (default: runs)")
    p.add_argument("--host", default=LOOPBACK,
                   help="address to listen on (default 127.0.0.1: this machine only; others expose the runs)")
    p.add_argument("--port", type=int, default=5000, help="port (0 = any free one; default 5000)")
    p.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    a = p.parse_args(argv)
    srv = start_server(a.root, host=a.host, port=a.port, workers=a.workers)
    print(f"MLflow server for sweeps at {srv.uri} (store {srv.root / 'mlflow.db'}, log {srv.log_path}).\n"
          f"Jobs on this machine log to it with:\n"
          f"  dapo sweep submit SPEC --set logging.tracking_uri={srv.uri}\n"
          f"  export MLFLOW_TRACKING_URI={srv.uri}   # for the analysis and the MLflow UI client\n"
          f"Ctrl-C stops it.", flush=True)
    try:
        while srv.alive():
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0 if srv.proc.returncode in (0, None, -signal.SIGTERM) else 1


if __name__ == "__main__":
    sys.exit(main())
