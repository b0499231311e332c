"""Per-token entropy and log-probabilities from logits, chunked over rows (checkpointed under autograd).

Notation: dapo.algo (B, G, N = B·G, L, V; ``mask: [N, L]``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from dapo.config import default_chunk_rows


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
