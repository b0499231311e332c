"""Atomic, rotating checkpoints: model, optimizer, scheduler, RNG, data cursor, counters.

Layout: ``<run_dir>/checkpoints/step_000012/{model.pt, optim.pt, state.json}``. A
checkpoint is written into a temporary sibling directory and published with one
``os.rename``; a directory without ``state.json`` is never read. A crash mid-write
(kill, full disk) leaves the previous checkpoint intact; the error names the path.
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

__all__ = ["CheckpointError", "save_checkpoint", "latest_checkpoint", "load_checkpoint",
           "rng_state", "set_rng_state"]


class CheckpointError(RuntimeError):
    """Writing or reading a checkpoint failed; the message names the path."""


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
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
        raise CheckpointError(f"{final}: refusing to checkpoint non-finite (NaN/inf) weights")
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "rng": rng_state()}, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str))
        for f in tmp.iterdir():  # make the bytes durable before publishing the name
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{final}: could not write checkpoint: {exc}") from exc
    done = sorted(p for p in root.glob("step_*") if (p / "state.json").is_file())
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


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
        extra = torch.load(path / "optim.pt", map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{path}: could not load checkpoint: {exc}") from exc
    if optimizer is not None:
        optimizer.load_state_dict(extra["optimizer"])
    if scheduler is not None and extra.get("scheduler") is not None:
        scheduler.load_state_dict(extra["scheduler"])
    if restore_rng:
        set_rng_state(extra["rng"])
    return state
