"""`dapo plan`'s update phase against the measured peak of one real update on this CPU.

    python -m bench.plan_peak                       # the default shapes, fp32 and bf16 autocast
    python -m bench.plan_peak --shape 256,4,4,2,768,8192 --seqs 4 --prompt 64 --resp 448

Each row runs one optimizer step of ``dapo.train.update.update_policy`` (packing, forward with gradient
checkpointing, chunked log-probs, token-level loss, backward, clip, AdamW, whose moments are
created in that step) on a random Qwen2 model of the given shape, in a fresh process, and
reads the process's peak resident memory (``VmHWM``, reset with ``/proc/self/clear_refs`` after the
imports) above the resident memory before the model existed. The plan's prediction is the update
phase of ``dapo.sweep.plan.memory_plan`` for the same shape (its config.json), micro-batch and precision,
one process without FSDP, less the two terms a CPU has no counterpart for (vLLM asleep, the CUDA
runtime overhead). Every sequence is full length, so the plan's worst case is the real case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: (hidden, layers, heads, kv heads, intermediate, vocab): a tiny-3m-like body with a real-sized
#: vocabulary (the logits then weigh as they do at scale), and a wider, deeper one
SHAPES = {"small": (256, 4, 4, 2, 768, 16384), "wide": (512, 8, 8, 4, 1536, 8192)}
NOT_ON_CPU = ("vLLM", "runtime overhead")


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def write_config(out: Path, shape: tuple[int, ...]) -> Path:
    """A Qwen2 config.json of ``shape`` (no weights): what the plan reads and the model is built from."""
    h, layers, heads, kv, inter, vocab = shape
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": h, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": vocab,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu"}))
    return out


def plan_config(model_dir: Path, seqs: int, prompt: int, resp: int, bf16: bool, chunk: int | None):
    from dapo.config import load_config
    return load_config(None, [f"model.path={model_dir}", "rollout.engine=vllm", "launch.fsdp=false",
                              "model.gradient_checkpointing=true", f"model.autocast_bf16={str(bf16).lower()}",
                              f"train.micro_batch_seqs={seqs}", f"train.batch_prompts=1", f"rollout.n={seqs}",
                              "train.mini_batch_prompts=1", f"data.max_prompt_tokens={prompt}",
                              f"rollout.max_new_tokens={resp}", f"algo.overlong.max_len={resp}",
                              f"algo.overlong.cache_len={max(1, resp // 4)}",
                              f"train.logits_chunk_tokens={'null' if chunk is None else chunk}",
                              "algo.dynamic_sampling.enabled=false"])


def predicted(cfg) -> tuple[float, list[tuple[str, float]]]:
    """The plan's update-phase bytes without the GPU-only terms, and its terms."""
    from dapo.sweep import plan
    p = plan.memory_plan(cfg, plan.model_shape(cfg.model.path), gpu_gib=80.0)
    terms = [(t.name, t.bytes) for t in dict((ph.name, ph) for ph in p.phases)["update"].terms
             if not t.name.startswith(NOT_ON_CPU)]
    return sum(b for _, b in terms), terms


