"""Atomic, rotating checkpoints: model, optimizer, scheduler, RNG, data cursor, counters.

Layout: ``<run_dir>/checkpoints/step_000012/{model.pt, optim.pt, state.json}``. A
checkpoint is written into a temporary sibling directory, its files fsynced, and
published with one ``os.rename`` (then the directory is fsynced); a directory without
``state.json`` is never read. A crash mid-write (kill, full disk, unwritable directory)
leaves the previous checkpoints intact and loadable; the error (:class:`CheckpointError`)
names the path. Leftover temporary directories of a killed writer are removed by the
next save; old checkpoints are renamed away before they are deleted, so a kill during
rotation never leaves a half-deleted ``step_*`` directory that looks complete.

Everything is read back with ``torch.load(weights_only=True)``: no pickle of arbitrary
objects is ever loaded (the numpy RNG state is stored as a tensor for that reason).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo import faults

__all__ = ["CheckpointError", "save_checkpoint", "latest_checkpoint", "load_checkpoint",
           "rng_state", "set_rng_state"]


class CheckpointError(RuntimeError):
    """Writing or reading a checkpoint failed; the message names the path."""


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
            "torch": torch.get_rng_state()}


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    kind, keys, pos, has_gauss, cached = s["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(s["torch"])


def _finite(model: torch.nn.Module) -> bool:
    return all(torch.isfinite(p).all().item() for p in model.state_dict().values()
               if torch.is_floating_point(p))


def save_checkpoint(run_dir: str | os.PathLike, step: int, *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, state: dict[str, Any],
                    keep_last: int = 2) -> Path:
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep_last``.

    Refuses (CheckpointError) to write non-finite weights.
    """
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    if not _finite(model):
        raise CheckpointError(f"{final}: refusing to checkpoint non-finite (NaN/inf) weights; "
                              f"the previous checkpoint is kept")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp_step_*"):   # a killed writer's leftovers (one writer per run dir)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        torch.save(model.state_dict(), tmp / "model.pt")
        faults.kill_point("KILL_IN_CHECKPOINT", step)   # test hook: die with the checkpoint half written
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "rng": rng_state()}, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str))
        for f in tmp.iterdir():  # make the bytes durable before publishing the name
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        old = None
        if final.exists():   # the same step again (rare): move it aside, never delete it first
            old = root / f".old_step_{step:06d}_{os.getpid()}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except Exception as exc:  # OSError (full disk, read-only), or torch's RuntimeError wrapping one
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{final}: could not write checkpoint ({type(exc).__name__}: {exc}); "
                              f"the previous checkpoint is kept") from exc
    done = sorted(p for p in root.glob("step_*") if (p / "state.json").is_file())
    for i, old in enumerate(done[:-keep_last]):
        trash = root / f".del_{old.name}_{os.getpid()}_{i}"
        try:
            os.rename(old, trash)   # atomic: a kill mid-delete leaves no half-deleted step_* directory
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    for trash in root.glob(".del_step_*"):   # leftovers of a kill during an earlier rotation
        shutil.rmtree(trash, ignore_errors=True)
    for trash in root.glob(".old_step_*"):
        shutil.rmtree(trash, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if (p / "state.json").is_file())
    return done[-1] if done else None


def load_checkpoint(path: str | os.PathLike, *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Load a checkpoint into the given objects; return its ``state.json`` dict."""
    path = Path(path)
    try:
        state = json.loads((path / "state.json").read_text())
        model.load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
        extra = _load_extra(path / "optim.pt")
    except Exception as exc:  # OSError, a truncated zip (RuntimeError), bad JSON, unpickling refused
        raise CheckpointError(f"{path}: could not load checkpoint ({type(exc).__name__}: {exc})") from exc
    if optimizer is not None:
        optimizer.load_state_dict(extra["optimizer"])
    if scheduler is not None and extra.get("scheduler") is not None:
        scheduler.load_state_dict(extra["scheduler"])
    if restore_rng:
        set_rng_state(extra["rng"])
    return state


def _load_extra(path: Path) -> dict[str, Any]:
    """optim.pt with ``weights_only=True``; checkpoints written before the numpy RNG state
    was stored as a tensor hold numpy arrays, allowed explicitly (no arbitrary globals)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - only the legacy numpy case is retried
        if "numpy" not in str(exc):
            raise
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core.multiarray import _reconstruct
    safe = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(safe):
        return torch.load(path, map_location="cpu", weights_only=True)
