"""Where a training step's time goes, and what dynamic sampling costs — read from logged runs.

Reads every run of a sweep from its MLflow store (the loop logs time/rollout_s,
time/old_logprob_s, time/train_s, time/sync_s, time/eval_s, time/step_s and
sampling/gen_tokens, sampling/kept_groups per rollout step) and prints two tables:

1. the per-step time breakdown per arm (mean over steps ≥ 2), with "everything else"
   = step − (rollout + old logprobs + update + sync + eval);
2. dynamic sampling's price: generated tokens and rollout seconds per kept group, with vs
   without dynamic sampling.

3. steps (and generated tokens) to a fixed held-out accuracy, per arm: the first eval
   point whose avg@k reaches each threshold, per seed.

    python -m bench.step_breakdown                                  # the committed mini snapshot
    python -m bench.step_breakdown --snapshot results/table1-mini/snapshot
    python -m bench.step_breakdown --snapshot results/mismatch-mini/snapshot --thresholds 0.2,0.21
    python -m bench.step_breakdown --tracking-uri sqlite:///runs/table1-mini/mlruns.db --sweep table1-mini
"""

from __future__ import annotations

import argparse
import platform
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--snapshot", default="results/table1-mini/snapshot",
                   help="read a committed analysis snapshot (default) ...")
    p.add_argument("--tracking-uri", default=None, help="... or a live MLflow store (with --sweep)")
    p.add_argument("--sweep", default="table1-mini")
    p.add_argument("--thresholds", default="0.355,0.36,0.365,0.37",
                   help="held-out avg@k levels for the steps-to-accuracy table")
    a = p.parse_args(argv)
    from analysis.runs import load_runs, load_snapshot
    if a.tracking_uri:
        tidy, configs = load_runs(a.tracking_uri, a.sweep)
        source = f"{a.tracking_uri} sweep {a.sweep}"
    else:
        tidy, configs, _ = load_snapshot(a.snapshot)
        source = f"snapshot {a.snapshot}"
    print(f"runs: {source} ({tidy['run'].nunique()} runs)\n")
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
    print("| arm | " + " | ".join(c.split("/")[-1] for c in cols) + " | other % | π_old pass % (bypass skips it) |")
    print("|---|" + "---|" * (len(cols) + 2))
    for arm, g in wide.groupby("arm", sort=False):
        med = g[cols].mean()
        print(f"| {arm} | " + " | ".join(f"{med[c]:.2f}" for c in cols)
              + f" | {100 * med['other'] / med['time/step_s']:.1f}% | {100 * med['time/old_logprob_s'] / med['time/step_s']:.1f}% |")
    print("\nπ_old pass: the extra forward over the batch that recomputes the old log-probs when a batch "
          "feeds several optimizer steps; `algo.old_logprobs=rollout` (bypass) takes the rollout's log-probs "
          "instead and skips it, so that column is bypass's saving per step (0 with one optimizer step per "
          "rollout, where there is no such pass).")
    print("\n## Dynamic sampling's price (per kept group, mean over steps)\n")
    print("| arm | dynamic sampling | gen rounds | generated tokens / kept group | rollout s / kept group |")
    print("|---|---|---|---|---|")
    for arm, g in wide.groupby("arm", sort=False):
        run = next(iter(tidy[tidy["arm"] == arm]["run"]))
        ds = configs.get(run, {}).get("algo", {}).get("dynamic_sampling", {}).get("enabled", "?")
        kept = g["sampling/kept_groups"].clip(lower=1)
        print(f"| {arm} | {ds} | {g['sampling/gen_rounds'].mean():.2f} | "
              f"{(g['sampling/gen_tokens'] / kept).mean():.0f} | {(g['time/rollout_s'] / kept).mean():.3f} |")
    steps_to_accuracy(tidy, configs, [float(x) for x in a.thresholds.split(",")])
    return 0


def steps_to_accuracy(tidy, configs, thresholds: list[float]) -> None:
    """First eval point (rollout step) whose held-out avg@k >= each threshold, per arm and seed,
    with the rollout tokens generated up to that step; '-' = never within the run."""
    metric = next((m for m in sorted(tidy["metric"].unique()) if m.startswith("eval/") and "/avg_at_" in m), None)
    if metric is None:
        return
    ev = tidy[tidy["metric"] == metric]
    tok = tidy[tidy["metric"] == "sampling/gen_tokens"].sort_values("rollout_step")
    print(f"\n## Steps to a fixed accuracy ({metric}; rollout step of the first eval point at or above the "
          f"level, per seed; in brackets the generated rollout tokens up to it, thousands)\n")
    print("| arm | dynamic sampling | " + " | ".join(f">= {t:.1%}" for t in thresholds) + " |")
    print("|---|---|" + "---|" * len(thresholds))
    for arm in ev["arm"].drop_duplicates():
        run0 = next(iter(tidy[tidy["arm"] == arm]["run"]))
        ds = configs.get(run0, {}).get("algo", {}).get("dynamic_sampling", {}).get("enabled", "?")
        cells = []
        for th in thresholds:
            per_seed = []
            for seed, g in ev[ev["arm"] == arm].groupby("seed"):
                hit = g[(g["value"] >= th) & (g["rollout_step"] > 0)].sort_values("rollout_step")
                if hit.empty:
                    per_seed.append("-")
                    continue
                step = int(hit["rollout_step"].iloc[0])
                t = tok[(tok["arm"] == arm) & (tok["seed"] == seed) & (tok["rollout_step"] <= step)]["value"].sum()
                per_seed.append(f"{step} ({t / 1e3:.0f}k)")
            cells.append(", ".join(per_seed))
        print(f"| {arm} | {ds} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
