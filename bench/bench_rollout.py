"""Rollout throughput: our vLLM engine's generate path vs raw ``vllm.LLM.generate`` vs the
HF engine, on the same prompts and sampling. Prints a markdown table.

    python bench/bench_rollout.py                      # tiny-3m, 64 prompts x 8, 128 tokens
    python bench/bench_rollout.py --model tiny-25m --repeats 3

Method: one engine is built; "raw" calls ``engine.llm.generate`` directly (same LLM
object, same weights) with one ``SamplingParams(n, temperature, top_p, max_tokens)``
and vLLM's default detokenization, as a plain vLLM user would. "ours" calls
``engine.generate`` (per-prompt seeds, our output assembly and batch decode), and
"ours, seed=None" skips the per-prompt seeds. Every variant gets a full-length warm-up
run, then runs are interleaved (A, B, C, A, B, C, ...) so a background load hits all of
them alike; we report median and min-max of generated tokens per second, plus the
process's CPU use (CPU time / wall time), the 1-minute load average before each run, and
tokens per CPU-second (steadier than wall time when other processes share the CPUs;
meaningful with --threads 1, since idle OpenMP threads spin and bill CPU time).
Target: ours / raw >= 0.9. "raw + logprobs=0" asks vLLM for the sampled token's log-prob
(``processed_logprobs``, as the engine does for the rollout-training mismatch): its ratio to
"raw" is what the log-probs cost.

On a shared machine run it with ``OMP_WAIT_POLICY=PASSIVE`` (or --threads 1): with the
default spinning OpenMP threads, another busy process on these 2 cores made vLLM 5-20x
slower here.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_prompts(tokenizer, num: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    texts = [
        f"Question: what is {rng.randint(1, 99)} + {rng.randint(1, 99)} * {rng.randint(1, 9)}?\nAnswer:"
        for _ in range(num)
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def timed(fn):
    """(result, wall seconds, process CPU seconds, loadavg-1min before)."""
    load = os.getloadavg()[0]
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    t1, c1 = time.perf_counter(), time.process_time()
    return out, t1 - t0, c1 - c0, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-3m", help="name or path for dapo.models.resolve_model")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per vLLM variant")
    ap.add_argument("--hf-repeats", type=int, default=2, help="timed runs of the HF engine (0 = skip)")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for this run (default: the environment's, else all CPUs)")
    args = ap.parse_args()

    if args.threads is not None:  # before torch is imported
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from dapo.engines import SamplingSpec, make_engine
    from dapo.hardware import cpu_name
    from dapo.models import resolve_model

    path = resolve_model(args.model)
    eng = make_engine("vllm", path, dtype=args.dtype, seed=0)
    import vllm
    from vllm import SamplingParams

    prompts = make_prompts(eng.tokenizer, args.prompts)
    raw_prompts = [{"prompt_token_ids": p} for p in prompts]
    raw_params = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens
    )
    step = iter(range(10**9))

    def spec(seed):
        return SamplingSpec(n=args.n, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=seed)

    raw_lp_params = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, logprobs=0
    )

    def run_raw():
        outs = eng.llm.generate(raw_prompts, raw_params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def run_raw_logprobs():   # + the sampled token's processed log-prob (what the mismatch metrics need)
        outs = eng.llm.generate(raw_prompts, raw_lp_params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def run_ours():
        groups = eng.generate(prompts, spec(next(step)))
        return sum(len(c.token_ids) for g in groups for c in g)

    def run_ours_noseed():
        groups = eng.generate(prompts, spec(None))
        return sum(len(c.token_ids) for g in groups for c in g)

    variants = {"raw vllm.LLM.generate": run_raw, "raw + logprobs=0 (sampled token's log-prob)": run_raw_logprobs,
                "ours (VLLMEngine.generate, with log-probs)": run_ours,
                "ours, seed=None": run_ours_noseed}
    results: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in variants}
    for fn in variants.values():  # warm-up, full length
        fn()
    for _ in range(args.repeats):
        for name, fn in variants.items():
            toks, wall, cpu, load = timed(fn)
            results[name].append((toks / wall, cpu / wall, load, toks / cpu))

    hf_rows = []
    if args.hf_repeats > 0:
        eng_threads = torch.get_num_threads()
        hf = make_engine("hf", path, dtype=args.dtype, seed=0)
        hf.generate(prompts, spec(0))  # warm-up (page faults make the first run ~2x slower)
        for r in range(args.hf_repeats):
            groups, wall, cpu, load = timed(lambda: hf.generate(prompts, spec(r + 1)))
            toks = sum(len(c.token_ids) for g in groups for c in g)
            hf_rows.append((toks / wall, cpu / wall, load, toks / cpu))
        hf.close()
    else:
        eng_threads = torch.get_num_threads()
    eng.close()

    def fmt(rows):
        tps = [r[0] for r in rows]
        return (f"{statistics.median(tps):,.0f}", f"{min(tps):,.0f}–{max(tps):,.0f}",
                f"{statistics.median(r[1] for r in rows):.2f}",
                f"{max(r[2] for r in rows):.2f}",
                f"{statistics.median(r[3] for r in rows):,.0f}")

    raw_med = statistics.median(r[0] for r in results["raw vllm.LLM.generate"])
    raw_cpu = statistics.median(r[3] for r in results["raw vllm.LLM.generate"])
    print()
    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores (affinity {len(os.sched_getaffinity(0))}), "
          f"torch {torch.__version__} ({eng_threads} threads, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}), "
          f"vllm {vllm.__version__}, "
          f"python {platform.python_version()}")
    print(f"Model {args.model} ({args.dtype}); {args.prompts} prompts x {args.n} samples, "
          f"{args.max_tokens} new tokens max, temperature {args.temperature}, top_p {args.top_p}; "
          f"{args.repeats} interleaved runs per vLLM variant, {args.hf_repeats} HF runs")
    print()
    print("| path | tok/s median | min–max | ratio to raw | CPU use (cpu/wall) | max load avg before "
          "| tok per CPU-s (median) | ratio to raw, per CPU-s |")
    print("|---|---|---|---|---|---|---|---|")
    rows_all = list(results.items()) + ([("HF engine (transformers generate)", hf_rows)] if hf_rows else [])
    for name, rows in rows_all:
        med, rng_, cpu, load, per_cpu = fmt(rows)
        ratio = statistics.median(r[0] for r in rows) / raw_med
        ratio_cpu = statistics.median(r[3] for r in rows) / raw_cpu
        print(f"| {name} | {med} | {rng_} | {ratio:.2f} | {cpu} | {load} | {per_cpu} | {ratio_cpu:.2f} |")


if __name__ == "__main__":
    main()
