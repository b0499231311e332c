"""Overlong reward shaping (DAPO Eq. 13) and overlong filtering.

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations


import torch
from torch import Tensor



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
