"""Off-policyness as an ablation axis: rollouts sampled with weights k updates old (``train.staleness``).

Systems that train at scale generate with weights that lag the trainer (one-step-off, fully
asynchronous). This is their deterministic reference: the rollouts of rollout step r are sampled with
the policy after update v(r) = max(0, r − 1 − k) (the initial weights before any update), so a
run is reproducible and resumes bit for bit, while the trainer updates θ as usual. ``k = 0`` is the
synchronous loop of the paper (nothing here runs).

:class:`LaggedWeights` keeps the policy after each of the last k + 1 updates on the CPU, as each rank
holds it: the whole tensors in one process (or unsharded data parallel), this rank's shards of a sharded
(FSDP2) model, so the memory per rank is (k + 1) × its share. The engine gets v(r)'s before step r's
rollouts (every rank swaps its shards in, then the usual gathered weight stream runs) and the current
weights again before an evaluation (which always measures the current policy). Its contents travel in
the checkpoint (:meth:`state_dict`; per rank when sharded, so a resume keeps the number of processes). π_old stays the trainer's weights at the step's start (decoupled, as AReaL): the
lag then shows in ``mismatch/*`` and a correction (``algo.rollout_correction``) weighs it;
``algo.old_logprobs=rollout`` is the bypass objective instead. Logged: ``offpolicy/staleness``, the
lag of the step's rollouts in updates, r − 1 − v(r).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Callable, Iterator

import torch

__all__ = ["LaggedWeights", "lagged_version", "local_state", "swapped_weights", "split_mismatch"]


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
        """Keep a CPU copy of ``model``'s weights (this rank's shards) as ``version``; drop those no later
        step needs."""
        self.weights[version] = local_state(model)
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


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a state-dict tensor: a DTensor's local shard (a view of the parameter), else ``t``."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def local_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of ``model``'s state dict as this rank holds it (shards of a sharded model)."""
    return {n: _local(t.detach()).to("cpu", copy=True) for n, t in model.state_dict().items()}


def _reshard(model: torch.nn.Module) -> None:
    """Free every gathered (unsharded) parameter of a sharded model, so that the next forward gathers
    the shards anew (FSDP2 keeps the root unit's gathered after a forward; a swap under it would not be
    seen). Nothing for an unsharded model."""
    from torch.distributed.fsdp import FSDPModule
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


@torch.no_grad()
def _copy_in(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` (:func:`local_state`'s layout) into ``model``'s tensors in place."""
    _reshard(model)
    for n, t in model.state_dict().items():
        _local(t).copy_(weights[n])


@contextlib.contextmanager
def swapped_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """``model`` holds ``weights`` (:func:`local_state`'s layout: this rank's shards when sharded) inside
    the block and its own again after it, bit for bit (copied in place, so the optimizer's parameters
    stay the same objects). With several ranks every rank enters it at the same point."""
    own = local_state(model)
    _copy_in(model, weights)
    try:
        yield
    finally:
        _copy_in(model, own)


def split_mismatch(metrics: Callable[..., dict[str, float]], old_logp: torch.Tensor, lag_logp: torch.Tensor,
                   rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The mismatch of π_old vs π_rollout in two parts, at π_lag = the trainer's own forward with the
    weights that sampled (all [N, L]): ``mismatch/kernel/*`` (π_lag vs π_rollout: the same weights,
    the engine's kernels and precision against the trainer's) and ``mismatch/lag/*`` (π_old vs π_lag:
    the same kernels, the weights k updates apart). Log-ratios add, log ρ = log ρ_lag + log ρ_kernel,
    so the token-level |Δ log p| parts bound the whole. ``metrics`` is
    `dapo.algo.corrections.mismatch_metrics`; the per-length buckets are left to the whole."""
    out: dict[str, float] = {}
    for part, (a, b) in (("kernel", (lag_logp, rollout_logp)), ("lag", (old_logp, lag_logp))):
        out.update({k.replace("mismatch/", f"mismatch/{part}/", 1): v for k, v in metrics(a, b, mask).items()
                    if "_len_" not in k})
    return out
