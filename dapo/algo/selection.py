"""Token selection: the top-entropy tokens of a rollout step (Wang et al. 2025).

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor



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
