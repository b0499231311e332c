"""Group filters: dynamic sampling's band and modes (DAPO Eq. 11) and group statistics.

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor



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
