"""Step 5 of Algorithm 1, the behaviour policy: for one rollout batch, which log-probs are π_old (the
PPO ratio's anchor) and π_rollout (what the engine sampled from), the loss mask, the per-token loss
weights, and what is logged about them (docs/METRICS.md, steps 5 and 5b; the three policies and
ρ = π_old / π_rollout: dapo.algo.corrections).

One call, :func:`behaviour_policy`, answers for a batch with a :class:`Behaviour`. It runs the modes
:func:`modes` picks from :data:`MODES`, each a function ``(Behaviour, Inputs) -> Behaviour``: first
the source of π_old, then the stages that read the trainer's π_old:

    bypass | on_policy | trainer → top_entropy? → correction | mismatch? → lag_split?

then the advantage statistics over the final loss mask. After the update, :meth:`Behaviour.after_update`
gives the metrics to log (completing ``mismatch/*`` where π_old was the update's own forward).
The modes compute on [N, L] CPU tensors; the trainer's forwards come in as callables
(:class:`Inputs`), so nothing here knows the model, the engine or the process group beyond the
metrics' cross-rank sums. Notation as in dapo.algo: N sequences, L response tokens (padded).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor

from dapo import algo
from dapo.algo import corrections
from dapo.config import Config
from dapo.dist.distributed import all_reduce_tensor_sum
from dapo.train.logprobs import response_loss_mask, response_mask, rollout_logprobs, single_step_on_policy
from dapo.train.staleness import split_mismatch
from dapo.train.update import StepStats, old_policy_metrics

if TYPE_CHECKING:
    from dapo.train.rollout import RolloutBatch

__all__ = ["Behaviour", "Inputs", "Forward", "MODES", "SOURCES", "modes", "behaviour_policy", "advantage_stats",
           "need_rollout_lp", "trainer_pass", "on_policy", "bypass", "top_entropy", "mismatch", "correction",
           "lag_split"]

Forward = Callable[[str], tuple[Tensor, Optional[Tensor], Tensor]]
"""The trainer's no-grad pass of the batch with its current weights for an entropy mode of
:data:`dapo.train.logprobs.ENTROPY_MODES`: (log-probs [N, L], entropy [N, L] or None, resp_mask [N, L]),
as :func:`dapo.train.logprobs.old_logprobs` returns them."""


@dataclass(frozen=True)
class Inputs:
    """What the behaviour phase reads of one rollout step."""
    cfg: Config
    batch: RolloutBatch
    adv: Tensor                                     # [N] group advantages (step 4)
    forward: Forward                                # the trainer's π_old pass
    lag_forward: Optional[Callable[[], Tensor]] = None   # train.staleness: log-probs [N, L] of the trainer
    world: int = 1                                  # with the weights that sampled; None without staleness


@dataclass(frozen=True)
class Behaviour:
    """π_old and π_rollout of one batch, the loss mask and weights, and their metrics (all [N, L])."""
    source: str                                     # the mode that gave π_old: trainer, on_policy or bypass
    rollout_lp: Optional[Tensor]                    # log π_rollout as the engine returned it; None: none
    resp_mask: Tensor                               # 1 on real response tokens
    loss_mask: Tensor                               # the tokens the loss sees
    old_lp: Optional[Tensor] = None                 # log π_old; None: the update's own forward (on_policy)
    entropy: Optional[Tensor] = None                # π_old's entropy (the trainer's pass), else None
    weight: Optional[Tensor] = None                 # per-token loss weights (a correction), else None
    metrics: dict[str, float] = field(default_factory=dict)
    own_lp: Optional[Tensor] = None                 # zeros the update fills with its own log-probs (on_policy
                                                    # with the engine's log-probs), else None

    def with_metrics(self, metrics: dict[str, float], **changes) -> Behaviour:
        """A copy with ``metrics`` added (after the ones it has) and the fields ``changes`` replaced."""
        return replace(self, metrics={**self.metrics, **metrics}, **changes)

    def after_update(self, world: int = 1) -> dict[str, float]:
        """The metrics to log once the update ran: with ``own_lp`` (each rank filled its rows, summed
        here: a collective with ``world`` > 1, every rank calls it), ``mismatch/*`` of that forward vs π_rollout."""
        if self.own_lp is None:
            return dict(self.metrics)
        own = all_reduce_tensor_sum(self.own_lp, world)
        return {**self.metrics, **corrections.mismatch_metrics(own, self.rollout_lp, self.resp_mask)}


def need_rollout_lp(rollout_lp: Optional[Tensor]) -> Tensor:
    """``rollout_lp`` [N, L], or an error saying that this mode needs the engine's log-probs."""
    if rollout_lp is None:
        raise RuntimeError("algo.old_logprobs=rollout / algo.rollout_correction need the rollout engine's "
                           "log-probs, and this engine returned none")
    return rollout_lp


# =========================================================================== the sources of π_old
def trainer_pass(b: Behaviour, x: Inputs) -> Behaviour:
    """π_old from the trainer's own no-grad forward at the step's start: PPO's π_θold (Schulman et al.
    2017), as GRPO and DAPO use it, recomputed by the trainer rather than taken from the engine. Entropy of
    every row on every rank with top-entropy selection (it ranks all loss tokens), else this rank's rows only;
    logs π_old's ``train/entropy`` and ``train/token_prob_mean`` (:func:`dapo.train.update.old_policy_metrics`)."""
    rows = x.cfg.algo.top_entropy_quantile < 1.0
    old_lp, ent, _ = x.forward("rows" if rows else "local")
    return b.with_metrics(old_policy_metrics(old_lp, ent, b.resp_mask, 1 if rows else x.world),
                          old_lp=old_lp, entropy=ent)


def on_policy(b: Behaviour, x: Inputs) -> Behaviour:
    """No π_old pass: with one optimizer step per batch (PPO / GRPO with one epoch and one mini-batch,
    :func:`dapo.train.logprobs.single_step_on_policy`) π_old is the policy being differentiated, ratio ≡ 1, and
    the update's own forward, detached, stands in for it (``old_lp`` None). With the engine's log-probs
    the update writes its own into ``own_lp``, so ``mismatch/*`` exist here too (:meth:`Behaviour.after_update`)."""
    return b if b.rollout_lp is None else replace(b, own_lp=torch.zeros(b.resp_mask.shape, dtype=torch.float32))


def bypass(b: Behaviour, x: Inputs) -> Behaviour:
    """π_old := π_rollout, no pass (``algo.old_logprobs=rollout``): verl's rollout-correction "bypass" mode
    (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"); the PPO
    ratio is taken against the engine's log-probs, and one policy leaves no mismatch to log."""
    return replace(b, old_lp=need_rollout_lp(b.rollout_lp))


# =========================================================================== the stages after the trainer's pass
def top_entropy(b: Behaviour, x: Inputs) -> Behaviour:
    """Only the ⌈q·T⌉ highest-entropy of the T loss tokens stay in the loss mask, q =
    ``algo.top_entropy_quantile`` < 1 (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority
    Tokens Drive Effective RL for LLM Reasoning", arXiv 2506.01939; :func:`dapo.algo.top_entropy_mask`),
    ranked by π_old's entropy; logs ``train/entropy_kept_frac``."""
    before = float(b.loss_mask.sum())
    mask = b.loss_mask * algo.top_entropy_mask(b.entropy, b.loss_mask, x.cfg.algo.top_entropy_quantile)
    return b.with_metrics({StepStats.metric("entropy_kept_frac"): float(mask.sum()) / max(before, 1.0)},
                          loss_mask=mask)


def mismatch(b: Behaviour, x: Inputs) -> Behaviour:
    """``mismatch/*`` of π_old vs π_rollout, nothing corrected (``algo.rollout_correction.mode=none``;
    :func:`dapo.algo.corrections.mismatch_metrics`, the measures of Yao et al. 2025 and docs/METRICS.md)."""
    return b.with_metrics(corrections.mismatch_metrics(b.old_lp, b.rollout_lp, b.resp_mask))


def correction(b: Behaviour, x: Inputs) -> Behaviour:
    """A rollout correction from ρ = π_old / π_rollout (``algo.rollout_correction``, dapo.algo.corrections): per-token
    loss weights and rejections out of the loss mask: ``tis`` truncated importance sampling (Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training"), ``mis`` masked importance
    sampling (Liu et al. 2025, "When speed kills stability"), ``icepop`` (Ring-1T), ``geo_rs``; logs
    ``mismatch/*`` with the weights' statistics."""
    rc = x.cfg.algo.rollout_correction
    rollout_lp = need_rollout_lp(b.rollout_lp)
    w, keep = corrections.correction(b.old_lp, rollout_lp, b.resp_mask, rc.mode, level=rc.level, cap=rc.cap,
                                     lo=rc.lo, hi=rc.hi)
    weight, loss_mask = corrections.apply(b.loss_mask, w, keep)
    return b.with_metrics(corrections.mismatch_metrics(b.old_lp, rollout_lp, b.resp_mask, w, keep),
                          weight=weight, loss_mask=loss_mask)


def lag_split(b: Behaviour, x: Inputs) -> Behaviour:
    """``train.staleness`` = k, π_old the trainer's at the step's start (decoupled from the lagged weights that
    sampled, as AReaL; dapo.train.staleness): ``mismatch/kernel/*`` and ``mismatch/lag/*``, the mismatch split at
    π_lag, one more forward of the trainer with the weights that sampled (:func:`dapo.train.staleness.split_mismatch`)."""
    return b.with_metrics(split_mismatch(corrections.mismatch_metrics, b.old_lp, x.lag_forward(), b.rollout_lp,
                                         b.resp_mask))


MODES: dict[str, Callable[[Behaviour, Inputs], Behaviour]] = {
    "trainer": trainer_pass, "on_policy": on_policy, "bypass": bypass,
    "top_entropy": top_entropy, "mismatch": mismatch, "correction": correction, "lag_split": lag_split}
"""Mode name → its function; :func:`modes` says which run, in which order."""

SOURCES = ("trainer", "on_policy", "bypass")
"""The modes that give π_old; exactly one of them runs first."""


def modes(cfg: Config, num_groups: int, has_rollout_lp: bool, lagged: bool) -> tuple[str, ...]:
    """The modes of :data:`MODES` one batch runs, in order: its source of π_old, then (after the trainer's
    pass only) top-entropy selection, a correction or the plain mismatch, and the staleness split."""
    a = cfg.algo
    if a.old_logprobs == "rollout":
        return ("bypass",)
    if (single_step_on_policy(cfg, num_groups) and a.top_entropy_quantile >= 1.0
            and a.rollout_correction.mode == "none"):
        return ("on_policy",)
    correcting = a.rollout_correction.mode != "none"
    stages = {"top_entropy": a.top_entropy_quantile < 1.0, "correction": correcting,
              "mismatch": not correcting and has_rollout_lp, "lag_split": lagged and has_rollout_lp}
    return ("trainer", *(name for name, on in stages.items() if on))


def advantage_stats(adv: Tensor, loss_mask: Tensor, weight: Optional[Tensor] = None) -> dict[str, float]:
    """``rollout/adv_abs_mean`` (mean |Â|, Â·w with a correction's weights [N, L]) and ``rollout/adv_zero_frac``
    (Â·w = 0) over the loss tokens. adv: [N] (or [N, L]); loss_mask: [N, L]."""
    a = (adv[:, None] if adv.dim() == 1 else adv).expand_as(loss_mask)
    a = a if weight is None else a * weight
    n = float(loss_mask.sum())
    if n == 0:
        return {}
    return {"rollout/adv_abs_mean": float((a.abs() * loss_mask).sum()) / n,
            "rollout/adv_zero_frac": float(((a == 0).float() * loss_mask).sum()) / n}


def behaviour_policy(x: Inputs) -> Behaviour:
    """Step 5 for one batch: the response and loss masks (overlong filter, dynamic sampling's masked
    groups), π_rollout from the engine, then the :func:`modes` in turn, then :func:`advantage_stats`."""
    batch, cfg = x.batch, x.cfg
    resp_mask = response_mask(batch)                                                         # [N, L]
    loss_mask = algo.mask_groups(response_loss_mask(resp_mask, batch.finished, cfg.algo.overlong.filter),
                                 batch.in_loss)
    rollout_lp = rollout_logprobs(batch)                                                     # [N, L] or None
    names = modes(cfg, batch.num_groups, rollout_lp is not None, x.lag_forward is not None)
    b = Behaviour(names[0], rollout_lp, resp_mask, loss_mask)
    for name in names:
        b = MODES[name](b, x)
    return b.with_metrics(advantage_stats(x.adv, b.loss_mask, b.weight))
