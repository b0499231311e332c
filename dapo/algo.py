"""GRPO / DAPO math as small pure tensor functions (the steps they serve: docs/METRICS.md).

Notation, used in every docstring: B prompts per rollout step, G responses per prompt,
N = B·G rows, L padded response length, V vocabulary size. `mask: [N, L]` marks real
response tokens (1) against padding (0); |o_i| = Σ_t mask[i, t]. Every loss becomes a scalar
through `aggregate`, the one place that knows about token and sequence counts.

No I/O, no config objects, no model: the training loop composes these.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Callable, Optional, Union

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from dapo.config import default_chunk_rows
from dapo.eval_metrics import avg_at_k, cons_at_k, majority_answers, pass_at_k  # noqa: F401  (evaluation helpers, re-exported)

Count = Union[int, float, Tensor]  # a token or sequence count; may be a 0-dim tensor after all_reduce

__all__ = [
    "ADV_BASELINES", "ADV_STDS", "AGG_MODES", "KL_KINDS", "aggregate", "avg_at_k", "cons_at_k", "group_advantages",
    "group_stats", "informative_groups", "DS_MODES", "dynamic_sampling_keep", "mask_groups", "kl_penalty", "logprobs_from_logits",
    "majority_answers", "overlong_mask", "pass_at_k", "policy_loss", "soft_overlong_penalty",
    "POLICY_LOSSES", "VARIANT_METRICS", "ppo_clip_loss", "gspo_loss", "cispo_loss", "clip_cov_loss", "kl_cov_loss",
    "token_entropy", "top_entropy_mask",
]


# ----------------------------------------------------------------------------------------
# Advantages
# ----------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------
# Aggregation: the single place a per-token loss becomes a scalar
# ----------------------------------------------------------------------------------------

def _positive(x: Count) -> Count:
    """x, or 1 where x < 1: an empty batch divides 0 by 1 instead of by 0."""
    return x.clamp(min=1) if isinstance(x, Tensor) else max(x, 1)


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """values · mask with masked positions exactly 0, even where values is inf/NaN. [N, L]"""
    return torch.where(mask != 0, values * mask, torch.zeros_like(values))


def _token_mean(values, mask, num_tokens, num_seqs, norm_const, **_):
    # Σ_i Σ_t ℓ·m / T, T = tokens of the whole optimizer step (DAPO Eq. 8/12)
    total = mask.sum() if num_tokens is None else num_tokens
    return _masked(values, mask).sum() / _positive(total)


def _seq_counts(mask: Tensor, num_seqs: Optional[Count]) -> Count:
    # S: sequences with at least one loss token. A fully masked row (overlong filtering) is
    # not a sequence of the loss: it neither adds to the sum nor to the count (as verl).
    return _positive((mask.sum(-1) > 0).sum() if num_seqs is None else num_seqs)


def _seq_mean_token_mean(values, mask, num_tokens, num_seqs, norm_const, **_):
    # 1/S Σ_i (1/|o_i|) Σ_t ℓ·m  (GRPO Eq. 5)
    per_seq = _masked(values, mask).sum(-1) / _positive(mask.sum(-1))  # [N]
    return per_seq.sum() / _seq_counts(mask, num_seqs)


def _seq_mean_token_sum(values, mask, num_tokens, num_seqs, norm_const, **_):
    # 1/S Σ_i Σ_t ℓ·m
    return _masked(values, mask).sum() / _seq_counts(mask, num_seqs)


def _seq_mean_token_sum_const(values, mask, num_tokens, num_seqs, norm_const, **_):
    # Dr.GRPO: 1/S Σ_i (1/C) Σ_t ℓ·m, C = norm_const or L (a constant, not |o_i|)
    const = mask.shape[-1] if norm_const is None else norm_const
    return _masked(values, mask).sum() / (_seq_counts(mask, num_seqs) * const)


def _group_token_mean(values, mask, num_tokens, num_seqs, norm_const, *, group_tokens=None, num_groups=None,
                      groups=None):
    # 1/K Σ_g (Σ_{i∈g} Σ_t ℓ·m) / Σ_{i∈g} |o_i|: per prompt a token mean, then the mean over the K
    # prompts with ≥ 1 loss token. group_tokens: [N], the loss tokens of row i's group over the step.
    if group_tokens is None:
        if groups is None:
            raise ValueError("group_token_mean needs groups (the group index of each row, [N]) or group_tokens "
                             "and num_groups (the step's counts)")
        per_group = torch.zeros(int(groups.max().item()) + 1 if groups.numel() else 0, dtype=mask.dtype,
                                device=mask.device).index_add_(0, groups, mask.sum(-1))  # [K]
        group_tokens = per_group[groups]  # [N]
        num_groups = (per_group > 0).sum() if num_groups is None else num_groups
    elif num_groups is None:
        raise ValueError("group_token_mean: group_tokens given without num_groups")
    per_row = _masked(values, mask).sum(-1) / _positive(group_tokens)  # [N]
    return per_row.sum() / _positive(num_groups)


AGG_MODES: dict[str, Callable[..., Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum": _seq_mean_token_sum,
    "seq_mean_token_sum_const": _seq_mean_token_sum_const,
    "group_token_mean": _group_token_mean,
}


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    num_tokens: Optional[Count] = None,
    num_seqs: Optional[Count] = None,
    *,
    norm_const: Optional[float] = None,
    group_tokens: Optional[Tensor] = None,
    num_groups: Optional[Count] = None,
    groups: Optional[Tensor] = None,
) -> Tensor:
    """Reduce a per-token quantity to a scalar.

    values: [N, L]; mask: [N, L] (0/1 or float weights; masked entries are ignored even if
    inf/NaN). Returns a 0-dim tensor. Modes (`AGG_MODES`):
      token_mean                Σ v·m / T
      seq_mean_token_mean       Σ_i (Σ_t v·m / |o_i|) / S
      seq_mean_token_sum        Σ v·m / S
      seq_mean_token_sum_const  Σ v·m / (S · C)   (Dr.GRPO's constant normalizer)
      group_token_mean          (1/K) Σ_g Σ_{i∈g} Σ_t v·m / T_g   (per-prompt token mean, then the mean
                                over the K prompts: one reading of DAPO Eq. 8 that some frameworks ship,
                                SkyRL's `prompt_mean`; equals token_mean when every group has T/K tokens)
    T = num_tokens, S = num_seqs, if given: the counts over the whole optimizer step (all
    micro-batches, all data-parallel ranks), so per-micro-batch losses add up to the step
    loss and gradients do not depend on the split. If the data-parallel backend *averages*
    gradients over ranks, multiply the loss by the world size (verl's `dp_size`).
    Defaults: T = Σ mask of this call; S = rows of this call with ≥ 1 token; C = norm_const
    or L. S never counts a fully masked row (a response removed by overlong filtering):
    filtering removes the response from the loss, so it must not shrink the others' weight
    either; callers that pass num_seqs count the same way (`dapo.update`). A count of 0 is
    treated as 1, so empty input gives 0. group_token_mean needs the group of each row: `groups` [N]
    (group indices; T_g and K from this call), or the step's counts `group_tokens` [N] (T_g of row i's
    group over the whole optimizer step) and `num_groups` (K: groups with ≥ 1 loss token), so that it too
    does not depend on the split.

    `seq_mean_token_sum_const` is Dr.GRPO's objective (Liu et al. 2025: per-response token
    sums over a constant, averaged over the responses). verl calls a mode
    `seq-mean-token-sum-norm` but divides each micro-batch's sum by C only (no S); after its
    1/gradient-accumulation factor and the ranks' gradient averaging a step's loss is
    b·Σ v·m / (S·C), b the sequences per micro-batch, so its scale depends on the split. The name
    differs here so that the verl name cannot silently mean the other scale (docs/METRICS.md).
    """
    try:
        fn = AGG_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {sorted(AGG_MODES)}") from None
    return fn(values, mask, num_tokens, num_seqs, norm_const, group_tokens=group_tokens, num_groups=num_groups,
              groups=groups)


# ----------------------------------------------------------------------------------------
# Policy loss
# ----------------------------------------------------------------------------------------

def _masked_mean(x: Tensor, mask: Tensor) -> float:
    """Python float mean of x over mask != 0; 0.0 when nothing is unmasked. x, mask: [N, L]"""
    return (_masked(x.float(), mask.float()).sum() / _positive(mask.sum())).item()


def _log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """log r = logp − old_logp, clamped to [−20, 20] for exp's sake (as verl). [N, L]"""
    return (logp - old_logp).clamp(-20.0, 20.0)


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, eps_low: float, eps_high: float,
                  dual_clip_c: Optional[float] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate per token (Schulman et al. 2017; GRPO, DAPO):
    ℓ = −min(r·Â, clip(r, 1−eps_low, 1+eps_high)·Â), with the dual clip ℓ = min(ℓ, −c·Â) where Â < 0.

    logp, old_logp (detached), adv, mask: [N, L] -> (ℓ [N, L], {"dual_clip": [N, L] bool, "ppo_clipped":
    [N, L] bool, where the clipped term is the smaller one and its gradient is 0}).
    """
    ratio = _log_ratio(logp, old_logp).exp()  # [N, L]
    surr = ratio * adv  # [N, L]
    surr_clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # [N, L]
    loss_tok = -torch.minimum(surr, surr_clipped)  # [N, L]
    dual_active = torch.zeros_like(adv, dtype=torch.bool)  # [N, L]
    if dual_clip_c is not None:
        cap = -dual_clip_c * adv  # [N, L], = c·|Â| where Â < 0
        dual_active = (adv < 0) & (loss_tok > cap)
        loss_tok = torch.where(adv < 0, torch.minimum(loss_tok, cap), loss_tok)
    return loss_tok, {"dual_clip": dual_active, "ppo_clipped": (surr_clipped < surr).detach()}


def gspo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, eps_low: float = 3e-4,
              eps_high: float = 4e-4) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071), token form.

    The ratio is the sequence's geometric mean, s_i = exp((1/|o_i|) Σ_t m·(logπ_θ − logπ_old)) (its
    log clamped to [−20, 20]); every token of sequence i carries s_{i,t} = sg[s_i]·π_θ(t)/sg[π_θ(t)]
    (value s_i, gradient s_i·∇logπ_θ(t)), and ℓ = −min(s·Â, clip(s, 1−eps_low, 1+eps_high)·Â), so a
    clipped sequence loses the gradient of all its tokens. The paper's ε are tiny (3e-4 / 4e-4) and its
    objective is the mean over sequences of the token mean (`seq_mean_token_mean`); with a per-sequence
    Â, that is (1/G) Σ_i min(s_i·Â_i, clip(s_i)·Â_i). When every token of a sequence has the same
    log-ratio, s_i = r_t and ℓ is `ppo_clip_loss`'s.

    logp, old_logp (detached), adv, mask: [N, L] -> (ℓ [N, L], {"seq_clip": [N, L] bool, the tokens of
    sequences whose clip is active: s > 1+eps_high with Â > 0, or s < 1−eps_low with Â < 0}).
    """
    m = mask != 0  # [N, L]
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))  # [N, L]
    seq = (log_ratio.sum(-1, keepdim=True) / _positive(m.sum(-1, keepdim=True))).clamp(-20.0, 20.0)  # [N, 1]
    s_tok = (seq.detach() + logp - logp.detach()).exp()  # [N, L], value s_i, gradient s_i·∇logπ_θ
    surr = s_tok * adv
    surr_clipped = s_tok.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # [N, L]
    loss_tok = -torch.minimum(surr, surr_clipped)
    with torch.no_grad():
        s = seq.exp().expand_as(adv)  # [N, L]
        clipped = ((s > 1.0 + eps_high) & (adv > 0)) | ((s < 1.0 - eps_low) & (adv < 0))
    return loss_tok, {"seq_clip": clipped}


