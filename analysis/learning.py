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

Over seeds: mean, the exact sign-flip interval and the two-sided exact sign-flip p
(:func:`analysis.stats.paired_diff`); the verdict comes from that p
(:func:`analysis.stats.effect_verdict`): "learns" (p ≤ 0.05, up), "gets worse" (p ≤ 0.05, down),
"bounded null" (TOST inside the metric's margin), else "inconclusive". Exploratory: unadjusted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .arms import arms_with_runs
from .mechanisms import window_means
from .metric_names import PERCENT, equivalence_margin, metric_scale, primary_metric
from .runs import SweepInfo
from .stats import bh_q, effect_verdict, too_few_seeds, format_p, interval_label, paired_diff, run_finals
from .tables import _seed_finals

__all__ = ["learning_table", "format_learning", "LEARNING_NOTE"]

LEARNING_NOTE = ("Exploratory (p unadjusted over the rows). Per run: the held-out metric's final (mean of the last "
                 "evaluations, as in Table 1) − its first evaluation (the model before training); the rollout reward "
                 "and accuracy: mean of the last quarter of rollout steps − mean of the first quarter. Accuracies in "
                 "points. Over seeds: mean [exact sign-flip interval, its level]; p: two-sided exact sign-flip test; "
                 "verdict from that p: \"learns\" (p ≤ 0.05, up), \"gets worse\" (p ≤ 0.05, down), \"bounded "
                 "null\" (TOST inside the metric's declared margin), else \"inconclusive\".")


def _first_eval(tidy: pd.DataFrame, metric: str, arm: str) -> pd.Series:
    """{seed: the arm's first evaluation of ``metric``} (several runs of a seed averaged)."""
    d = tidy[(tidy["metric"] == metric) & (tidy["arm"] == arm)].sort_values("grad_step", kind="stable")
    first = d.groupby(["run", "seed"], sort=False)["value"].first().reset_index()
    return first.groupby("seed")["value"].mean()


def _row(arm, evidence: str, start: pd.Series, end: pd.Series, scale: float, margin: float | None) -> dict:
    r = paired_diff(start * scale, end * scale, margin=margin)
    seeds = list(r.seeds)
    return {"arm": arm.name, "label": arm.label or arm.name, "evidence": evidence,
            "start": float(start.loc[seeds].mean() * scale) if seeds else np.nan,
            "end": float(end.loc[seeds].mean() * scale) if seeds else np.nan,
            "value": r.mean, "lo": r.lo, "hi": r.hi, "level": r.level, "method": r.method, "p": r.p,
            "p_tost": r.p_tost, "n": r.n,
            "verdict": too_few_seeds(r.n) or effect_verdict(r.mean, r.p, r.p_tost, predicted=1, yes="learns",
                                                            no="gets worse")}


def learning_table(tidy: pd.DataFrame, sweep: SweepInfo, final_k: int = 3) -> pd.DataFrame:
    """Columns: arm, label, evidence, start, end, value (end − start), lo, hi, level, method, p, p_tost, n,
    verdict.

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
                             _seed_finals(finals, arm.name), scale, equivalence_margin(metric, sweep.margins)))
        for m in ("rollout/reward_mean", "rollout/acc_mean"):
            if m not in has:
                continue
            w = window_means(tidy, m, arm.name)
            if len(w):
                s = w.set_index("seed")
                rows.append(_row(arm, f"{m}: last − first quarter", s["first"], s["last"],
                                 100.0 if m in PERCENT else 1.0, equivalence_margin(m, sweep.margins)))
    cols = ["arm", "label", "evidence", "start", "end", "value", "lo", "hi", "level", "method", "p", "p_tost", "n",
            "verdict"]
    df = pd.DataFrame(rows, columns=cols)
    df.insert(cols.index("p") + 1, "q", bh_q(df["p"]) if len(df) else [])   # Benjamini–Hochberg over the rows
    return df


def _num(v: float, signed: bool = False) -> str:
    if not np.isfinite(v):
        return "–"
    return f"{v:+.3g}" if signed else f"{v:#.3g}"


def format_learning(df: pd.DataFrame) -> pd.DataFrame:
    """The table as shown in report.md."""
    return pd.DataFrame({
        "arm": df["label"], "evidence": df["evidence"],
        "start → end": [f"{_num(a)} → {_num(b)}" for a, b in zip(df["start"], df["end"])],
        "change [interval]": [f"{_num(v, True)} [{_num(lo, True)}, {_num(hi, True)}] {interval_label(m, lv)}"
                              if np.isfinite(lo) else _num(v, True)
                              for v, lo, hi, lv, m in zip(df["value"], df["lo"], df["hi"], df["level"], df["method"])],
        "p (sign-flip)": [format_p(p) for p in df["p"]],
        "q (BH)": [format_p(q) for q in (df["q"] if "q" in df else [np.nan] * len(df))],
        "seeds": df["n"], "verdict (exploratory)": df["verdict"],
    })
