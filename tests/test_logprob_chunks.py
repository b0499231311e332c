"""One level of chunks in the log-prob path (issue 38): ``train.logits_chunk_tokens`` chunks by positions and
dapo.algo then computes each chunk whole (nested checkpointed row chunks recomputed each chunk twice and
zero-filled a float32 gradient of the outer chunk per inner chunk); the chunks are ``torch.split`` views,
never slices; the gradients stay bit for bit what they were."""

from __future__ import annotations

import pytest
import torch

from dapo import algo
from dapo.logprobs import token_entropy, token_logprobs

V = 70_000          # dapo.algo's default row chunk at this vocabulary: max(16, 2**22 // V) = 59 rows


def _inputs(n=2, L=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, L + 1, V, generator=g) * 2                                 # [n, L + 1, V] like a forward
    return base, torch.randint(0, V, (n, L), generator=g), torch.randn(n, L, generator=g)


def _grad(base, tgt, w, chunk, temperature=1.0):
    x = base.clone().requires_grad_(True)
    logits = x[:, :tgt.shape[1]]
    lp = token_logprobs(logits, tgt, temperature, chunk)
    ent = token_entropy(logits, temperature, chunk)
    ((lp * w).sum() + (ent * w).sum()).backward()
    return lp.detach(), ent.detach(), x.grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_every_chunking_gives_the_same_bits_at_a_large_vocabulary(temperature):
    base, tgt, w = _inputs()
    ref = _grad(base, tgt, w, None, temperature)                  # dapo.algo's row chunks (80 rows > 59)
    for chunk in (32, 64, 80, 10_000):                            # 16, 32, 40 (one chunk) positions
        for a, b in zip(_grad(base, tgt, w, chunk, temperature), ref):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_position_chunk_is_computed_whole_once_forward_and_once_recomputed(monkeypatch):
    """2 chunks of 20 positions × 4 sequences = 80 rows each, more than dapo.algo's default row chunk (59):
    one row-function call per chunk in the forward and one in the backward's recompute, 4 in all (nested:
    59 + 21 rows per chunk, each recomputed twice; at the paper's 2,048-row chunks of a 152k vocabulary, 76
    inner chunks each)."""
    base, tgt, w = _inputs(n=4)
    calls = []
    rows = algo._logprob_rows
    monkeypatch.setattr(algo, "_logprob_rows", lambda z, ids: calls.append(z.shape[0]) or rows(z, ids))
    x = base.clone().requires_grad_(True)
    (token_logprobs(x[:, :40], tgt, 1.0, 80) * w).sum().backward()
    assert calls == [80] * 4


def _node_names(t: torch.Tensor) -> list[str]:
    seen, out, todo = set(), [], [t.grad_fn]
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        out.append(type(f).__name__)
        todo += [n for n, _ in f.next_functions]
    return out


@pytest.mark.parametrize("chunk", [None, 20])
def test_chunks_are_split_views_whose_backward_concatenates_once(chunk):
    """No SliceBackward per chunk (each zero-fills a gradient of the whole input); one SplitBackward."""
    base, tgt, _ = _inputs()
    x = base.clone().requires_grad_(True)
    names = _node_names(token_logprobs(x[:, :40], tgt, 1.0, chunk))
    assert names.count("SliceBackward0") == 1                     # the caller's own x[:, :L]
    assert names.count("SplitBackward0") + names.count("SplitWithSizesBackward0") == 1
