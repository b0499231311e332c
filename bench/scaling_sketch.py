"""Scaling sketch, ON PAPER: step time and GPU-hours of the paper's 32B DAPO run on N GPUs.

This is arithmetic, not a measurement. Every input is an assumption printed with the table;
change them with flags. Model (per rollout step):

    generated tokens  T_gen = B · G · L_resp · r           (r = dynamic-sampling generation rounds factor)
    trained tokens    T_tr  = B · G · (L_prompt + L_resp)
    rollout time      = T_gen / (N · decode_tps_per_gpu)
    update time       = (6 + 2) · P · T_tr / (N · peak_flops · mfu)   (fwd+bwd 6·P, old-logprob fwd 2·P)
    step time         = rollout + update + sync_s

    python -m bench.scaling_sketch [--resp-len 4000 --rounds 1.5 ...]
"""

from __future__ import annotations

import argparse
import sys

GPUS = {  # dense bf16 peak (TFLOP/s) and an assumed vLLM decode throughput per GPU for a 32B model
    "H100": (989.0, 2500.0),
    "H200": (989.0, 3500.0),   # same compute, more/faster HBM → larger decode batches
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, default=32e9, help="policy parameters P")
    p.add_argument("--prompts", type=int, default=512, help="B, prompts per rollout step")
    p.add_argument("--group", type=int, default=16, help="G, responses per prompt")
    p.add_argument("--prompt-len", type=float, default=200, help="mean prompt tokens (assumed)")
    p.add_argument("--resp-len", type=float, default=4000, help="mean response tokens (assumed; the paper's Fig. 7 grows toward ~5k)")
    p.add_argument("--rounds", type=float, default=1.5, help="dynamic-sampling generation factor (assumed; our mini run measured 1.0-2.0 rounds)")
    p.add_argument("--mfu", type=float, default=0.35, help="model FLOP utilization of the update (assumed)")
    p.add_argument("--sync-s", type=float, default=10.0, help="weight sync per step, seconds (assumed)")
    p.add_argument("--rollout-steps", type=int, default=300, help="rollout steps of the run")
    a = p.parse_args(argv)
    t_gen = a.prompts * a.group * a.resp_len * a.rounds
    t_tr = a.prompts * a.group * (a.prompt_len + a.resp_len)
    flops = 8 * a.params * t_tr
    print("# Scaling sketch (arithmetic from stated assumptions, NOT a measurement)\n")
    print(f"assumptions: P={a.params:.3g}, B={a.prompts}, G={a.group}, prompt {a.prompt_len:.0f} tok, "
          f"response {a.resp_len:.0f} tok, DS factor {a.rounds}, MFU {a.mfu}, sync {a.sync_s}s, "
          f"{a.rollout_steps} rollout steps; per GPU: " +
          ", ".join(f"{g} {pk:.0f} TFLOP/s bf16, {tps:.0f} decode tok/s" for g, (pk, tps) in GPUS.items()))
    print(f"per rollout step: {t_gen / 1e6:.1f}M generated tokens, {t_tr / 1e6:.1f}M trained tokens, "
          f"{flops:.3g} update FLOP\n")
    print("| GPU | N | rollout s | update s | step s | run hours | GPU-hours |")
    print("|---|---|---|---|---|---|---|")
    for g, (peak, tps) in GPUS.items():
        for n in (64, 128, 256, 512):
            roll = t_gen / (n * tps)
            upd = flops / (n * peak * 1e12 * a.mfu)
            step = roll + upd + a.sync_s
            hours = step * a.rollout_steps / 3600
            print(f"| {g} | {n} | {roll:.0f} | {upd:.0f} | {step:.0f} | {hours:.1f} | {hours * n:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
