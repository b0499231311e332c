"""The behaviour policy: how far the rollout engine's distribution is from the trainer's, and the
corrections for it (docs/METRICS.md, ``mismatch/*``; ``algo.rollout_correction``).

Three policies: π_rollout (what the engine sampled from; its log-probs come back with the tokens,
after temperature, ``Completion.logprobs``), π_old (the trainer's model at the start of the rollout
step, the clipping anchor) and π_θ (being updated). Per response token

    ρ_t = π_old(o_t) / π_rollout(o_t)          (the rollout–training mismatch)

and r_t = π_θ/π_old is the PPO ratio. Every weight here is detached: a change of measure, never
something to optimise. Shapes: N responses, L tokens (padded); ``mask`` [N, L] marks real tokens.

Corrections (:data:`CORRECTIONS`; each returns ``(weight [N, L], keep [N, L])``: the weight multiplies
the token's loss, a token with keep 0 leaves the loss's numerator and its token count):

- ``tis``: truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training"): w_t = min(ρ_t, C), or per sequence w_i = min(Π_t ρ_t, C).
- ``mis``: masked importance sampling (Liu et al. 2025, "When speed kills stability"): w = ρ where
  ρ ∈ [lo, hi] (per token, or the sequence's Π ρ), else the token (sequence) is rejected.
- ``icepop``: IcePop (Ling team 2025, Ring-1T): tokens with ρ outside the band [lo, hi] are
  rejected, the others keep weight 1 (the gradient of the discrepant tokens is popped).
- ``geo_rs``: geometric-mean rejection sampling: ρ_geo,i = exp(mean_t log ρ_t); a sequence outside
  [lo, hi] is rejected (length-invariant, unlike Π ρ); weight 1.

The weight multiplies the whole per-token loss, w·ℓ(Â) (:func:`apply` hands it to the update, which
passes it to :func:`dapo.algo.policy_loss` as ``token_weight``), for every ``algo.policy_loss``. Folding
it into the advantage instead, ℓ(w·Â), is the same only where ℓ is positively homogeneous in Â: the
clipped surrogate (min(w·a, w·b) = w·min(a, b) for w ≥ 0), GSPO and CISPO. It is not for Clip-Cov and
KL-Cov: they choose their tokens by Cov(Â, logπ), which w·Â would change, and KL-Cov's penalty
coef·|logπ − logπ_old| does not carry Â at all.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

__all__ = ["CORRECTIONS", "LENGTH_BUCKETS", "correction", "apply", "mismatch_metrics"]

_LOG_CLAMP = 20.0
"""|log ρ| (and a sequence's Σ log ρ) are clamped to this before exp, as the PPO ratio is."""


def _log_rho(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> Tensor:
    """[N, L] log ρ on real tokens, 0 elsewhere (so sums over a row are the sequence's)."""
    return ((old_logp - rollout_logp) * mask).clamp(-_LOG_CLAMP, _LOG_CLAMP)


def _seq_log_rho(log_rho: Tensor) -> Tensor:
    """[N, 1] Σ_t log ρ_t per sequence, clamped."""
    return log_rho.sum(-1, keepdim=True).clamp(-_LOG_CLAMP, _LOG_CLAMP)


def _tis(log_rho: Tensor, mask: Tensor, level: str, cap: float, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """w = min(ρ, C) per token, or min(Π ρ, C) per sequence; nothing rejected."""
    rho = log_rho.exp() if level == "token" else _seq_log_rho(log_rho).exp().expand_as(log_rho)
    return rho.clamp(max=cap) * mask, mask.clone()


def _mis(log_rho: Tensor, mask: Tensor, level: str, cap: float, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """w = ρ (token) or Π ρ (sequence) inside [lo, hi]; outside, rejected."""
    rho = log_rho.exp() if level == "token" else _seq_log_rho(log_rho).exp().expand_as(log_rho)
    keep = mask * ((rho >= lo) & (rho <= hi)).to(mask.dtype)
    return rho * keep, keep


def _icepop(log_rho: Tensor, mask: Tensor, level: str, cap: float, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """Tokens with ρ outside [lo, hi] rejected, weight 1 inside (token level only)."""
    rho = log_rho.exp()
    keep = mask * ((rho >= lo) & (rho <= hi)).to(mask.dtype)
    return keep.clone(), keep


def _geo_rs(log_rho: Tensor, mask: Tensor, level: str, cap: float, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """Sequences whose exp(mean_t log ρ_t) is outside [lo, hi] rejected; weight 1."""
    n = mask.sum(-1, keepdim=True).clamp(min=1.0)
    geo = (log_rho.sum(-1, keepdim=True) / n).exp()                                    # [N, 1]
    keep = mask * ((geo >= lo) & (geo <= hi)).to(mask.dtype)
    return keep.clone(), keep


CORRECTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "tis": _tis, "mis": _mis, "icepop": _icepop, "geo_rs": _geo_rs}
"""``algo.rollout_correction.mode`` → its function (``none``: no function, nothing changes)."""


@torch.no_grad()
def correction(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, mode: str, *, level: str = "token",
               cap: float = 2.0, lo: float = 0.5, hi: float = 2.0) -> tuple[Tensor, Tensor]:
    """(weight [N, L], keep [N, L]) of correction ``mode`` (module docstring); detached.

    old_logp, rollout_logp, mask: [N, L]. Masked-out tokens get weight 0 and keep 0."""
    if mode not in CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; valid: {['none', *CORRECTIONS]}")
    mask = mask.float()
    return CORRECTIONS[mode](_log_rho(old_logp.float(), rollout_logp.float(), mask), mask, level, cap, lo, hi)


def apply(loss_mask: Tensor, weight: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """(per-token loss weight [N, L] = w, loss mask [N, L] × keep): the weights multiply each token's loss
    (``token_weight`` of :func:`dapo.algo.policy_loss`; the advantages stay Â), the rejections leave the
    loss through the mask (out of numerator and token count). loss_mask, weight, keep: [N, L]."""
    return weight * keep, loss_mask * keep


LENGTH_BUCKETS = (16, 64, 256, 1024, 4096)
"""Upper edges (tokens) of the response-length buckets the mismatch is also reported by; longer: ``gt4096``."""


def _bucket_name(n: int) -> str:
    for edge in LENGTH_BUCKETS:
        if n <= edge:
            return f"le{edge}"
    return f"gt{LENGTH_BUCKETS[-1]}"


@torch.no_grad()
def mismatch_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor,
                     weight: Tensor | None = None, keep: Tensor | None = None) -> dict[str, float]:
    """``mismatch/*`` over the real response tokens (mask [N, L]); all inputs [N, L].

    kl: mean(log π_rollout − log π_old), KL(π_rollout‖π_old) estimated on the rollout's own samples;
    k3: mean(ρ − log ρ − 1) ≥ 0; abs_diff_mean / abs_diff_max: |log π_old − log π_rollout|;
    ppl_ratio: mean over sequences of exp(−mean_t log ρ_t) (π_rollout's perplexity over π_old's);
    chi2_token: mean(ρ²) − 1; chi2_seq: mean over sequences of (Π_t ρ_t)² − 1 (log clamped at 20);
    with a correction's ``weight``/``keep``: is_weight_mean/min/max over the kept tokens,
    ess = (Σw)² / (n·Σw²) over them, and masked_frac (tokens rejected); k3 also by response length,
    ``k3_len_le16`` … (:data:`LENGTH_BUCKETS`, the buckets present)."""
    m = mask.float()
    n_tok = float(m.sum())
    if n_tok == 0:
        return {}
    log_rho = _log_rho(old_logp.float(), rollout_logp.float(), m)                            # [N, L]
    rho = log_rho.exp()
    k3 = (rho - log_rho - 1) * m
    lens = m.sum(-1)                                                                          # [N]
    rows = lens > 0
    seq_log = _seq_log_rho(log_rho)[:, 0]
    out = {
        "mismatch/kl": float((-log_rho * m).sum() / n_tok),
        "mismatch/k3": float(k3.sum() / n_tok),
        "mismatch/abs_diff_mean": float((log_rho.abs() * m).sum() / n_tok),
        "mismatch/abs_diff_max": float((log_rho.abs() * m).max()),
        "mismatch/ppl_ratio": float((-(log_rho.sum(-1)[rows] / lens[rows])).exp().mean()),
        "mismatch/chi2_token": float((rho.pow(2) * m).sum() / n_tok - 1),
        "mismatch/chi2_seq": float((2 * seq_log[rows]).exp().mean() - 1),
    }
    buckets: dict[str, list[int]] = {}
    for i, n in enumerate(lens.tolist()):
        if n > 0:
            buckets.setdefault(_bucket_name(int(n)), []).append(i)
    for name, idx in buckets.items():
        out[f"mismatch/k3_len_{name}"] = float(k3[idx].sum() / m[idx].sum())
    if weight is not None and keep is not None:
        kept = keep.float() * m
        w = weight.float()[kept > 0]
        out["mismatch/masked_frac"] = 1.0 - float(kept.sum()) / n_tok
        if w.numel():
            out.update({"mismatch/is_weight_mean": float(w.mean()), "mismatch/is_weight_min": float(w.min()),
                        "mismatch/is_weight_max": float(w.max()),
                        "mismatch/ess": float(w.sum() ** 2 / (w.numel() * w.pow(2).sum()).clamp(min=1e-30))})
    return {k: v for k, v in out.items() if math.isfinite(v) or k.startswith("mismatch/chi2")}