def cispo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, eps_low: Optional[float] = None,
               eps_high: float = 0.28) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

    ℓ = −sg[clip(r, 1−eps_low, 1+eps_high)]·Â·logπ_θ: every token keeps the gradient
    −sg[ŵ]·Â·∇logπ_θ, only its weight ŵ is bounded (eps_low None: no lower bound, as MiniMax, who tuned
    only the upper one). ℓ's value is not a surrogate of the return (it holds logπ_θ); only its gradient
    means something. TRL's `loss_type="cispo"` caps r at `epsilon_high` itself: its ε_max = 1 + eps_high here.

    logp, old_logp (detached), adv, mask: [N, L] -> (ℓ [N, L], {"weight_clip": [N, L] bool, r outside
    the bounds: the weight was clipped}).
    """
    ratio = _log_ratio(logp, old_logp).exp().detach()  # [N, L]
    lo = None if eps_low is None else 1.0 - eps_low
    weight = ratio.clamp(min=lo, max=1.0 + eps_high)  # [N, L], no gradient
    loss_tok = -weight * adv * logp
    clipped = ratio > 1.0 + eps_high
    if lo is not None:
        clipped = clipped | (ratio < lo)
    return loss_tok, {"weight_clip": clipped}


def _covariance(adv: Tensor, logp: Tensor, m: Tensor) -> Tensor:
    """Per-token (Â_t − mean Â)(logπ_t − mean logπ), the means over the tokens of m; [N, L] (no grad)."""
    n = _positive(m.sum())
    a, lp = adv.detach().double(), logp.detach().double()
    mean_a = torch.where(m, a, torch.zeros_like(a)).sum() / n
    mean_lp = torch.where(m, lp, torch.zeros_like(lp)).sum() / n
    return (a - mean_a) * (lp - mean_lp)


def _cov_count(ratio: float, m: Tensor) -> int:
    """max(1, ⌊ratio·T⌋) for T = tokens of m > 0, else 0."""
    t = int(m.sum().item())
    return max(1, math.floor(ratio * t)) if t else 0


def clip_cov_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, eps_low: float, eps_high: float,
                  dual_clip_c: Optional[float] = None, ratio: float = 2e-4, lb: float = 1.0, ub: float = 5.0,
                  generator: Optional[torch.Generator] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    The PPO clipped loss (`ppo_clip_loss`), except that max(1, ⌊ratio·T⌋) tokens (T = the tokens of
    this call) are drawn at random, among the tokens the PPO clip did not already clip whose covariance
    cov_t = (Â_t − mean Â)(logπ_θ,t − mean logπ_θ) (means over the tokens of this call) lies in
    (lb, ub), and their loss and gradient are cut (ℓ := 0). Fewer candidates: all of them. verl's
    defaults: ratio 2e-4, lb 1, ub 5. `generator` draws the tokens (None: torch's global generator).

    logp, old_logp (detached), adv, mask: [N, L] -> (ℓ [N, L], {"cov_selected": [N, L] bool,
    "dual_clip", "ppo_clipped"}).
    """
    loss_tok, extra = ppo_clip_loss(logp, old_logp, adv, mask, eps_low=eps_low, eps_high=eps_high,
                                    dual_clip_c=dual_clip_c)
    with torch.no_grad():
        m = mask != 0
        cov = _covariance(adv, logp, m)  # [N, L]
        cand = (m & ~extra["ppo_clipped"] & (cov > lb) & (cov < ub)).reshape(-1).nonzero().squeeze(-1)
        k = min(_cov_count(ratio, m), cand.numel())
        pick = cand[torch.randperm(cand.numel(), generator=generator)[:k].to(cand.device)]
        selected = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
        selected[pick] = True
        selected = selected.view_as(m)
    loss_tok = torch.where(selected, torch.zeros_like(loss_tok), loss_tok)
    return loss_tok, {**extra, "cov_selected": selected}


