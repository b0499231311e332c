"""One level of chunks in the log-prob path (issue 38): ``train.logits_chunk_tokens`` chunks by positions and
dapo.algo then computes each chunk whole (nested checkpointed row chunks recomputed each chunk twice and
zero-filled a float32 gradient of the outer chunk per inner chunk); the chunks are ``torch.split`` views,
never slices; the gradients stay bit for bit what they were."""

from __future__ import annotations

import pytest
import torch

from dapo.train.logprobs import token_entropy, token_logprobs

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
    from dapo.algo import entropy
    rows = entropy._logprob_rows
    monkeypatch.setattr(entropy, "_logprob_rows", lambda z, ids: calls.append(z.shape[0]) or rows(z, ids))
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


# ---------------------------------------------------------------- π_old's rows gathered as tensors (2 ranks)
def _worker_old_logprobs(out: str) -> None:
    """2 gloo ranks: old_logprobs over world 2 (each rank its share) in every entropy mode, with pickling
    collectives forbidden, beside the one-process result of the same model and batch."""
    import torch.distributed as dist

    from dapo.dist.distributed import destroy_distributed, init_distributed
    from dapo.train.logprobs import old_logprobs
    from dapo.train.update import old_policy_metrics
    from tests.test_train import _cfg, _random_batch, _tiny_policy
    d = init_distributed(60)
    torch.set_num_threads(1)
    cfg = _cfg(**{"rollout.n": 4, "train.batch_prompts": 4, "train.mini_batch_prompts": 4, "train.micro_batch_seqs": 2,
                  "algo.dynamic_sampling.enabled": "false", "model.autocast_bf16": "false"})
    model, batch = _tiny_policy(0), _random_batch(B=5)
    ref = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False)
    res = {"ref": ref, "ref_metrics": old_policy_metrics(ref[0], ref[1], ref[2])}

    def no_pickles(*a, **k):
        raise AssertionError("old_logprobs pickled its rows")
    dist.all_gather_object, dist.broadcast_object_list = no_pickles, no_pickles
    for mode in ("rows", "local", "none"):
        res[mode] = old_logprobs(model, batch, cfg, 0, torch.device("cpu"), False, d.rank, d.world, entropy=mode)
    torch.save(res, f"{out}.rank{d.rank}")
    destroy_distributed(d.world)


def test_old_logprobs_on_two_ranks_gather_tensors_and_the_entropy_only_where_needed(tmp_path):
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "res"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(repo)}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                        "127.0.0.1", "--master_port", str(port), "-m", "tests.test_logprob_chunks", str(out)],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    from dapo.train.update import old_policy_metrics
    r0, r1 = (torch.load(f"{out}.rank{r}", weights_only=False) for r in (0, 1))
    logp, ent, mask = r0["ref"]
    # the one-process pass batches the rows otherwise (other padding), so it agrees to float32 rounding;
    # the ranks and the modes agree bit for bit
    for r in (r0, r1):
        for mode in ("rows", "local", "none"):
            assert torch.equal(r[mode][0], r0["rows"][0]) and torch.equal(r[mode][2], mask), mode
        assert torch.equal(r["rows"][1], r0["rows"][1]) and r["none"][1] is None
    torch.testing.assert_close(r0["rows"][0], logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(r0["rows"][1], ent, rtol=0, atol=1e-5)
    # local: each rank its own rows, 0 elsewhere; together every row once
    own0, own1 = r0["local"][1], r1["local"][1]
    assert torch.equal(own0 + own1, r0["rows"][1]) and bool(((own0 != 0) & (own1 != 0)).sum() == 0)
    assert 0 < int((own0 != 0).any(-1).sum()) < len(ent)
    # the metric from each rank's own rows, summed over the ranks (here: by hand), is the one-process metric
    m = old_policy_metrics(r0["rows"][0], own0 + own1, mask)
    assert m == pytest.approx(r0["ref_metrics"], rel=1e-5)


if __name__ == "__main__":
    import sys
    _worker_old_logprobs(sys.argv[1])
