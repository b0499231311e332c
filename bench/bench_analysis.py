"""Benchmark: regenerate every figure and table from a results snapshot.

Builds a synthetic Table-1 ladder (6 arms × 3 seeds = 18 runs × 500 gradient steps, every
metric of docs/METRICS.md at every step, evaluations every 5 steps), writes it as a snapshot,
then times load_snapshot → figures (PNG + PDF) → tables → report.md. Target: < 10 s.

    .venv/bin/python -m bench.bench_analysis [--out DIR] [--steps 500] [--seeds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.runs import ArmInfo, SweepInfo, normalize_tidy, snapshot

# (name, label, paper %, overrides): each row adds one technique, as in the paper's Table 1.
LADDER = [
    ("grpo", "naive GRPO", 30, {}),
    ("overlong_filter", "+ overlong filtering", 36, {"algo.overlong.filter": True}),
    ("clip_higher", "+ clip-higher", 38, {"algo.clip.eps_high": 0.28}),
    ("soft_punish", "+ soft overlong punishment", 41, {"algo.overlong.soft_punish": True}),
    ("token_loss", "+ token-level loss", 42, {"algo.loss_agg": "token_mean"}),
    ("dapo", "+ dynamic sampling (DAPO)", 50, {"algo.dynamic_sampling.enabled": True}),
]
BASE = {"algo.clip.eps_low": 0.2, "algo.clip.eps_high": 0.2, "algo.loss_agg": "seq_mean_token_mean",
        "algo.overlong.filter": False, "algo.overlong.soft_punish": False,
        "algo.overlong.max_len": 1024, "algo.overlong.cache_len": 256,
        "algo.dynamic_sampling.enabled": False, "train.lr": 1e-6, "eval.k": 8}


def _nest(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        node = out
        *head, last = k.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = v
    return out


def make_synthetic(n_seeds: int = 3, n_steps: int = 500, eval_every: int = 5, grad_per_rollout: int = 16,
                   dataset: str = "arith", k: int = 8, seed: int = 0,
                   ladder=LADDER) -> tuple[pd.DataFrame, dict, SweepInfo]:
    """A plausible ladder sweep: (tidy, configs, sweep_info), accuracies in [0, 1]."""
    rng = np.random.default_rng(seed)
    frames, configs, cum = [], {}, {}
    t = np.arange(n_steps + 1, dtype=float)                         # grad steps 0..n_steps
    for i, (arm, label, paper, ov) in enumerate(ladder):
        flat = dict(BASE)
        for _, _, _, o in ladder[:i + 1]:
            flat.update(o)
        clip_high = flat["algo.clip.eps_high"] > flat["algo.clip.eps_low"]
        token = flat["algo.loss_agg"] == "token_mean"
        ds = flat["algo.dynamic_sampling.enabled"]
        filt = flat["algo.overlong.filter"]
        for s in range(n_seeds):
            run = f"{i:02d}{s:02d}" + "f" * 28
            cfg = _nest({**flat, "train.seed": s, "logging.sweep": "bench", "logging.arm": arm,
                         "output_dir": f"runs/bench/{arm}/{s}"})
            configs[run] = cfg
            final = paper / 100 * 0.9 + rng.normal(0, 0.02)
            speed = 110 if ds else 160
            acc = final * (1 - np.exp(-t / speed))
            ent0 = 0.7
            ent = (ent0 * np.exp(-t / 90) + 0.04) if not clip_high else (0.45 + 0.15 * np.sin(t / 120) + 0.1 * t / n_steps)
            if not token:
                ent = ent + 0.25 * np.clip((t - 250) / 250, 0, None) ** 2
            ent = ent + rng.normal(0, 0.02, t.size)
            length = 180 + 320 * (1 - np.exp(-t / 250)) + (0 if token else 120 * np.clip((t - 300) / 200, 0, None) ** 2)
            length = length + rng.normal(0, 12, t.size)
            reward = 2 * (acc + 0.1) - 1 + rng.normal(0, 0.03, t.size)
            metrics = {
                "train/entropy": ent, "train/token_prob_mean": 0.6 + 0.3 * (1 - np.exp(-t / 200)) + rng.normal(0, 0.01, t.size),
                "train/clip_frac_high": np.abs(rng.normal(0.02, 0.005, t.size)),
                "train/clip_frac_low": np.abs(rng.normal(0.01, 0.004, t.size)),
                "train/up_clipped_prob_mean": (0.2 if clip_high else 0.08) + 0.05 * np.exp(-t / 100) + rng.normal(0, 0.01, t.size),
                "train/approx_kl": np.abs(rng.normal(1e-3, 2e-4, t.size)),
                "train/grad_norm": np.abs(rng.normal(0.3, 0.05, t.size)),
                "train/lr": np.minimum(1.0, (t + 1) / 20) * 1e-6, "train/loss": rng.normal(0, 0.02, t.size),
                "rollout/reward_mean": reward, "rollout/acc_mean": np.clip(acc + 0.1 + rng.normal(0, 0.02, t.size), 0, 1),
                "rollout/response_len_mean": length, "rollout/truncated_frac": np.clip(0.05 + rng.normal(0, 0.01, t.size), 0, 1),
                "rollout/overlong_penalty_mean": -np.abs(rng.normal(0.01, 0.003, t.size)),
                "sampling/all_correct_frac": np.clip(0.5 * acc + rng.normal(0, 0.02, t.size), 0, 1),
                "sampling/all_wrong_frac": np.clip(0.4 * (1 - acc) + rng.normal(0, 0.02, t.size), 0, 1),
                "sampling/gen_rounds": np.ones_like(t) * (2 if ds else 1),
                "sampling/kept_groups": np.full_like(t, 32.0), "sampling/discarded_groups": np.full_like(t, 20.0 if ds else 0.0),
                "sampling/gen_tokens": length * 512 * (1.6 if ds else 1.0),
                "time/rollout_s": np.abs(rng.normal(20, 2, t.size)), "time/train_s": np.abs(rng.normal(30, 2, t.size)),
                "time/sync_s": np.abs(rng.normal(1, 0.1, t.size)), "time/eval_s": np.abs(rng.normal(5, 1, t.size)),
                "time/step_s": np.abs(rng.normal(56, 3, t.size)),
                "perf/rollout_tokens_per_s": np.abs(rng.normal(5e3, 200, t.size)),
                "perf/train_tokens_per_s": np.abs(rng.normal(9e3, 300, t.size)),
            }
            ev = t[::eval_every]
            acc_ev = acc[::eval_every]
            evals = {f"eval/{dataset}/avg_at_{k}": np.clip(acc_ev + rng.normal(0, 0.015, ev.size), 0, 1),
                     f"eval/{dataset}/pass_at_{k}": np.clip(1 - (1 - acc_ev) ** 2.2 + rng.normal(0, 0.015, ev.size), 0, 1),
                     f"eval/{dataset}/cons_at_{k}": np.clip(acc_ev * 1.15 + rng.normal(0, 0.015, ev.size), 0, 1)}
            step_time = np.cumsum(np.r_[0.0, np.full(n_steps, 56.0 * (1.5 if ds else 1.0))])
            base = {"run": run, "run_id": f"h{i}{s}", "sweep": "bench", "arm": arm, "seed": s}
            for name, v in metrics.items():
                frames.append(pd.DataFrame({**base, "grad_step": t[1:].astype(int), "time": step_time[1:],
                                            "metric": name, "value": v[1:]}))
            for name, v in evals.items():
                frames.append(pd.DataFrame({**base, "grad_step": ev.astype(int), "time": step_time[::eval_every],
                                            "metric": name, "value": v}))
    tidy = pd.concat(frames, ignore_index=True)
    tidy["rollout_step"] = (tidy["grad_step"] + grad_per_rollout - 1) // grad_per_rollout
    arms = tuple(ArmInfo(name=a, label=l, overrides=o, paper=p) for a, l, p, o in ladder)
    sweep = SweepInfo(name="bench", kind="ladder", arms=arms, metric=f"eval/{dataset}/avg_at_{k}")
    return normalize_tidy(tidy), configs, sweep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="keep the results here (default: a temporary folder)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)

    from analysis.figures import render_all, save_figure
    from analysis.report import write_report
    from analysis.runs import load_snapshot
    from analysis.tables import compare_table, table1

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        t0 = time.perf_counter()
        tidy, configs, sweep = make_synthetic(n_seeds=args.seeds, n_steps=args.steps)
        snapshot(tidy, configs, sweep, root / "snapshot", command="bench", commit="bench")
        t_make = time.perf_counter() - t0

        timings = []

        def timed(name, fn):
            t, c = time.perf_counter(), time.process_time()
            out = fn()
            timings.append((name, time.perf_counter() - t, time.process_time() - c))
            return out

        start, start_cpu = time.perf_counter(), time.process_time()
        tidy2, configs2, sweep2 = timed("load_snapshot", lambda: load_snapshot(root / "snapshot"))
        results = timed("draw 7 figures", lambda: render_all(tidy2, sweep2, configs=configs2))
        timed("save PNG + PDF", lambda: [save_figure(r.figure, root / "bench_figs" / r.name)
                                         for r in results if r.figure is not None])
        timed("table1", lambda: table1(tidy2, sweep2))
        timed("compare_table", lambda: compare_table(tidy2, "grpo", "dapo"))
        core, core_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        paths = timed("write_report (all again)", lambda: write_report(tidy2, configs2, sweep2, root / "report"))
        full = timed("write_report --x rollout_step", lambda: write_report(
            tidy2, configs2, sweep2, root / "report_rollout", x="rollout_step"))

        n_runs = tidy2["run"].nunique()
        print(f"synthetic snapshot: {n_runs} runs × {args.steps} steps, {len(tidy2):,} points, "
              f"{tidy2['metric'].nunique()} metrics (built in {t_make:.1f} s)")
        print(f"{'stage':<32}{'wall s':>9}{'CPU s':>9}")
        print("-" * 50)
        for name, dt, cpu in timings:
            print(f"{name:<32}{dt:>9.2f}{cpu:>9.2f}")
        print("-" * 50)
        print(f"{'snapshot → figures + tables':<32}{core:>9.2f}{core_cpu:>9.2f}   (target < 10 s)")
        print(f"report files: {len(paths)} in {root / 'report'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
