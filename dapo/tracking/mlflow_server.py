"""An MLflow tracking server for sweeps: many jobs, one store, no sqlite lock fights.

    python -m dapo.tracking.mlflow_server [--root runs] [--port 5000]
    python -m dapo.tracking.mlflow_server --backend-store-uri postgresql://mlflow@db.lab:5432/mlflow \
        --password-file ~/.dapo/pg-password --artifacts-destination /shared/mlartifacts --port 5000

starts ``mlflow server`` over a backend store (default ``sqlite:///<root>/mlruns.db``; a
``postgresql://`` URI for a lab's database) with artifacts in ``--artifacts-destination``
(default ``<root>/mlartifacts``; served through the server, so jobs need no access to it),
bound to **127.0.0.1 only**, waits until it answers, prints the tracking URI jobs should use
(and the cluster-profile line that makes a sweep use it), and runs until Ctrl-C::

    dapo sweep submit sweeps/table1-mini.yaml --set logging.tracking_uri=http://127.0.0.1:5000

Only the server touches the store, so any number of jobs can log at once. The database
password never goes on a command line or into the URI: ``--password-file`` /
``--password-env`` name where it is, and the server process reads it as ``PGPASSWORD``
(a URI holding a password is refused). Jobs on this machine (the local executor, the
local test Slurm) reach the server; jobs on other nodes of a real cluster do not, on
purpose: the server has no authentication. To serve other machines pass ``--host
<address>`` explicitly (a warning says what that exposes), or give the jobs the database
URI itself (``tracking_uri: postgresql://...`` in the profile, see slurm/README.md).

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

from dapo.helptext import help_text
from dapo.tracking.tracker import TrackingError, credentials_env, read_password, redact, refuse_password

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
                 timeout_s: float = 180.0, python: str | None = None, backend_store_uri: str | None = None,
                 artifacts_destination: str | os.PathLike | None = None, password_env: str | None = None,
                 password_file: str | os.PathLike | None = None,
                 allowed_hosts: list[str] | None = None) -> MlflowServer:
    """Start ``mlflow server`` on ``host:port`` (0 = a free port) over ``backend_store_uri``.

    The default store is ``sqlite:///<root>/mlruns.db``, artifacts ``<root>/mlartifacts``; the
    server log is ``<root>/mlflow-server.log``. A store password comes from ``password_file``
    or the variable ``password_env`` and reaches the server only through its environment
    (``PGPASSWORD``); a URI holding one raises TrackingError. Returns once ``/health``
    answers (a new database is migrated before that); raises RuntimeError with the server
    log's tail if it exits or does not answer within ``timeout_s``. ``host`` other than
    loopback prints a warning (the server has no authentication) and lets requests name the
    server by ``allowed_hosts`` (default: that address, this host's names, localhost).
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    backend = backend_store_uri or f"sqlite:///{root / 'mlruns.db'}"
    refuse_password(backend, "--backend-store-uri")
    # MLflow 3 also starts ~8 background job consumers (GenAI jobs); a sweep's store needs none
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    pw = read_password(password_env=password_env, password_file=password_file, where="the backend store")
    if pw is not None:
        env.update(credentials_env(backend, pw))
    port = port or free_port(host if _is_loopback(host) else "")
    log_path = root / "mlflow-server.log"
    cmd = [python or sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port),
           "--backend-store-uri", backend,
           "--artifacts-destination", str(Path(artifacts_destination or root / "mlartifacts")),
           "--workers", str(workers)]
    if not _is_loopback(host):
        print(f"[mlflow-server] WARNING: listening on {host}: anyone who can reach this address can read "
              f"and change every run (the server has no authentication)", file=sys.stderr, flush=True)
        # MLflow answers only requests whose Host header it knows (DNS-rebinding protection)
        names = allowed_hosts or [n for h in dict.fromkeys([host, socket.gethostname(), socket.getfqdn(),
                                                            "localhost", LOOPBACK]) if h not in ("0.0.0.0", "::")
                                  for n in (h, f"{h}:{port}")]
        cmd += ["--allowed-hosts", ",".join(names)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=root, env=env)
    connect_host = LOOPBACK if host in ("0.0.0.0", "::", "") else host
    srv = MlflowServer(uri=f"http://{connect_host}:{port}", host=host, port=port, root=root,
                       log_path=log_path, proc=proc)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server over {redact(backend)} exited with status {proc.returncode}; "
                               f"see {log_path}:\n" + redact(_tail(log_path)))
        try:
            with urllib.request.urlopen(f"{srv.uri}/health", timeout=2) as r:
                if r.status == 200:
                    return srv
        except OSError:
            pass
        if time.monotonic() > deadline:
            srv.stop()
            raise RuntimeError(f"mlflow server did not answer on {srv.uri} within {timeout_s:.0f}s; see "
                               f"{log_path}:\n" + redact(_tail(log_path)))
        time.sleep(0.5)


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dapo.tracking.mlflow_server", description=help_text(__doc__))
    p.add_argument("--root", default="runs",
                   help="directory of the server log (and of mlruns.db / mlartifacts/ by default; default: runs)")
    p.add_argument("--backend-store-uri", metavar="URI",
                   help="where runs are stored: postgresql://USER@HOST:PORT/DB (no password in it) or "
                        "sqlite:///PATH (default: sqlite:///<root>/mlruns.db)")
    p.add_argument("--artifacts-destination", metavar="DIR", help="artifact root (default: <root>/mlartifacts)")
    pw = p.add_mutually_exclusive_group()
    pw.add_argument("--password-file", metavar="PATH", help="file whose first line is the store's password")
    pw.add_argument("--password-env", metavar="VAR", help="environment variable holding the store's password")
    p.add_argument("--host", default=LOOPBACK,
                   help="address to listen on (default 127.0.0.1: this machine only; others expose the runs)")
    p.add_argument("--port", type=int, default=5000, help="port (0 = any free one; default 5000)")
    p.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    p.add_argument("--allowed-hosts", metavar="H1,H2:PORT",
                   help="with --host: the names jobs use to reach the server (default: the address, this host's "
                        "names, localhost)")
    a = p.parse_args(argv)
    try:
        srv = start_server(a.root, host=a.host, port=a.port, workers=a.workers, backend_store_uri=a.backend_store_uri,
                           artifacts_destination=a.artifacts_destination, password_env=a.password_env,
                           password_file=a.password_file,
                           allowed_hosts=a.allowed_hosts.split(",") if a.allowed_hosts else None)
    except (TrackingError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = redact(a.backend_store_uri) if a.backend_store_uri else srv.root / "mlruns.db"
    print(f"MLflow server for sweeps at {srv.uri} (store {store}, log {srv.log_path}).\n"
          f"Jobs log to it with (tracking URI: {srv.uri}):\n"
          f"  dapo sweep submit SPEC --set logging.tracking_uri={srv.uri}\n"
          f"  or, in a cluster profile (slurm/NAME.yaml):  tracking_uri: {srv.uri}\n"
          f"  export MLFLOW_TRACKING_URI={srv.uri}   # for dapo figures and the MLflow UI client\n"
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
