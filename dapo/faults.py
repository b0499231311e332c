"""Fault injection for the reliability tests (docs/RELIABILITY.md). Off unless a
``DAPO_FAULT_*`` environment variable is set; nothing here runs in a normal run.

The variables are read when the loop reaches each point, so a test sets them in the
environment of the process it starts (a subprocess, a Slurm job) and the process faults
for real: it SIGKILLs itself, its rollout engine raises, it sleeps where a signal should
find it, or it poisons its own loss, gradients or weights.

==================================  ==========================================================
variable                            effect
==================================  ==========================================================
``DAPO_FAULT_KILL_AT_STEP=s``       SIGKILL after rollout step s's update, before its
                                    checkpoint (read by dapo.train.loop)
``DAPO_FAULT_KILL_AFTER_CHECKPOINT``  ``=s``: SIGKILL right after checkpoint s is published,
                                    before its buffered metrics are flushed to MLflow
``DAPO_FAULT_KILL_IN_CHECKPOINT``   ``=s``: SIGKILL in the middle of writing checkpoint s
                                    (model.pt written, optimizer and state.json not yet)
``DAPO_FAULT_KILL_IN_EVAL``        ``=c``: SIGKILL right after ``dapo eval`` wrote its c-th chunk
                                    file (read by dapo.commands.eval)
``DAPO_FAULT_KILL_IN_FLUSH``        ``=k``: SIGKILL right after the k-th point this process
                                    sends to MLflow (so a flush of several points is cut)
``DAPO_FAULT_ENGINE_FAIL_AT_STEP``  ``=s``: the rollout engine dies mid-generation (it
                                    generates for half the prompts, then raises) on its first
                                    ``DAPO_FAULT_ENGINE_FAILURES`` (default 1) calls of step s
``DAPO_FAULT_PAUSE``                ``=rollout@s[,update@t...]``: sleep ``DAPO_FAULT_PAUSE_S``
                                    (default 120) s in the middle of step s's rollout (after
                                    its first generation round) or update (after its first
                                    optimizer step), once: the marker file
                                    ``$DAPO_FAULT_MARKER_DIR/<point>@<step>`` is created
                                    first and a present marker disarms the pause (so a
                                    requeued job goes on)
``DAPO_FAULT_NONFINITE``            ``=loss@s`` | ``grad@s`` | ``weights@s`` (comma-separated
                                    list allowed): during step s's
                                    update make the logits NaN (so loss and gradients are
                                    NaN), make one parameter's gradient inf, or set one
                                    weight to NaN before the update
==================================  ==========================================================
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

__all__ = ["step_env", "kill_point", "engine_for_step", "during_update", "count_flushed_point",
           "InjectedEngineFailure"]

_state = {"engine_failures": 0, "flushed_points": 0}


class InjectedEngineFailure(RuntimeError):
    """The rollout engine 'died' (fault injection)."""


def step_env(name: str) -> int:
    """The rollout step named by env var ``name`` (0 = unset)."""
    try:
        return int(os.environ.get(name, "0") or 0)
    except ValueError:
        return 0


def _die(why: str) -> None:
    print(f"[dapo] fault injection: SIGKILL {why}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_point(name: str, step: int) -> None:
    """SIGKILL this process if env var ``DAPO_FAULT_<name>`` equals ``step``."""
    if step and step_env(f"DAPO_FAULT_{name}") == step:
        _die(f"at {name.lower()} {step}")


def count_flushed_point() -> None:
    """Called by the tracker after each point reaches MLflow (DAPO_FAULT_KILL_IN_FLUSH)."""
    k = step_env("DAPO_FAULT_KILL_IN_FLUSH")
    if not k:
        return
    _state["flushed_points"] += 1
    if _state["flushed_points"] == k:
        _die(f"in a flush, after MLflow point {k}")


def _pauses() -> dict[tuple[str, int], Path]:
    spec = os.environ.get("DAPO_FAULT_PAUSE", "")
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, step = item.partition("@")
        if step.isdigit():
            out[(point, int(step))] = Path(os.environ.get("DAPO_FAULT_MARKER_DIR", ".")) / f"{point}@{step}"
    return out


def pause_point(point: str, step: int) -> None:
    """Sleep once at (point, step) if DAPO_FAULT_PAUSE names it and its marker is absent."""
    marker = _pauses().get((point, step))
    if marker is None or marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    secs = float(os.environ.get("DAPO_FAULT_PAUSE_S", "120"))
    print(f"[dapo] fault injection: pausing {secs:.0f}s in the {point} of rollout step {step}", flush=True)
    end = time.monotonic() + secs
    while time.monotonic() < end:   # short sleeps: a signal caught by another thread (torch's pool)
        time.sleep(0.1)             # only runs its Python handler when this thread runs bytecode


class _FaultyEngine:
    """Wraps a rollout engine for one rollout step: may die mid-generation or pause."""

    def __init__(self, inner: Any, step: int):
        self.inner, self.step, self.calls = inner, step, 0

    def generate(self, prompts, spec):
        self.calls += 1
        fail_at = step_env("DAPO_FAULT_ENGINE_FAIL_AT_STEP")
        if fail_at == self.step and _state["engine_failures"] < (step_env("DAPO_FAULT_ENGINE_FAILURES") or 1):
            _state["engine_failures"] += 1
            self.inner.generate(prompts[: max(len(prompts) // 2, 1)], spec)   # real work, then it dies
            raise InjectedEngineFailure(f"injected fault: rollout engine died mid-generation "
                                        f"(rollout step {self.step}, failure {_state['engine_failures']})")
        out = self.inner.generate(prompts, spec)
        if self.calls == 1:
            pause_point("rollout", self.step)
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def engine_for_step(engine: Any, step: int) -> Any:
    """``engine`` itself, or a faulty wrapper when a rollout fault names ``step``."""
    if step_env("DAPO_FAULT_ENGINE_FAIL_AT_STEP") == step or ("rollout", step) in _pauses():
        return _FaultyEngine(engine, step)
    return engine


def _nonfinite(step: int) -> str:
    """The non-finite fault kind DAPO_FAULT_NONFINITE names for ``step`` ('' = none)."""
    for item in os.environ.get("DAPO_FAULT_NONFINITE", "").split(","):
        kind, _, at = item.strip().partition("@")
        if at.isdigit() and int(at) == step:
            return kind
    return ""


@contextlib.contextmanager
def during_update(model: Any, optimizer: Any, step: int) -> Iterator[None]:
    """Arm the update-phase faults of rollout step ``step`` (pause, non-finite) around its update."""
    import torch
    handles = []
    if ("update", step) in _pauses():
        fired = []

        def after_first_step(opt, args, kwargs):
            if not fired:   # one shot: between the first and the second gradient step
                fired.append(True)
                pause_point("update", step)
        inner = getattr(optimizer, "optimizer", optimizer)   # accelerate wraps the torch optimizer
        handles.append(inner.register_step_post_hook(after_first_step))
    kind = _nonfinite(step)
    if kind:
        param = next(p for p in model.parameters() if p.requires_grad)
        print(f"[dapo] fault injection: non-finite {kind} in rollout step {step}", flush=True)
        if kind == "loss":
            def nan_logits(module, args, output):
                output.logits = output.logits * float("nan")
                return output
            handles.append(model.register_forward_hook(nan_logits))
        elif kind == "grad":
            handles.append(param.register_hook(lambda g: torch.full_like(g, float("inf"))))
        elif kind == "weights":
            with torch.no_grad():
                param.view(-1)[0] = float("nan")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
