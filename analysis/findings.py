"""A report's opening "What this shows", generated from its verdicts (never written by hand).

Findings are the decided rows of the primary family (a verdict other than "inconclusive", from the
Holm-adjusted p or TOST printed beside it), each with the same comparison at equal compute
(:mod:`analysis.matched`) when the report has it, so a verdict at equal gradient steps is read beside
its price. Undecided family rows are listed as such. Leads are exploratory rows whose
Benjamini–Hochberg q within their own table is at most :data:`analysis.stats.LEAD_Q`; each sentence
says "lead" and gives its p and q. Every sentence carries its number, its interval (method and
level) and its p, so the claims check (:mod:`analysis.claims`) passes it by construction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .curves import AXES
from .stats import LEAD_Q, format_p, interval_label

__all__ = ["what_this_shows"]


def _n(v: float, signed: bool = True) -> str:
    if not np.isfinite(v):
        return "–"
    return (f"{v:+.3g}" if signed else f"{v:.3g}") if abs(v) < 100 else f"{v:+.0f}"


def _iv(mean, lo, hi, method, level) -> str:
    return f"{_n(mean)} [{_n(lo)}, {_n(hi)}] ({interval_label(method, level)})"


def _finding(r, matched: pd.DataFrame, unit: str, stopping: bool) -> str:
    holm, tost = ("p_seq_holm", "p_tost_seq_holm") if stopping else ("p_holm", "p_tost_holm")
    p = getattr(r, tost) if r.verdict == "bounded null" else getattr(r, holm)
    test = "TOST p_Holm" if r.verdict == "bounded null" else "p_Holm"
    where = f", decided at look {int(r.look)}" if stopping and int(getattr(r, "look", 0) or 0) > 0 else ""
    s = (f"- **{r.comparison}: {r.verdict}** ({r.n} paired seeds): {_iv(r.mean, r.lo, r.hi, r.method, r.level)}"
         f"{unit}, {test} {format_p(p)}{where}.")
    for m in matched[(matched["off"] == r.off) & (matched["on"] == r.on)].itertuples() if len(matched) else []:
        s += (f" At equal {AXES[m.axis]} (the on arm used {m.ratio:.2f}× the off arm's): "
              f"{_iv(m.mean, m.lo, m.hi, m.method, m.level)}{unit}, p {format_p(m.p)}, q {format_p(m.q)}"
              f"{' (a lead)' if m.reading == 'lead' else ', exploratory'}.")
    return s


def _leads(tables: dict[str, pd.DataFrame]) -> list[str]:
    out = []
    for name, df in tables.items():
        if df is None or not len(df) or "q" not in df.columns:
            continue
        for r in df[df["q"] <= LEAD_Q].itertuples():
            what = (f"{r.mechanism} ({r.evidence})" if hasattr(r, "mechanism") else
                    f"{r.comparison}, at equal {AXES[r.axis]}" if hasattr(r, "axis") else f"{r.label}: {r.evidence}")
            arms = f" ({r.arms})" if hasattr(r, "arms") else ""
            value = getattr(r, "value", getattr(r, "mean", np.nan))
            out.append(f"- lead ({name}): {what}{arms}: {_iv(value, r.lo, r.hi, r.method, r.level)}, "
                       f"p {format_p(r.p)}, q {format_p(r.q)}.")
    return out


def what_this_shows(family: pd.DataFrame, matched: pd.DataFrame, exploratory: dict[str, pd.DataFrame],
                    unit: str = " points") -> list[str]:
    """The section's markdown lines: findings, undecided family rows, leads (see the module doc)."""
    stopping = bool(family.attrs.get("stopping")) if len(family) else False
    decided = family[family["verdict"] != "inconclusive"] if len(family) else family
    open_rows = family[family["verdict"] == "inconclusive"] if len(family) else family
    lines = ["## What this shows", "",
             "Generated from the verdicts below (analysis/findings.py): findings are decided rows of the primary "
             "family; leads are exploratory rows with a Benjamini–Hochberg q ≤ 0.10 within their table.", ""]
    lines += [_finding(r, matched, unit, stopping) for r in decided.itertuples()] or ["- No finding: no row of "
                                                                                     "the primary family is decided."]
    if stopping and len(open_rows):     # under a stopping rule a row before its first look is not tested yet
        first = int(family.attrs["stopping"]["looks"][0])
        waiting = open_rows[[not str(x).strip() for x in open_rows["looks_done"]]]
        if len(waiting):
            lines.append("- Not tested yet (the declared stopping rule's look 1 needs " + str(first) + " pairs): "
                         + "; ".join(f"{r.comparison}, {int(r.n)} pairs so far" for r in waiting.itertuples()) + ".")
            open_rows = open_rows.drop(waiting.index)
    if len(open_rows):
        holm = "p_seq_holm" if stopping else "p_holm"
        lines.append("- Not decided (inconclusive): " + "; ".join(
            f"{r.comparison}, {_n(r.mean)}{unit} (p_Holm {format_p(getattr(r, holm))})" for r in open_rows.itertuples())
            + ".")
    leads = _leads(exploratory)
    lines += [""] + (leads or ["- No lead: no exploratory row has q ≤ 0.10 within its table."])
    return lines + [""]
