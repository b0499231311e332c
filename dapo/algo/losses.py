"""The policy losses (a registry, each with its paper) and ``policy_loss``, which calls one and aggregates it.

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor

from dapo.algo.aggregation import Count, _masked, _positive, aggregate
from dapo.algo.kl import kl_penalty


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