def kl_cov_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, ratio: float = 2e-4,
                coef: float = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): no clip; the max(1, ⌊ratio·T⌋) tokens of this call
    with the largest covariance cov_t = (Â_t − mean Â)(logπ_θ,t − mean logπ_θ) get a KL penalty:

        ℓ = −Â·r + coef·|logπ_θ − logπ_old|   on the selected tokens,   ℓ = −Â·r   elsewhere.

    verl's defaults: ratio 2e-4, coef 1. (verl selects max(1, ⌊ratio·T⌋) tokens, as here.)

    logp, old_logp (detached), adv, mask: [N, L] -> (ℓ [N, L], {"cov_selected": [N, L] bool}).
    """
    log_ratio = logp - old_logp  # [N, L]
    loss_tok = -adv * log_ratio.clamp(-20.0, 20.0).exp()
    with torch.no_grad():
        m = mask != 0
        cov = _covariance(adv, logp, m).masked_fill(~m, -math.inf).reshape(-1)  # [N·L]
        top = torch.topk(cov, _cov_count(ratio, m)).indices
        selected = torch.zeros_like(cov, dtype=torch.bool)
        selected[top] = True
        selected = selected.view_as(m)
    loss_tok = torch.where(selected, loss_tok + coef * log_ratio.abs(), loss_tok)
    return loss_tok, {"cov_selected": selected}


POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Tensor]]]] = {
    "ppo_clip": ppo_clip_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}
_USES_PPO_CLIP = ("ppo_clip", "clip_cov")   # the variants that take algo.clip's eps_low, eps_high, dual_clip_c
# a variant's own metric: the fraction of loss tokens where its extra mask is set
VARIANT_METRICS = {"seq_clip": "seq_clip_frac", "weight_clip": "weight_clip_frac", "cov_selected": "cov_selected_frac"}


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: Optional[float] = None,
    agg: str = "token_mean",
    num_tokens: Optional[Count] = None,
    num_seqs: Optional[Count] = None,
    norm_const: Optional[float] = None,
    kind: str = "ppo_clip",
    options: Optional[dict] = None,
    group_tokens: Optional[Tensor] = None,
    num_groups: Optional[Count] = None,
    token_weight: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, float]]:
    """The policy loss `kind` (`POLICY_LOSSES`) per token, then `aggregate`d to a scalar.

    Default (`ppo_clip`): the clipped surrogate ℓ = −min(r·Â, clip(r, 1−eps_low, 1+eps_high)·Â).
    logp, old_logp, mask: [N, L]; advantages: [N] (broadcast over tokens) or [N, L].
    r = exp(logp − old_logp), the log-ratio clamped to [−20, 20] for exp's sake (as verl).
    dual_clip_c (> 1; verl uses 3 by default, the DAPO recipe 10): where Â < 0 the token loss
    is capped at c·|Â| (Ye et al. 2020), i.e. ℓ = min(ℓ, −c·Â).
    eps_low, eps_high and dual_clip_c are `algo.clip`'s: they go to the variants that clip the PPO
    ratio (`ppo_clip`, `clip_cov`); every variant's own keys come in `options` (`gspo`: eps_low,
    eps_high; `cispo`: eps_low, eps_high; `clip_cov`: ratio, lb, ub, generator; `kl_cov`: ratio, coef).
    old_logp and advantages are detached here; only logp receives gradient.
    token_weight: [N, L] ≥ 0 or None, detached: a rollout correction's importance weight w
    (`dapo.corrections`). It multiplies the whole per-token loss, ℓ := w·ℓ(Â), after the variant chose
    its tokens from the unweighted Â (Clip-Cov and KL-Cov select by Cov(Â, logπ), and KL-Cov's penalty
    is weighted too); the token counts of the aggregation do not change.
    The scalar goes through `aggregate(ℓ, mask, agg, num_tokens, num_seqs, norm_const=..., group_tokens=...,
    num_groups=...)`.

    Returns (loss: 0-dim tensor, metrics: dict of python floats over masked tokens; 0.0 when
    no token is unmasked). The ratio metrics are the PPO ratio's, with algo.clip's eps, for every
    variant (so arms compare on one definition):
      clip_frac_high        r > 1+eps_high and Â > 0 (the upper clip is active)
      clip_frac_low         r < 1−eps_low and Â < 0 (the lower clip is active)
      up_clipped_prob_mean  mean current probability exp(logp) of the up-clipped tokens
                            (paper Fig. 3a, "π_θ" of tokens clipped at 1+eps_high)
      up_clipped_count      how many tokens that is
      dual_clip_frac        Â < 0 and ℓ > c·|Â| (the dual clip is active); 0 when off
      approx_kl             k3 estimate of KL(π_old ‖ π_θ): mean of (r − 1) − log r, which
                            is unbiased on π_old's samples and ≥ 0 per token
      ratio_mean, ratio_max r over masked tokens
      token_prob_mean       mean exp(logp) (logged as `train/token_prob_mean`, docs/METRICS.md)
    and the variant's own (`VARIANT_METRICS`), only with that variant:
      seq_clip_frac         gspo: tokens of sequences whose sequence ratio s_i is clipped
      weight_clip_frac      cispo: tokens whose importance weight was clipped
      cov_selected_frac     clip_cov / kl_cov: tokens selected by covariance (cut / penalized)
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable), got {dual_clip_c}")
    try:
        fn = POLICY_LOSSES[kind]
    except KeyError:
        raise ValueError(f"unknown policy loss {kind!r}; valid: {sorted(POLICY_LOSSES)}") from None
    old_logp = old_logp.detach()
    adv = advantages.detach()
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)  # [N, 1]
    adv = adv.expand_as(logp)  # [N, L]

    kw = dict(options or {})
    if kind in _USES_PPO_CLIP:
        kw.update(eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)
    loss_tok, extra = fn(logp, old_logp, adv, mask, **kw)  # [N, L]
    if token_weight is not None:
        loss_tok = loss_tok * token_weight.detach().to(loss_tok.dtype)  # [N, L], w·ℓ(Â)
    loss = aggregate(loss_tok, mask, agg, num_tokens, num_seqs, norm_const=norm_const, group_tokens=group_tokens,
                     num_groups=num_groups)

    with torch.no_grad():
        m = mask != 0  # [N, L]
        ratio = _log_ratio(logp.detach(), old_logp).exp()  # [N, L]
        up = m & (ratio > 1.0 + eps_high) & (adv > 0)  # [N, L]
        low = m & (ratio < 1.0 - eps_low) & (adv < 0)  # [N, L]
        prob = logp.detach().float().exp()  # [N, L]
        up_count = int(up.sum().item())
        dual_active = extra.get("dual_clip", torch.zeros_like(m))
        metrics = {
            "clip_frac_high": _masked_mean(up, m),
            "clip_frac_low": _masked_mean(low, m),
            "up_clipped_prob_mean": (prob[up].mean().item() if up_count else 0.0),
            "up_clipped_count": float(up_count),
            "dual_clip_frac": _masked_mean(dual_active & m, m),
            "approx_kl": _masked_mean(kl_penalty(old_logp, logp.detach(), "k3"), m),
            "ratio_mean": _masked_mean(ratio, m),
            "ratio_max": (ratio[m].max().item() if m.any() else 0.0),
            "token_prob_mean": _masked_mean(prob, m),
        }
        for key, name in VARIANT_METRICS.items():
            if key in extra:
                metrics[name] = _masked_mean(extra[key] & m, m)
    return loss, metrics


