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

from dapo.eval_metrics import avg_at_k, cons_at_k, majority_answers, pass_at_k  # noqa: F401  (evaluation helpers, re-exported)

Count = Union[int, float, Tensor]  # a token or sequence count; may be a 0-dim tensor after all_reduce

__all__ = [
    "AGG_MODES", "KL_KINDS", "aggregate", "avg_at_k", "cons_at_k", "group_advantages",
    "group_stats", "informative_groups", "kl_penalty", "logprobs_from_logits",
    "majority_answers", "overlong_mask", "pass_at_k", "policy_loss", "soft_overlong_penalty",
    "token_entropy",
]


# ----------------------------------------------------------------------------------------
# Advantages
# ----------------------------------------------------------------------------------------

def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO advantage Â_i = (R_i − mean_g R) / (std_g R + eps), per group (row).

    rewards: [B, G] one scalar reward per response -> [B, G] (broadcast over tokens later).
    std is the unbiased (G−1) sample std, as `torch.std` in verl's GRPO estimator.
    A group whose rewards are all equal (including G = 1) gets exactly 0, never NaN.
    (verl gives a G = 1 group its raw reward instead; here it carries no signal.)
    """
    r = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    if r.shape[-1] < 2 or r.numel() == 0:  # std undefined for G = 1; no group kept: nothing to normalise
        return torch.zeros_like(r)           # (torch.std of [0, G] warns "degrees of freedom is <= 0")
    mean = r.mean(dim=-1, keepdim=True)  # [B, 1]
    std = r.std(dim=-1, keepdim=True)  # [B, 1], unbiased
    adv = (r - mean) / (std + eps)  # [B, G]
    constant = (r == r[..., :1]).all(dim=-1, keepdim=True)  # [B, 1]
    return torch.where(constant, torch.zeros_like(adv), adv)


# ----------------------------------------------------------------------------------------
# Aggregation: the single place a per-token loss becomes a scalar
# ----------------------------------------------------------------------------------------

def _positive(x: Count) -> Count:
    """x, or 1 where x < 1: an empty batch divides 0 by 1 instead of by 0."""
    return x.clamp(min=1) if isinstance(x, Tensor) else max(x, 1)


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """values · mask with masked positions exactly 0, even where values is inf/NaN. [N, L]"""
    return torch.where(mask != 0, values * mask, torch.zeros_like(values))


def _token_mean(values, mask, num_tokens, num_seqs, norm_const):
    # Σ_i Σ_t ℓ·m / T, T = tokens of the whole optimizer step (DAPO Eq. 8/12)
    total = mask.sum() if num_tokens is None else num_tokens
    return _masked(values, mask).sum() / _positive(total)


def _seq_counts(mask: Tensor, num_seqs: Optional[Count]) -> Count:
    # S: sequences with at least one loss token. A fully masked row (overlong filtering) is
    # not a sequence of the loss: it neither adds to the sum nor to the count (as verl).
    return _positive((mask.sum(-1) > 0).sum() if num_seqs is None else num_seqs)


def _seq_mean_token_mean(values, mask, num_tokens, num_seqs, norm_const):
    # 1/S Σ_i (1/|o_i|) Σ_t ℓ·m  (GRPO Eq. 5)
    per_seq = _masked(values, mask).sum(-1) / _positive(mask.sum(-1))  # [N]
    return per_seq.sum() / _seq_counts(mask, num_seqs)


def _seq_mean_token_sum(values, mask, num_tokens, num_seqs, norm_const):
    # 1/S Σ_i Σ_t ℓ·m
    return _masked(values, mask).sum() / _seq_counts(mask, num_seqs)


def _seq_mean_token_sum_const(values, mask, num_tokens, num_seqs, norm_const):
    # Dr.GRPO: 1/S Σ_i (1/C) Σ_t ℓ·m, C = norm_const or L (a constant, not |o_i|)
    const = mask.shape[-1] if norm_const is None else norm_const
    return _masked(values, mask).sum() / (_seq_counts(mask, num_seqs) * const)


AGG_MODES: dict[str, Callable[..., Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum": _seq_mean_token_sum,
    "seq_mean_token_sum_const": _seq_mean_token_sum_const,
}


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    num_tokens: Optional[Count] = None,
    num_seqs: Optional[Count] = None,
    *,
    norm_const: Optional[float] = None,
) -> Tensor:
    """Reduce a per-token quantity to a scalar.

    values: [N, L]; mask: [N, L] (0/1 or float weights; masked entries are ignored even if
    inf/NaN). Returns a 0-dim tensor. Modes (`AGG_MODES`):
      token_mean                Σ v·m / T
      seq_mean_token_mean       Σ_i (Σ_t v·m / |o_i|) / S
      seq_mean_token_sum        Σ v·m / S
      seq_mean_token_sum_const  Σ v·m / (S · C)   (Dr.GRPO's constant normalizer)
    T = num_tokens, S = num_seqs, if given: the counts over the whole optimizer step (all
    micro-batches, all data-parallel ranks), so per-micro-batch losses add up to the step
    loss and gradients do not depend on the split. If the data-parallel backend *averages*
    gradients over ranks, multiply the loss by the world size (verl's `dp_size`).
    Defaults: T = Σ mask of this call; S = rows of this call with ≥ 1 token; C = norm_const
    or L. S never counts a fully masked row (a response removed by overlong filtering):
    filtering removes the response from the loss, so it must not shrink the others' weight
    either; callers that pass num_seqs count the same way (`dapo.update`). A count of 0 is
    treated as 1, so empty input gives 0.

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
    return fn(values, mask, num_tokens, num_seqs, norm_const)


# ----------------------------------------------------------------------------------------
# Policy loss
# ----------------------------------------------------------------------------------------

def _masked_mean(x: Tensor, mask: Tensor) -> float:
    """Python float mean of x over mask != 0; 0.0 when nothing is unmasked. x, mask: [N, L]"""
    return (_masked(x.float(), mask.float()).sum() / _positive(mask.sum())).item()


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
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss, ℓ = −min(r·Â, clip(r, 1−eps_low, 1+eps_high)·Â) per token.

    logp, old_logp, mask: [N, L]; advantages: [N] (broadcast over tokens) or [N, L].
    r = exp(logp − old_logp), the log-ratio clamped to [−20, 20] for exp's sake (as verl).
    dual_clip_c (> 1; verl uses 3 by default, the DAPO recipe 10): where Â < 0 the token loss
    is capped at c·|Â| (Ye et al. 2020), i.e. ℓ = min(ℓ, −c·Â).
    old_logp and advantages are detached here; only logp receives gradient.
    The scalar goes through `aggregate(ℓ, mask, agg, num_tokens, num_seqs, norm_const=...)`.

    Returns (loss: 0-dim tensor, metrics: dict of python floats over masked tokens; 0.0 when
    no token is unmasked):
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
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable), got {dual_clip_c}")
    old_logp = old_logp.detach()
    adv = advantages.detach()
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)  # [N, 1]
    adv = adv.expand_as(logp)  # [N, L]

    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # [N, L]
    ratio = log_ratio.exp()  # [N, L]
    surr = ratio * adv  # [N, L]
    surr_clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # [N, L]
    loss_tok = -torch.minimum(surr, surr_clipped)  # [N, L]
    dual_active = torch.zeros_like(adv, dtype=torch.bool)  # [N, L]
    if dual_clip_c is not None:
        cap = -dual_clip_c * adv  # [N, L], = c·|Â| where Â < 0
        dual_active = (adv < 0) & (loss_tok > cap)
        loss_tok = torch.where(adv < 0, torch.minimum(loss_tok, cap), loss_tok)
    loss = aggregate(loss_tok, mask, agg, num_tokens, num_seqs, norm_const=norm_const)

    with torch.no_grad():
        m = mask != 0  # [N, L]
        up = m & (ratio > 1.0 + eps_high) & (adv > 0)  # [N, L]
        low = m & (ratio < 1.0 - eps_low) & (adv < 0)  # [N, L]
        prob = logp.detach().float().exp()  # [N, L]
        up_count = int(up.sum().item())
        metrics = {
            "clip_frac_high": _masked_mean(up, m),
            "clip_frac_low": _masked_mean(low, m),
            "up_clipped_prob_mean": (prob[up].mean().item() if up_count else 0.0),
            "up_clipped_count": float(up_count),
            "dual_clip_frac": _masked_mean(dual_active & m, m),
            "approx_kl": _masked_mean(kl_penalty(old_logp, logp.detach(), "k3"), m),
            "ratio_mean": _masked_mean(ratio.detach(), m),
            "ratio_max": (ratio.detach()[m].max().item() if m.any() else 0.0),
            "token_prob_mean": _masked_mean(prob, m),
        }
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
    intermediates alive and the backward recomputes them one chunk at a time.
    """
    if chunk_size is None:  # ~16 MiB of float32 scratch per chunk: 64k rows at V=64, 27 rows at 150k
        chunk_size = max(16, (1 << 22) // max(rows.shape[-1], 1))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    if rows.shape[0] <= chunk_size:  # one chunk: checkpointing would only add a recompute
        return fn(rows, *extra)
    grad = torch.is_grad_enabled() and rows.requires_grad
    outs = []
    for start in range(0, rows.shape[0], chunk_size):
        args = [t[start : start + chunk_size] for t in (rows, *extra)]
        outs.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    if not outs:
        return rows.new_zeros(0, dtype=torch.float32)
    return torch.cat(outs)


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


def informative_groups(correct: Tensor) -> Tensor:
    """Dynamic sampling keep-mask: correct: [B, G] bool -> [B] bool, True where 0 < #correct < G."""
    n = correct.bool().sum(-1)  # [B]
    return (n > 0) & (n < correct.shape[-1])


def group_stats(correct: Tensor) -> dict[str, float]:
    """correct: [B, G] bool -> fractions of groups all correct / all wrong / mixed (0.0 if B = 0)."""
    c = correct.bool()
    b = max(c.shape[0], 1)
    all_correct = c.all(-1).sum().item() / b
    all_wrong = (~c).all(-1).sum().item() / b
    mixed = informative_groups(c).sum().item() / b
    return {"all_correct_frac": all_correct, "all_wrong_frac": all_wrong, "mixed_frac": mixed}
