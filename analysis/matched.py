"""The primary family's comparisons at equal compute: what a verdict at equal gradient steps costs.

Table 1 compares arms at equal gradient steps. Dynamic sampling generates several times the tokens
of the arm it is compared with, so beside each family row this table gives the same difference at
equal generated tokens and at equal training thread-seconds (where both arms logged them), as an
**exploratory** row (p unadjusted over the family; q: Benjamini–Hochberg over this table's rows).

Per paired seed, C* is the smaller of the two runs' total compute on the axis
(:func:`analysis.curves.compute_points`); each run's value is the mean of its last ``final_k``
evaluations after step 0 whose compute is at most C*, so the arm with more compute is read where it
had spent no more than the other spent in all (at an evaluation at or before C*: never in its favour).
A pair where either run has no evaluation after step 0 within C* is left out (``n`` says how many
are left). ``ratio``: mean over the pairs of on's total compute / off's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .curves import AXES, compute_points
from .stats import ALPHA, LEAD_Q, bh_q, format_p, interval_label, paired_diff

__all__ = ["MATCHED_AXES", "MATCHED_COLUMNS", "matched_table", "format_matched", "MATCHED_NOTE"]

MATCHED_AXES = ("gen_tokens", "thread_s")
"""The axes a family row is matched on (analysis.curves.AXES)."""

MATCHED_COLUMNS = ["comparison", "off", "on", "axis", "ratio", "mean", "lo", "hi", "level", "method", "n", "p", "q",
                   "reading"]


def _at_budget(pts: pd.DataFrame, budget: float, final_k: int) -> float:
    """Mean of the last ``final_k`` evaluations after step 0 with compute ≤ budget (NaN: none)."""
    ok = pts[(pts["rollout_step"] > 0) & (pts["compute"] <= budget * (1 + 1e-12))]
    return float(ok.sort_values("rollout_step")["value"].tail(final_k).mean()) if len(ok) else float("nan")


def _matched_pair(points: pd.DataFrame, off: str, on: str, final_k: int, scale: float):
    """({seed: off value}, {seed: on value}, [on/off compute ratio]) at each seed's equal budget."""
    a, b, ratios = {}, {}, []
    for seed in sorted(set(points.loc[points["arm"] == off, "seed"]) & set(points.loc[points["arm"] == on, "seed"])):
        po = points[(points["arm"] == off) & (points["seed"] == seed)]
        pn = points[(points["arm"] == on) & (points["seed"] == seed)]
        c_off, c_on = float(po["compute"].max()), float(pn["compute"].max())
        if not (c_off > 0 and c_on > 0):
            continue
        budget = min(c_off, c_on)
        vo, vn = _at_budget(po, budget, final_k), _at_budget(pn, budget, final_k)
        if np.isfinite(vo) and np.isfinite(vn):
            a[seed], b[seed] = vo * scale, vn * scale
            ratios.append(c_on / c_off)
    return a, b, ratios


def matched_table(tidy: pd.DataFrame, family: pd.DataFrame, metric: str | None, configs: dict | None,
                  final_k: int, scale: float = 100.0, *, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per family comparison × axis of :data:`MATCHED_AXES` that both arms logged (columns
    :data:`MATCHED_COLUMNS`; values in the family table's unit)."""
    rows = []
    if metric and len(family):
        for axis in MATCHED_AXES:
            points = compute_points(tidy, metric, axis, configs)
            if points.empty:
                continue
            for r in family.itertuples():
                a, b, ratios = _matched_pair(points, r.off, r.on, final_k, scale)
                if len(a) < 2:
                    continue
                d = paired_diff(pd.Series(a), pd.Series(b), alpha=alpha)
                rows.append({"comparison": r.comparison, "off": r.off, "on": r.on, "axis": axis,
                             "ratio": float(np.mean(ratios)), "mean": d.mean, "lo": d.lo, "hi": d.hi,
                             "level": d.level, "method": d.method, "n": d.n, "p": d.p})
    df = pd.DataFrame(rows, columns=[c for c in MATCHED_COLUMNS if c not in ("q", "reading")])
    df["q"] = bh_q(df["p"]) if len(df) else []
    df["reading"] = ["lead" if np.isfinite(q) and q <= LEAD_Q else "inconclusive" for q in df["q"]]
    return df[MATCHED_COLUMNS]


def _s(v: float) -> str:
    return "–" if not np.isfinite(v) else f"{v:+.1f}"


def format_matched(df: pd.DataFrame) -> pd.DataFrame:
    """The table as report.md shows it."""
    return pd.DataFrame({
        "comparison": df["comparison"], "at equal": [AXES[a] for a in df["axis"]],
        "on / off compute": [f"{x:.2f}×" for x in df["ratio"]],
        "Δ [interval]": [f"{_s(m)} [{_s(lo)}, {_s(hi)}] {interval_label(meth, lv)}"
                         for m, lo, hi, lv, meth in zip(df["mean"], df["lo"], df["hi"], df["level"], df["method"])],
        "pairs": df["n"], "p": [format_p(p) for p in df["p"]], "q (BH)": [format_p(q) for q in df["q"]],
        "reading (exploratory)": df["reading"],
    })


MATCHED_NOTE = ("Exploratory (p unadjusted; q: Benjamini–Hochberg over this table's rows, a lead at q ≤ 0.10). "
                "Per paired seed, both runs are read at the smaller of their two total budgets on the axis: each "
                "run's mean of its last evaluations (as in the family table) among those after step 0 whose "
                "compute is within that budget. `on / off compute`: the on arm's total over the off arm's, mean over "
                "pairs. Interval: exact sign-flip over seeds, its level; p: two-sided exact sign-flip test.")
