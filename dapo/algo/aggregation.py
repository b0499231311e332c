"""Aggregation: the single place a per-token loss becomes a scalar (verl's ``agg_loss``).

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor


Count = Union[int, float, Tensor]  # a token or sequence count; may be a 0-dim tensor after all_reduce


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
