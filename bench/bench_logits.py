"""The log-prob path from the logits at a large vocabulary: forward + backward time, and the gradient's checksum.

What one micro-batch's ``ResponseLogits.logprobs`` costs between the lm_head and the loss: the float32
log-softmax at the rollout temperature, chunked by ``train.logits_chunk_tokens``, under autograd, then its
backward into the logits. The model is left out (the logits are a random leaf, [n, L + 1, V] sliced to
[n, L] as ``response_logits`` returns them), so only this path's own work is timed.

    python -m bench.bench_logits                          # L = 512, V = 152,064 (Qwen2.5), chunk 2048, 1 thread
    python -m bench.bench_logits --positions 2048 --dtype bf16 --entropy

Before/after a change, run the same script over two checkouts of ``dapo/`` (the script imports whichever
``dapo`` comes first on the path):

    git archive <commit> dapo | tar -x -C /tmp/before && PYTHONPATH=/tmp/before python -m bench.bench_logits

The checksum (sha256 of the logits' gradient bytes) says whether two runs computed the same gradient, bit
for bit. Timings are medians of ``--repeats`` after one warm-up; on a shared machine they move with the load
(the script prints the load average before and after).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import time
from pathlib import Path


def _commit(mod_file: str) -> str:
    """The commit of the checkout ``dapo`` was imported from (or 'unknown' outside a git tree)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(mod_file).parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown (not a git checkout)"
    except OSError:
        return "unknown"


def run(positions: int, vocab: int, seqs: int, chunk: int | None, dtype: str, entropy: bool, repeats: int,
        temperature: float) -> dict:
    import torch
    from dapo.train.logprobs import token_entropy, token_logprobs
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(seqs, positions + 1, vocab, generator=g) * 2).to(dt)          # [n, L + 1, V]
    tgt = torch.randint(0, vocab, (seqs, positions), generator=g)
    w = torch.randn(seqs, positions, generator=g)
    times, digest = [], ""
    for k in range(repeats + 1):
        x = base.clone().requires_grad_(True)
        t0 = time.perf_counter()
        logits = x[:, :positions]                                                     # a view, as response_logits
        loss = (token_logprobs(logits, tgt, temperature, chunk) * w).sum()
        if entropy:
            loss = loss + (token_entropy(logits, temperature, chunk) * w).sum()
        loss.backward()
        dt_s = time.perf_counter() - t0
        if k:
            times.append(dt_s)
        digest = hashlib.sha256(x.grad.float().numpy().tobytes()).hexdigest()[:16]
    return {"median_s": statistics.median(times), "min_s": min(times), "grad_sha256": digest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=512, help="L, response positions per sequence")
    ap.add_argument("--vocab", type=int, default=152_064, help="V (Qwen2.5: 152,064)")
    ap.add_argument("--seqs", type=int, default=1, help="n, sequences in the micro-batch")
    ap.add_argument("--chunk", type=int, default=2048, help="train.logits_chunk_tokens (0: null, all at once)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the logits' dtype (bf16: autocast)")
    ap.add_argument("--entropy", action="store_true", help="also the entropy (algo.entropy_coef > 0)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    import torch
    import dapo
    torch.set_num_threads(a.threads)
    load = os.getloadavg()[0]
    r = run(a.positions, a.vocab, a.seqs, a.chunk or None, a.dtype, a.entropy, a.repeats, a.temperature)
    print(f"dapo from {Path(dapo.__file__).parent} (commit {_commit(dapo.__file__)}), torch {torch.__version__}, "
          f"{a.threads} thread(s), load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| n | L | V | chunk | dtype | entropy | fwd+bwd median s | min s | grad sha256 |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {a.seqs} | {a.positions} | {a.vocab} | {a.chunk or 'null'} | {a.dtype} | {'yes' if a.entropy else 'no'} "
          f"| {r['median_s']:.2f} | {r['min_s']:.2f} | {r['grad_sha256']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