# ----------------------------------------------------------------------------------------
# KL estimators (Schulman, "Approximating KL divergence", 2020)
# ----------------------------------------------------------------------------------------

def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    d = (ref_logp - logp).clamp(-20.0, 20.0)  # log(π_ref/π); clamped for exp's sake (as verl)
    return d.exp() - d - 1.0


KL_KINDS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) on tokens sampled from π_θ.

    logp, ref_logp: [N, L] -> [N, L]. With d = ref_logp − logp:
    k1 = −d (unbiased, can be < 0); k2 = d²/2 (biased, ≥ 0); k3 = e^d − d − 1 (unbiased, ≥ 0).
    Unlike verl, k3 is not clamped to [−10, 10] afterwards. Reduce with `aggregate`.
    """
    try:
        fn = KL_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {sorted(KL_KINDS)}") from None
    return fn(logp, ref_logp)


# ----------------------------------------------------------------------------------------
# Per-token quantities from logits, chunked over rows
# ----------------------------------------------------------------------------------------

def _entropy_rows(z: Tensor) -> Tensor:
    # H = logsumexp(z) − Σ softmax(z)·z ; z: [n, V] -> [n]. −inf logits (banned tokens) are
    # raised to the lowest float so that p·z is 0·(−big) = 0 rather than 0·(−inf) = NaN.
    z = z.float().clamp(min=torch.finfo(torch.float32).min)
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)


def _chunked(fn: Callable[..., Tensor], rows: Tensor, *extra: Tensor, chunk_size: Optional[int]) -> Tensor:
    """fn over row chunks of rows: [M, V] (and extra: [M, ...]) -> [M].

    With autograd on, each chunk is checkpointed: the forward keeps no [chunk, V]
    intermediates alive and the backward recomputes them one chunk at a time. A caller that
    chunks already (`dapo.logprobs`, by positions) passes chunk_size ≥ M: one level of chunks only.
    """
    if chunk_size is None:
        chunk_size = default_chunk_rows(rows.shape[-1])
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    if rows.shape[0] <= chunk_size:  # one chunk: checkpointing would only add a recompute
        return fn(rows, *extra)
    grad = torch.is_grad_enabled() and rows.requires_grad
    # torch.split, not slicing: a slice's backward zero-fills a gradient of the whole input for every chunk
    # and adds them up; split's backward concatenates the chunks' gradients once
    parts = zip(*(torch.split(t, chunk_size) for t in (rows, *extra)))
    return torch.cat([checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args) for args in parts])


def token_entropy(logits: Tensor, chunk_size: Optional[int] = None) -> Tensor:
    """Entropy −Σ_v p log p of the distribution at each position.

    logits: [N, L, V] (any float dtype) -> [N, L] float32. Computed over chunks of
    `chunk_size` of the N·L rows (default: ~16 MiB of float32 per chunk, so a 150k
    vocabulary needs only [27, V] of scratch); works with and without autograd.
    """
    n, l, v = logits.shape
    return _chunked(_entropy_rows, logits.reshape(n * l, v), chunk_size=chunk_size).view(n, l)


def _logprob_rows(z: Tensor, ids: Tensor) -> Tensor:
    # log softmax(z)[id] = z[id] − logsumexp(z) ; z: [n, V], ids: [n] -> [n]
    z = z.float()
    return z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def logprobs_from_logits(logits: Tensor, ids: Tensor, chunk_size: Optional[int] = None) -> Tensor:
    """log π(ids) under softmax(logits).

    logits: [N, L, V]; ids: [N, L] int64 token ids -> [N, L] float32. Chunked over the N·L
    rows like `token_entropy` (no [N, L, V] log_softmax is materialized).
    """
    n, l, v = logits.shape
    rows = logits.reshape(n * l, v)
    return _chunked(_logprob_rows, rows, ids.reshape(n * l), chunk_size=chunk_size).view(n, l)


# ----------------------------------------------------------------------------------------
# Overlong shaping and dynamic-sampling helpers
# ----------------------------------------------------------------------------------------

def soft_overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (paper Eq. 13), added to the reward.

    lengths: [N] response lengths in tokens -> [N] float. With E = max_len − cache_len:
      0                            if len ≤ E          (len = E is not punished)
      (E − len) / cache_len · f    if E < len ≤ max_len (len = E+1 gives −f/cache_len,
                                                         len = max_len gives exactly −f)
      −f                           if len > max_len
    verl (recipe/dapo reward manager) computes min(−(len − E)/cache_len · f, 0), the same
    for every len ≤ max_len; it does not clamp beyond max_len, which generation never exceeds.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    if factor < 0:
        raise ValueError(f"factor must be ≥ 0, got {factor}")
    expected = max_len - cache_len
    penalty = (expected - lengths.to(torch.get_default_dtype())) / cache_len * factor  # [N]
    return penalty.clamp(min=-factor, max=0.0)


def overlong_mask(truncated: Tensor) -> Tensor:
    """Overlong filtering: truncated: [N] bool (no EOS within the limit) -> [N] float,
    0.0 for truncated responses, 1.0 otherwise. Multiply into the token mask: mask * m[:, None]."""
    return (~truncated.bool()).to(torch.get_default_dtype())


def top_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Top-entropy token selection (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority
    Tokens Drive Effective RL for LLM Reasoning", arXiv 2506.01939; TRL `top_entropy_quantile`).

    entropy, mask: [N, L] -> [N, L] 0/1 in mask's dtype: of the T tokens where mask != 0, the
    k = ⌈quantile·T⌉ with the highest entropy (ties: the earlier in row-major order), so exactly k are
    kept; quantile = 1 returns the mask's support itself (the identity on a 0/1 mask). Multiply into the
    loss mask: the others leave the numerator and the token counts. TRL instead keeps every token at or
    above the quantile threshold of the current policy's entropies of one micro-batch (ties: more);
    here the entropies are π_old's over the whole rollout step, so the selection does not depend on the
    split (dapo.train).
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    m = mask != 0  # [N, L]
    if quantile >= 1:
        return m.to(mask.dtype)
    k = math.ceil(round(quantile * int(m.sum().item()), 9))  # round: 0.2·15 is 3.0000000000000004
    flat = entropy.detach().float().masked_fill(~m, -math.inf).reshape(-1)  # [N·L]
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[torch.sort(flat, descending=True, stable=True).indices[:k]] = True
    return (keep.view_as(m) & m).to(mask.dtype)


def informative_groups(correct: Tensor, min_acc: float = 0.0, max_acc: float = 1.0) -> Tensor:
    """Dynamic sampling's band: correct: [B, G] bool -> [B] bool, True where min_acc < #correct/G < max_acc.

    The defaults are DAPO's rule, 0 < #correct < G (a group all correct or all wrong has Â = 0). A band such
    as (0.2, 0.8) keeps only groups of middling accuracy (`algo.dynamic_sampling.min_acc` / `max_acc`). The
    accuracy is the float n/G, so a bound given as the same fraction (0.25 with G = 4) compares as equal.
    """
    n = correct.bool().sum(-1)  # [B]
    acc = n.double() / correct.shape[-1]  # [B]; n/G rounded as Python rounds the literal of the same fraction
    return (acc > min_acc) & (acc < max_acc)


DS_MODES = ("refill", "filter", "mask")


def dynamic_sampling_keep(correct: Tensor, mode: str, min_acc: float = 0.0,
                          max_acc: float = 1.0) -> tuple[Tensor, Tensor]:
    """Which of B' generated groups stay in the batch, and which of those enter the loss.

    correct: [B', G] bool -> (batch [B'] bool, loss [B'] bool), with band = `informative_groups`:
      refill  (DAPO) batch = loss = band; the caller generates more rounds until B groups are kept
      filter  batch = loss = band; one round, no refill: the batch shrinks
      mask    batch = every group, loss = band: the others stay in the batch with loss weight 0, so they
              leave every token and sequence count (`mask_groups`)
    """
    if mode not in DS_MODES:
        raise ValueError(f"unknown dynamic sampling mode {mode!r}; valid: {list(DS_MODES)}")
    band = informative_groups(correct, min_acc, max_acc)  # [B']
    return (torch.ones_like(band) if mode == "mask" else band), band


def mask_groups(mask: Tensor, in_loss: Optional[Tensor]) -> Tensor:
    """Zero the loss mask of the groups outside the loss (dynamic sampling `mask`).

    mask: [N, L], group-major (row i = b·G + g); in_loss: [B] bool, or None (every group) -> [N, L].
    """
    if in_loss is None:
        return mask
    g = mask.shape[0] // max(in_loss.shape[0], 1)
    return mask * in_loss.to(mask.dtype).repeat_interleave(g)[:, None]  # [N, L]


def group_stats(correct: Tensor) -> dict[str, float]:
    """correct: [B, G] bool -> fractions of groups all correct / all wrong / mixed (0.0 if B = 0)."""
    c = correct.bool()
    b = max(c.shape[0], 1)
    all_correct = c.all(-1).sum().item() / b
    all_wrong = (~c).all(-1).sum().item() / b
    mixed = informative_groups(c).sum().item() / b
    return {"all_correct_frac": all_correct, "all_wrong_frac": all_wrong, "mixed_frac": mixed}