def measure(cfg, threads: int = 1) -> dict[str, float]:
    """One update of a random model of ``cfg.model.path``'s shape in this process: peak RSS bytes above
    the RSS before the model was built. Call in a fresh process (the allocator keeps what it freed)."""
    import gc

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dapo import algo
    from dapo.train.logprobs import response_mask
    from dapo.train.rollout import RolloutBatch
    from dapo.train.update import Policy, update_policy
    torch.set_num_threads(threads)
    n, prompt, resp = cfg.rollout.n, cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens
    g = torch.Generator().manual_seed(0)
    hf_cfg = AutoConfig.from_pretrained(cfg.model.path)
    V = hf_cfg.vocab_size
    prompts = [torch.randint(3, V, (prompt,), generator=g).tolist()] * n
    responses = [torch.randint(3, V, (resp,), generator=g).tolist() for _ in range(n)]
    correct = torch.tensor([[k % 2 == 0 for k in range(n)]])
    batch = RolloutBatch(prompts, responses, torch.ones(n, dtype=torch.bool), correct, correct.float() * 2 - 1,
                         torch.zeros(1, n))
    adv = algo.group_advantages(batch.rewards).reshape(-1)
    mask = response_mask(batch)
    # warm-up: one update of a 1-layer model of the same kind loads every kernel and library page the
    # real one touches (oneDNN, autograd's threads): memory a GPU run has in its context overhead
    tiny = hf_cfg.__class__(**{**hf_cfg.to_dict(), "num_hidden_layers": 1, "layer_types": None, "vocab_size": 512})
    tiny_batch = RolloutBatch([[5] * 8] * n, [[6] * 8] * n, batch.finished, correct, batch.rewards, batch.penalty)
    warm = AutoModelForCausalLM.from_config(tiny, dtype=torch.float32)
    warm.gradient_checkpointing_enable()
    wopt = torch.optim.AdamW(warm.parameters(), lr=1e-6)
    update_policy(Policy(warm, wopt, torch.optim.lr_scheduler.LambdaLR(wopt, lambda s: 1.0), torch.device("cpu"),
                         autocast=cfg.model.autocast_bf16), tiny_batch, None, adv, response_mask(tiny_batch), cfg)
    del warm, wopt
    gc.collect()
    base = _rss("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")        # VmHWM := VmRSS from here on
    model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    update_policy(Policy(model, opt, sched, torch.device("cpu"), autocast=cfg.model.autocast_bf16),
                  batch, None, adv, mask, cfg)
    return {"peak": _rss("VmHWM") - base, "params": sum(p.numel() for p in model.parameters())}


def run_row(shape: tuple[int, ...], seqs: int, prompt: int, resp: int, bf16: bool, chunk: int | None,
            workdir: Path) -> dict:
    """Plan and measurement (a fresh ``python -m bench.plan_peak --measure`` process) of one shape."""
    model_dir = write_config(workdir / "x".join(map(str, shape)), shape)
    cfg = plan_config(model_dir, seqs, prompt, resp, bf16, chunk)
    plan_bytes, terms = predicted(cfg)
    args = [sys.executable, "-m", "bench.plan_peak", "--measure", str(model_dir), "--seqs", str(seqs),
            "--prompt", str(prompt), "--resp", str(resp), "--chunk", str(chunk or 0)] + (["--bf16"] if bf16 else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(args, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1])
    if p.returncode != 0:
        raise RuntimeError(f"measuring {shape} failed:\n{p.stderr[-3000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    return {"shape": shape, "seqs": seqs, "tokens": seqs * (prompt + resp), "bf16": bf16, "plan": plan_bytes,
            "measured": got["peak"], "ratio": got["peak"] / plan_bytes, "terms": terms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", help="hidden,layers,heads,kv_heads,intermediate,vocab (default: the SHAPES table)")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--resp", type=int, default=448)
    ap.add_argument("--chunk", type=int, default=0, help="train.logits_chunk_tokens (0: the config default)")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--terms", action="store_true", help="print the plan's terms of each row")
    ap.add_argument("--measure", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    chunk = a.chunk or None
    if a.measure:
        cfg = plan_config(Path(a.measure), a.seqs, a.prompt, a.resp, a.bf16, chunk)
        print(json.dumps(measure(cfg)))
        return 0
    shapes = [tuple(int(x) for x in a.shape.split(","))] if a.shape else list(SHAPES.values())
    print("## `dapo plan`'s update phase vs the measured peak of one update (CPU, one process)\n")
    print("| shape (h, layers, heads, kv, I, V) | micro-batch tokens | precision | plan MiB | measured MiB | measured / plan |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            for prec in a.precisions.split(","):
                r = run_row(shape, a.seqs, a.prompt, a.resp, prec == "bf16", chunk, Path(tmp))
                print(f"| {shape} | {r['tokens']} | {prec} | {r['plan'] / 2**20:.0f} | {r['measured'] / 2**20:.0f} "
                      f"| {r['ratio']:.2f} |", flush=True)
                if a.terms:
                    for name, b in r["terms"]:
                        print(f"|   {name} | | | {b / 2**20:.1f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
