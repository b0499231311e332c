"""Where a training step's time goes, and what dynamic sampling costs — read from logged runs.

Reads every run of a sweep from its MLflow store (the loop logs time/rollout_s,
time/old_logprob_s, time/train_s, time/sync_s, time/eval_s, time/step_s and
sampling/gen_tokens, sampling/kept_groups per rollout step) and prints two tables:

1. the per-step time breakdown per arm (mean over steps ≥ 2), with "everything else"
   = step − (rollout + old logprobs + update + sync + eval);
2. dynamic sampling's price: generated tokens and rollout seconds per kept group, with vs
   without dynamic sampling.

    python -m bench.step_breakdown --tracking-uri sqlite:///runs/table1-mini/mlruns.db --sweep table1-mini
"""

from __future__ import annotations

import argparse
import platform
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracking-uri", default="sqlite:///runs/table1-mini/mlruns.db")
    p.add_argument("--sweep", default="table1-mini")
    a = p.parse_args(argv)
    from analysis.runs import load_runs
    tidy, configs = load_runs(a.tracking_uri, a.sweep)
    if tidy.empty:
        print(f"no runs of sweep {a.sweep!r} in {a.tracking_uri}")
        return 1
    t = tidy[tidy["rollout_step"] >= 2]
    wide = t.pivot_table(index=["arm", "seed", "rollout_step"], columns="metric", values="value").reset_index()
    parts = ["time/rollout_s", "time/old_logprob_s", "time/train_s", "time/sync_s", "time/eval_s"]
    wide["other"] = wide["time/step_s"] - wide[parts].sum(axis=1)
    print(f"machine: {platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores, "
          f"python {platform.python_version()}\n")
    print("## Where a step's time goes (mean seconds per rollout step, steps >= 2; eval amortized)\n")
    cols = parts + ["other", "time/step_s"]
    print("| arm | " + " | ".join(c.split("/")[-1] for c in cols) + " | other % |")
    print("|---|" + "---|" * (len(cols) + 1))
    for arm, g in wide.groupby("arm", sort=False):
        med = g[cols].mean()
        print(f"| {arm} | " + " | ".join(f"{med[c]:.2f}" for c in cols)
              + f" | {100 * med['other'] / med['time/step_s']:.1f}% |")
    print("\n## Dynamic sampling's price (per kept group, mean over steps)\n")
    print("| arm | dynamic sampling | gen rounds | generated tokens / kept group | rollout s / kept group |")
    print("|---|---|---|---|---|")
    for arm, g in wide.groupby("arm", sort=False):
        run = next(iter(tidy[tidy["arm"] == arm]["run"]))
        ds = configs.get(run, {}).get("algo", {}).get("dynamic_sampling", {}).get("enabled", "?")
        kept = g["sampling/kept_groups"].clip(lower=1)
        print(f"| {arm} | {ds} | {g['sampling/gen_rounds'].mean():.2f} | "
              f"{(g['sampling/gen_tokens'] / kept).mean():.0f} | {(g['time/rollout_s'] / kept).mean():.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
