"""Group-relative advantages (GRPO, Shao et al. 2024; DAPO Eq. 9) and their baselines and scales.

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor



def group_advantages(rewards: Tensor, eps: float = 1e-6, *, std: str = "group", baseline: str = "mean") -> Tensor:
    """Group-relative advantage Â_i = (R_i − b_i) / (σ + eps), per group (row).

    rewards: [B, G] one scalar reward per response -> [B, G] (broadcast over tokens later).
    baseline (`ADV_BASELINES`):
      mean           b_i = mean_g R (GRPO)
      leave_one_out  b_i = mean_{j≠i} R_j, so R_i − b_i = G/(G−1)·(R_i − mean_g R) (RLOO:
                     Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free";
                     Ahmadian et al. 2024 for LLMs)
    std (`ADV_STDS`), σ:
      group  the unbiased (G−1) sample std of the group, as `torch.std` in verl's GRPO estimator
      batch  the unbiased std of all B·G rewards of the step (the group mean stays the baseline:
             LitePPO, Liu et al. 2025 "Tricks or Traps?"; TRL `scale_rewards="batch"`)
      none   no division, σ + eps := 1 (Dr. GRPO: Liu et al. 2025, arXiv 2503.20783, "Understanding
             R1-Zero-Like Training": dividing by the group std up-weights near-constant groups)
    A group whose rewards are all equal (including G = 1) gets exactly 0, never NaN.
    (verl gives a G = 1 group its raw reward instead; here it carries no signal.)
    The defaults are GRPO's Â = (R_i − mean_g R) / (std_g R + eps).
    """
    if std not in ADV_STDS:
        raise ValueError(f"unknown advantage std {std!r}; valid: {sorted(ADV_STDS)}")
    if baseline not in ADV_BASELINES:
        raise ValueError(f"unknown advantage baseline {baseline!r}; valid: {sorted(ADV_BASELINES)}")
    r = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    if r.shape[-1] < 2 or r.numel() == 0:  # std undefined for G = 1; no group kept: nothing to normalise
        return torch.zeros_like(r)           # (torch.std of [0, G] warns "degrees of freedom is <= 0")
    mean = r.mean(dim=-1, keepdim=True)  # [B, 1]
    centered = ADV_BASELINES[baseline](r, mean)  # [B, G]
    if std == "group":
        adv = centered / (r.std(dim=-1, keepdim=True) + eps)  # [B, G], std unbiased [B, 1]
    elif std == "batch":
        adv = centered / ((r.std() if r.numel() > 1 else r.new_zeros(())) + eps)  # one std, [B, G]
    else:
        adv = centered
    constant = (r == r[..., :1]).all(dim=-1, keepdim=True)  # [B, 1]
    return torch.where(constant, torch.zeros_like(adv), adv)


def _mean_baseline(r: Tensor, mean: Tensor) -> Tensor:
    return r - mean  # [B, G]


def _leave_one_out_baseline(r: Tensor, mean: Tensor) -> Tensor:
    # R_i − (Σ_g R − R_i)/(G − 1) = G/(G−1)·(R_i − mean)
    g = r.shape[-1]
    return (r - mean) * (g / (g - 1))  # [B, G]


ADV_BASELINES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "mean": _mean_baseline,
    "leave_one_out": _leave_one_out_baseline,
}
ADV_STDS = ("group", "batch", "none")
