"""``make demo``: the whole pipeline, end to end, on this machine.

1. build (or reuse) the tiny supervised base model the spec names (``mini-base-v2``);
2. run naive GRPO vs DAPO (sweeps/demo.yaml: 2 arms, 1 seed) through submitit's local
   executor, each job the one shared training loop with vLLM rollouts, logging to a local
   MLflow store under runs/demo/;
3. regenerate the figures and the table into results/demo/ and print the two final scores.
Rerunning reuses the base model and the finished runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dapo.helptext import help_text

REPO = Path(__file__).resolve().parents[2]


def final_table(df) -> str:
    """The demo's last words: one line per arm (its final score, the change from the arm before it, the
    minutes it trained), then what the number of seeds lets one conclude. ``df`` is ``table1.csv``."""
    def num(v, fmt: str) -> str:
        return "-" if v is None or v != v else format(v, fmt)
    rows = [("arm", "final score", "vs previous", "minutes")]
    for r in df.to_dict("records"):
        rows.append((str(r.get("label") or r.get("arm")), num(r.get("ours"), ".1f"), num(r.get("d_prev"), "+.1f"),
                     num(r.get("wall_min"), ".1f")))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["final scores (% of held-out arithmetic problems solved, avg@8, mean of the last evaluations):"]
    lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
              for row in rows]
    seeds = int(df["n_seeds"].min()) if "n_seeds" in df and len(df) else 0
    if seeds <= 1:
        lines.append("One seed per arm: this shows the pipeline working and what DAPO's parts do (clip fractions, "
                     "kept groups, response lengths: in MLflow and report.md), not whether DAPO scores higher: one "
                     "run per arm cannot tell a difference from seed-to-seed noise (the report's intervals and "
                     "p-values mean something only with several seeds; sweeps/table1-mini.yaml runs 10).")
    else:
        lines.append(f"{seeds} seeds per arm: report.md gives each difference with its interval and p-value.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dapo demo", description=help_text(__doc__, None),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", default=str(REPO / "sweeps" / "demo.yaml"), help="sweep spec to run")
    p.add_argument("--output", default=str(REPO / "runs" / "demo"), help="runs + MLflow store")
    p.add_argument("--results", default=str(REPO / "results" / "demo"), help="figures and tables")
    a = p.parse_args(argv)
    t0 = time.time()

    from dapo.base_model import build_base_model, named_recipe, summary
    from dapo.config import ConfigError, show
    from dapo.sweep.cluster import load_profile
    from dapo.sweep.spec import expand, load_spec
    try:      # every flag checked before anything is built or run: one line, exit 2
        for flag, d in (("--output", a.output), ("--results", a.results)):
            if Path(d).exists() and not Path(d).is_dir():
                raise ConfigError(f"{flag} {show(d)}: not a directory")
        spec = load_spec(a.spec)
        model_path = expand(spec)[0].config.model.path
        recipe = named_recipe(model_path)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from dapo.sweep.launcher import submit
    if recipe is not None:
        print(f"== 1/3 tiny base model {model_path} (supervised, reused when built) ==", flush=True)
        print(summary(build_base_model(**recipe)), flush=True)
    else:
        print(f"== 1/3 base model: {model_path} (not a dapo base recipe; nothing to build) ==", flush=True)

    print("\n== 2/3 GRPO vs DAPO through the local executor ==", flush=True)
    submit(spec, load_profile("local"), a.output)

    print("\n== 3/3 figures and tables ==", flush=True)
    from analysis.report import main as report_main
    rc = report_main([a.spec, "--runs", a.output, "--to", a.results])
    if rc:
        return rc

    import pandas as pd
    table = Path(a.results) / "table1.csv"
    print(f"\nfinished in {(time.time() - t0) / 60:.1f} min")
    if table.exists():
        print(final_table(pd.read_csv(table)))
    print(f"report:  {Path(a.results) / 'report.md'}")
    print(f"figures: {Path(a.results) / 'figures'}")
    from dapo.cli import mlflow_ui_command
    store = f"sqlite:///{Path(a.output).resolve() / 'mlruns.db'}"
    print(f"MLflow:  {store}  ({mlflow_ui_command(store)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
