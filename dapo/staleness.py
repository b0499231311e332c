"""Off-policyness as an ablation axis: rollouts sampled with weights k updates old (``train.staleness``).

Systems that train at scale generate with weights that lag the trainer (one-step-off, fully
asynchronous). This is their deterministic reference: the rollouts of rollout step r are sampled with
the policy after update v(r) = max(0, r − 1 − k) (the initial weights before any update), so a
run is reproducible and resumes bit for bit, while the trainer updates θ as usual. ``k = 0`` is the
synchronous loop of the paper (nothing here runs).

:class:`LaggedWeights` keeps the policy after each of the last k + 1 updates (whole, on the CPU: one
process only), the engine gets v(r)'s before step r's rollouts and the current weights again before an
evaluation (which always measures the current policy). Its contents travel in the checkpoint
(:meth:`state_dict`). π_old stays the trainer's weights at the step's start (decoupled, as AReaL): the
lag then shows in ``mismatch/*`` and a correction (``algo.rollout_correction``) weighs it;
``algo.old_logprobs=rollout`` is the bypass objective instead. Logged: ``offpolicy/staleness``, the
lag of the step's rollouts in updates, r − 1 − v(r).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Callable, Iterator

import torch

__all__ = ["LaggedWeights", "lagged_version", "swapped_weights", "split_mismatch"]


def lagged_version(rollout_step: int, k: int) -> int:
    """v(r) = max(0, r − 1 − k): the update whose weights sample rollout step r (0 = the initial ones)."""
    return max(0, rollout_step - 1 - k)


class LaggedWeights:
    """The policy after each of the last k + 1 updates, by version (0 = before the first)."""

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"LaggedWeights needs k >= 1, got {k}")
        self.k = k
        self.weights: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()

    def record(self, version: int, model: torch.nn.Module) -> None:
        """Keep a CPU copy of ``model``'s weights as ``version``; drop those no later step needs."""
        self.weights[version] = {n: t.detach().to("cpu", copy=True) for n, t in model.state_dict().items()}
        for v in [v for v in self.weights if v < version - self.k]:
            del self.weights[v]

    def for_step(self, rollout_step: int) -> tuple[int, dict[str, torch.Tensor]]:
        """(v(r), its weights) for the rollouts of ``rollout_step``; KeyError if it was not kept."""
        v = lagged_version(rollout_step, self.k)
        if v not in self.weights:
            raise KeyError(f"train.staleness={self.k}: the weights of update {v} are not kept "
                           f"(have {list(self.weights)})")
        return v, self.weights[v]

    def state_dict(self) -> dict[str, Any]:
        """For the checkpoint: the versions and their weights."""
        return {"versions": torch.tensor(list(self.weights), dtype=torch.long),
                "weights": list(self.weights.values())}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.weights = OrderedDict((int(v), w) for v, w in zip(d["versions"].tolist(), d["weights"]))


@contextlib.contextmanager
def swapped_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """``model`` holds ``weights`` inside the block and its own again after it (bit for bit: a CPU copy
    of its state is loaded back). One process only, as :class:`LaggedWeights`."""
    own = {n: t.detach().to("cpu", copy=True) for n, t in model.state_dict().items()}
    model.load_state_dict(weights)
    try:
        yield
    finally:
        model.load_state_dict(own)


def split_mismatch(metrics: Callable[..., dict[str, float]], old_logp: torch.Tensor, lag_logp: torch.Tensor,
                   rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The mismatch of π_old vs π_rollout in two parts, at π_lag = the trainer's own forward with the
    weights that sampled (all [N, L]): ``mismatch/kernel/*`` (π_lag vs π_rollout: the same weights,
    the engine's kernels and precision against the trainer's) and ``mismatch/lag/*`` (π_old vs π_lag:
    the same kernels, the weights k updates apart). Log-ratios add, log ρ = log ρ_lag + log ρ_kernel,
    so the token-level |Δ log p| parts bound the whole. ``metrics`` is
    `dapo.corrections.mismatch_metrics`; the per-length buckets are left to the whole."""
    out: dict[str, float] = {}
    for part, (a, b) in (("kernel", (lag_logp, rollout_logp)), ("lag", (old_logp, lag_logp))):
        out.update({k.replace("mismatch/", f"mismatch/{part}/", 1): v for k, v in metrics(a, b, mask).items()
                    if "_len_" not in k})
    return out
