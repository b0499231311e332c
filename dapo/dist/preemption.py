"""Preemption: SIGUSR2 asks for a checkpoint at the next rollout-step boundary, then the signal's own handling.

Slurm sends USR2 ``signal_delay_s`` before a job's time limit or on preemption (the profile's
``--signal=USR2@...``; submitit's requeue handler listens for it). Without this module the
signal was acted on wherever the loop happened to be: the job was requeued at once and every
step since the last periodic checkpoint (up to ``checkpoint.every``) was lost.

:class:`StepBoundarySignal` replaces the handler for the length of the loop with one that only
records the signal. At the end of each rollout step the loop asks :meth:`StepBoundarySignal.pending`
(with several ranks an all-reduce, so that every rank agrees, whichever of them got the signal);
if it was sent, the loop writes its checkpoint and calls :meth:`StepBoundarySignal.hand_over`,
which puts the previous handling back and applies it: a Python handler (submitit's requeue) is
called; a default or ignored disposition ends the process with :data:`PREEMPTED_EXIT` (the job's
launcher then requeues or the user resubmits; the run resumes from that checkpoint).

The step must fit in the delay: ``signal_delay_s`` should exceed one rollout step plus one
checkpoint (``dapo plan`` prints the step time), or Slurm's kill at the limit comes first.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StepBoundarySignal", "PREEMPTED_EXIT"]

PREEMPTED_EXIT = 75   # EX_TEMPFAIL: stopped on request after a checkpoint; resumable


class StepBoundarySignal:
    """Record ``signum`` while installed; act on it at a step boundary (see the module docstring)."""

    def __init__(self, signum: int = signal.SIGUSR2):
        self.signum = signum
        self.received = False
        self.previous: Any = None
        self.installed = False

    def install(self) -> "StepBoundarySignal":
        """Take over ``signum`` (only possible in the main thread; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread() and not self.installed:
            self.previous = signal.signal(self.signum, self._record)
            self.installed = True
        return self

    def __enter__(self) -> "StepBoundarySignal":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def _record(self, signum, frame) -> None:
        self.received = True
        print(f"[dapo] {signal.Signals(signum).name} received: checkpointing at the end of this rollout step",
              flush=True)

    def pending(self, world: int = 1) -> bool:
        """Whether any rank got the signal (a collective with several ranks: every rank calls it per step)."""
        if world <= 1:
            return self.received
        from dapo.dist.distributed import all_reduce_sum
        return all_reduce_sum({"preempt": float(self.received)}, world)["preempt"] > 0

    def uninstall(self) -> None:
        """Put the previous handling back (the signal, if it comes later, is handled as before)."""
        if self.installed:
            signal.signal(self.signum, self.previous if self.previous is not None else signal.SIG_DFL)
            self.installed = False

    def hand_over(self) -> None:
        """After the checkpoint: the previous handler, called now (submitit requeues and exits), or, if
        there was none, the process ends with :data:`PREEMPTED_EXIT`."""
        previous = self.previous
        self.uninstall()
        self.received = False
        if callable(previous):
            previous(self.signum, None)
            return
        raise SystemExit(PREEMPTED_EXIT)
