"""Does the policy learn? Per arm, the change over training of the held-out metric, the
rollout reward and the rollout accuracy, with a CI over seeds.

Table 1 compares arms at the end; this asks the question before it: does each arm's policy
improve at all? Per run (d = end − start, so each seed is its own pair):

======================  ============================================================
held-out metric         final (mean of the last ``final_k`` evaluations, as Table 1)
                        − the first evaluation (step 0: the model before training)
rollout/reward_mean     mean over the last quarter of rollout steps − the first quarter
rollout/acc_mean        the same (the reward without the overlong shaping)
======================  ============================================================

Over seeds: mean, 95% percentile-bootstrap CI and the exact paired sign-flip p
(:func:`analysis.stats.paired_diff`). "learns": the CI lies above 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .arms import arms_with_runs
from .mechanisms import window_means
from .metric_names import PERCENT, metric_scale, primary_metric
from .runs import SweepInfo
from .stats import paired_diff, run_finals
from .tables import _seed_finals

__all__ = ["learning_table", "format_learning", "LEARNING_NOTE"]

LEARNING_NOTE = ("Per run: the held-out metric's final (mean of the last evaluations, as in Table 1) − its "
                 "first evaluation (the model before training); the rollout reward and accuracy: mean of the last "
                 "quarter of rollout steps − mean of the first quarter. Accuracies in points. Over seeds: mean "
                 "[95% percentile-bootstrap CI]; p: exact paired sign-flip test. \"learns\": the CI lies above 0.")


def _first_eval(tidy: pd.DataFrame, metric: str, arm: str) -> pd.Series:
    """{seed: the arm's first evaluation of ``metric``} (several runs of a seed averaged)."""
    d = tidy[(tidy["metric"] == metric) & (tidy["arm"] == arm)].sort_values("grad_step", kind="stable")
    first = d.groupby(["run", "seed"], sort=False)["value"].first().reset_index()
    return first.groupby("seed")["value"].mean()


def _row(arm, evidence: str, start: pd.Series, end: pd.Series, scale: float) -> dict:
    r = paired_diff(start * scale, end * scale)
    seeds = list(r.seeds)
    return {"arm": arm.name, "label": arm.label or arm.name, "evidence": evidence,
            "start": float(start.loc[seeds].mean() * scale) if seeds else np.nan,
            "end": float(end.loc[seeds].mean() * scale) if seeds else np.nan,
            "value": r.mean, "lo": r.lo, "hi": r.hi, "p": r.p, "n": r.n,
            "learns": bool(r.n >= 2 and r.lo > 0)}


def learning_table(tidy: pd.DataFrame, sweep: SweepInfo, final_k: int = 3) -> pd.DataFrame:
    """Columns: arm, label, evidence, start, end, value (end − start), lo, hi, p, n, learns.

    One row per arm and evidence (see the module doc); rows whose metric is missing are left out.
    """
    rows: list[dict] = []
    has = set(tidy["metric"].unique())
    metric = sweep.metric or primary_metric(tidy)          # Table 1's metric, in Table 1's unit
    finals = run_finals(tidy, metric, final_k) if metric is not None else None
    scale = metric_scale(tidy, metric) if metric is not None else 1.0
    for arm in arms_with_runs(tidy, sweep):
        if metric is not None:
            rows.append(_row(arm, f"{metric}: final − first evaluation", _first_eval(tidy, metric, arm.name),
                             _seed_finals(finals, arm.name), scale))
        for m in ("rollout/reward_mean", "rollout/acc_mean"):
            if m not in has:
                continue
            w = window_means(tidy, m, arm.name)
            if len(w):
                s = w.set_index("seed")
                rows.append(_row(arm, f"{m}: last − first quarter", s["first"], s["last"],
                                 100.0 if m in PERCENT else 1.0))
    cols = ["arm", "label", "evidence", "start", "end", "value", "lo", "hi", "p", "n", "learns"]
    return pd.DataFrame(rows, columns=cols)


def _num(v: float, signed: bool = False) -> str:
    if not np.isfinite(v):
        return "–"
    return f"{v:+.3g}" if signed else f"{v:#.3g}"


def format_learning(df: pd.DataFrame) -> pd.DataFrame:
    """The table as shown in report.md."""
    return pd.DataFrame({
        "arm": df["label"], "evidence": df["evidence"],
        "start → end": [f"{_num(a)} → {_num(b)}" for a, b in zip(df["start"], df["end"])],
        "change [95% CI]": [f"{_num(v, True)} [{_num(lo, True)}, {_num(hi, True)}]"
                            for v, lo, hi in zip(df["value"], df["lo"], df["hi"])],
        "p": ["–" if not np.isfinite(p) else f"{p:.3f}" for p in df["p"]],
        "seeds": df["n"], "learns": ["yes" if x else "no" for x in df["learns"]],
    })
