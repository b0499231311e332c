"""GRPO / DAPO math as small pure tensor functions, one module per concept (the steps they serve:
docs/METRICS.md; where a new variant goes: docs/ARCHITECTURE.md).

    advantages   group-relative advantages, their baselines and scales     ADV_BASELINES, ADV_STDS
    aggregation  the one place a per-token loss becomes a scalar           AGG_MODES
    losses       PPO-clip, GSPO, CISPO, Clip-Cov, KL-Cov; policy_loss       POLICY_LOSSES
    kl           k1, k2, k3 estimators                                     KL_KINDS
    entropy      per-token entropy and log-probs from logits, chunked
    shaping      overlong reward shaping and filtering
    selection    top-entropy token selection
    groups       dynamic sampling's band and modes, group statistics       DS_MODES
    corrections  rollout corrections (TIS / MIS / bypass)                  the modes of algo.rollout_correction
    eval_metrics avg@k, pass@k, cons@k (no torch)

Notation, used in every docstring: B prompts per rollout step, G responses per prompt,
N = B·G rows, L padded response length, V vocabulary size. `mask: [N, L]` marks real
response tokens (1) against padding (0); |o_i| = Σ_t mask[i, t]. Every loss becomes a scalar
through `aggregate`, the one place that knows about token and sequence counts.

No I/O, no config objects, no model: the training loop composes these. ``from dapo import algo``
then ``algo.policy_loss`` works: the names below are looked up in their module on first use, so
``dapo.algo.eval_metrics`` imports without torch.
"""

from __future__ import annotations

import importlib

_HOME = {
    "advantages": ("group_advantages", "ADV_BASELINES", "ADV_STDS"),
    "aggregation": ("aggregate", "AGG_MODES", "Count"),
    "losses": ("policy_loss", "POLICY_LOSSES", "VARIANT_METRICS", "ppo_clip_loss", "gspo_loss", "cispo_loss",
               "clip_cov_loss", "kl_cov_loss"),
    "kl": ("kl_penalty", "KL_KINDS"),
    "entropy": ("token_entropy", "logprobs_from_logits"),
    "shaping": ("soft_overlong_penalty", "overlong_mask"),
    "selection": ("top_entropy_mask",),
    "groups": ("informative_groups", "DS_MODES", "dynamic_sampling_keep", "mask_groups", "group_stats"),
    "eval_metrics": ("avg_at_k", "cons_at_k", "majority_answers", "pass_at_k"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    """``algo.X``: X from its concept's module (PEP 562), cached on the package."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'dapo.algo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dapo.algo.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
