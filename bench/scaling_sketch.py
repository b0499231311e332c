"""Scaling sketch, ON PAPER: the paper's 32B DAPO run (experiments/paper-dapo-32b.yaml) on N GPUs.

This is arithmetic, not a measurement, and the same arithmetic as `dapo plan` (dapo/sweep/plan.py):
the per-GPU memory peak and the time per rollout step come from :func:`dapo.sweep.plan.memory_plan`
and :func:`dapo.sweep.plan.step_time`, with every assumption printed. Per GPU kind, only the memory
and the decode throughput differ (same dense bf16 peak):

    python -m bench.scaling_sketch [--resp-len 4000 --rounds 1.0 --mfu 0.35 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from dapo.config import load_config
from dapo.sweep import plan

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "paper-dapo-32b.yaml"
GPUS = {  # memory torch reports (GiB), dense bf16 peak (TFLOP/s), assumed vLLM decode tok/s per GPU for 32B
    "H100": (79.6, 989.0, 2500.0),
    "H200": (139.8, 989.0, 3500.0),   # same compute, more/faster HBM → larger decode batches
}


def main(argv: list[str] | None = None) -> int:
    d = plan.Assumptions()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resp-len", type=float, default=4000.0, help="mean response tokens (assumed; the paper's Fig. 7 grows toward ~5k)")
    p.add_argument("--rounds", type=float, default=d.rounds, help="dynamic-sampling generation rounds per step (assumed)")
    p.add_argument("--mfu", type=float, default=d.mfu, help="model FLOP utilization of the update (assumed)")
    p.add_argument("--seq-decode-tps", type=float, default=d.seq_decode_tps,
                   help="one sequence's decode speed in a full batch: the tail of a round (assumed)")
    a = p.parse_args(argv)
    print("# Scaling sketch (arithmetic from stated assumptions, NOT a measurement; the model of `dapo plan`)\n")
    rows = []
    for g, (mem, peak, tps) in GPUS.items():
        assume = dataclasses.replace(d, peak_tflops=peak, decode_tps_32b=tps, mfu=a.mfu, rounds=a.rounds,
                                     mean_response_tokens=a.resp_len, seq_decode_tps=a.seq_decode_tps)
        for n in (64, 128, 256, 512):
            cfg = load_config(EXPERIMENT, [f"launch.num_nodes={n // 8}"])
            shape = plan.model_shape(cfg.model.path)
            mp = plan.memory_plan(cfg, shape, mem, assume)
            t = plan.step_time(cfg, shape, assume)
            hours = t["step_s"] * cfg.train.rollout_steps / 3600
            rows.append(f"| {g} | {n} | {mp.peak.total / plan.GiB:.1f} of {mem:g} | {t['generation_s']:.0f} | "
                        f"{t['update_s']:.0f} | {t['step_s']:.0f} | {hours:.1f} | {hours * n:.0f} |")
    print(f"run: {EXPERIMENT.name} (B={cfg.train.batch_prompts}, G={cfg.rollout.n}, {cfg.gen_batch_prompts} prompts "
          f"per generation round, {cfg.train.rollout_steps} rollout steps, 8 GPUs per node); model {shape.name}, "
          f"{shape.params / 1e9:.2f} B parameters")
    print("assumptions: " + ", ".join(f"{f.name}={getattr(assume, f.name)}" for f in dataclasses.fields(assume)
                                      if f.name not in ("peak_tflops", "decode_tps_32b")) +
          "; per GPU: " + ", ".join(f"{g} {m:g} GiB, {pk:.0f} TFLOP/s bf16, {tp:.0f} decode tok/s (32B)"
                                    for g, (m, pk, tp) in GPUS.items()))
    print(f"per rollout step: {t['generated_tokens'] / 1e6:.1f}M generated tokens, {t['trained_tokens'] / 1e6:.1f}M "
          f"trained tokens, {t['update_flop']:.3g} update FLOP\n")
    print("| GPU | N | peak GiB per GPU | rollout s | update s | step s | run hours | GPU-hours |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
