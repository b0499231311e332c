"""Table 1 (final accuracy per arm, vs the paper) and arm-vs-arm comparison tables.

"Final" for one run is the mean of its last ``final_k`` evaluations of the primary metric;
an arm's value is the mean of its seeds' finals with the 95% Student-t interval over seeds.
The sweep's primary family (each ladder step and the full arm vs the baseline) is tested with
the exact sign-flip test, Holm-adjusted, and each comparison gets one verdict from that test
(:func:`family_table`); the arm-vs-arm tables are exploratory. Accuracies are shown in %
(the paper's unit). Methods and their coverage: docs/STATISTICS.md.

Writers (no extra dependencies): :func:`to_markdown`, :func:`to_csv`, :func:`to_latex`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .arms import (DAPO_TOGGLES, arms_with_runs, baseline_arm, dapo_arm, exact_pairs, flat_arm_configs, grid_change,
                   arm_paper_value, paper_delta, toggle_states)
from .metric_names import (dataset_name, equivalence_margin, is_paper_metric, mask_undefined, metric_scale,
                           metric_short, primary_metric)
from .runs import ArmInfo, SweepInfo
from .stats import (SEEDS_NEEDED_METHOD, effect_verdict, format_p, holm, interval_label, min_pairs_sign_flip, paired_diff,
                    run_finals, sd_interval, seeds_needed_sign_flip, t_interval)

__all__ = ["table1", "format_table1", "table1_footnote", "primary_pairs", "family_table", "format_family",
           "decision_rule", "comparison_label", "loop_seconds", "compare_table", "paired_line", "cost_ledger", "format_cost", "COST_NOTE",
           "to_markdown", "to_csv", "to_latex"]

TABLE1_COLUMNS = ["arm", "label", "ours", "ci_lo", "ci_hi", "n_seeds", "paper", "diff",
                  "grad_steps", "rollout_steps", "wall_min",
                  "d_prev", "d_lo", "d_hi", "d_level", "d_method", "p_prev", "p_holm", "p_tost_holm", "verdict",
                  "n_pairs", "sd_prev", "paper_delta", "seeds_needed", "seeds_needed_lo", "seeds_needed_hi"]
FAMILY_COLUMNS = ["comparison", "off", "on", "isolates", "paper_delta", "mean", "lo", "hi", "level", "method", "n",
                  "seeds", "sd", "p", "p_holm", "margin", "p_tost", "p_tost_holm", "verdict",
                  "seeds_needed", "seeds_needed_lo", "seeds_needed_hi"]
POWER, ALPHA = 0.8, 0.05
"""Power of the seeds-needed column; level of every test (family-wise, after Holm, in the primary family)."""


# --------------------------------------------------------------------------- the primary family
def primary_pairs(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None) -> list[tuple[ArmInfo, ArmInfo]]:
    """The sweep's declared primary family: the (off, on) arm pairs whose tests are Holm-adjusted together.

    A family the spec declares (``family``: [off, on] pairs) is that, in its order (pairs whose arms
    have no runs yet left out). Else a ladder: every step (row − the row above); other kinds: every
    pair of arms that differs in exactly one technique and nothing else
    (:func:`analysis.arms.exact_pairs`: a 2 × 2 grid gives its four simple effects). Then the full
    arm vs the baseline (DAPO − naive GRPO), unless it is already in. Everything else the report
    shows is exploratory.
    """
    arms = arms_with_runs(tidy, sweep)
    if sweep.family:
        by_name = {a.name: a for a in arms}
        return [(by_name[off], by_name[on]) for off, on in sweep.family if off in by_name and on in by_name]
    acfg = flat_arm_configs(tidy, sweep, configs)
    pairs: list[tuple[ArmInfo, ArmInfo]] = []
    if sweep.kind == "ladder":
        pairs = list(zip(arms, arms[1:]))
    else:
        pairs = [(pr.off, pr.on) for pr in exact_pairs(tidy, sweep, configs, _acfg=acfg)]
    base, full = baseline_arm(tidy, sweep, configs, _acfg=acfg), dapo_arm(tidy, sweep, configs, _acfg=acfg)
    if base is not None and full is not None and base.name != full.name:
        pairs.append((base, full))
    seen, out = set(), []
    for off, on in pairs:
        if (off.name, on.name) not in seen:
            seen.add((off.name, on.name))
            out.append((off, on))
    return out


def comparison_label(on: ArmInfo, off: ArmInfo) -> str:
    """"ON vs OFF", or for two grid arms only what differs (:func:`analysis.arms.grid_change`)."""
    return grid_change(off, on) or f"{on.label or on.name} vs {off.label or off.name}"


def _isolates(off: ArmInfo, on: ArmInfo, acfg: dict) -> str:
    """The technique the pair isolates ("clip_higher"), "all" (GRPO → DAPO), or "" (several, or unknown)."""
    if off.name not in acfg or on.name not in acfg:
        return ""
    diff = [t for t, (a, b) in toggle_states(acfg[off.name], acfg[on.name]).items() if a != b]
    if len(diff) == 1:
        return diff[0]
    return "all" if set(diff) == set(DAPO_TOGGLES) else ""


def family_table(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None, final_k: int | None = 3, *,
                 metric: str | None = None, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per comparison of the primary family (:func:`primary_pairs`), on the sweep's metric.

    Columns: comparison, off, on, isolates (technique), paper_delta (:func:`analysis.arms.paper_delta`);
    mean, lo, hi, level, method (:func:`analysis.stats.paired_diff`: the interval of the difference
    over paired seeds, in the table's unit), n, seeds, sd; p (two-sided exact sign-flip), p_holm
    (Holm over the family); margin (:func:`analysis.metric_names.equivalence_margin`), p_tost and
    p_tost_holm (TOST against ±margin, Holm over the family); verdict
    (:func:`analysis.stats.effect_verdict` on p_holm / p_tost_holm, the direction the paper's Δ
    predicts: "reproduces", "contradicts" on the paper's own metric or "harms here" on another,
    "bounded null", "inconclusive"); seeds_needed (:func:`analysis.stats.seeds_needed_sign_flip`
    at 80% power for the paper's Δ at α/m, the level of Holm's first step, so an upper bound) and
    its _lo/_hi at the ends of the SD's 95% χ² interval. ``attrs``: metric, scale, m, alpha.
    """
    final_k = final_k or sweep.final_k
    metric = metric or sweep.metric or primary_metric(tidy)
    scale = metric_scale(tidy, metric) if metric else 1.0
    pairs = primary_pairs(tidy, sweep, configs) if metric else []
    finals = run_finals(tidy, metric, final_k) if metric else None
    acfg = flat_arm_configs(tidy, sweep, configs)
    margin = equivalence_margin(metric, sweep.margins)
    m = len(pairs)
    rows = []
    for off, on in pairs:
        r = paired_diff(_seed_finals(finals, off.name, scale), _seed_finals(finals, on.name, scale),
                        alpha=alpha, margin=margin)
        delta = paper_delta(off, on, acfg)
        lo_sd, hi_sd = sd_interval(r.sd, r.n)
        need = [seeds_needed_sign_flip(sd, delta, POWER, alpha / max(m, 1)) for sd in (r.sd, lo_sd, hi_sd)]
        rows.append({"comparison": comparison_label(on, off), "off": off.name,
                     "on": on.name, "isolates": _isolates(off, on, acfg), "paper_delta": delta,
                     "mean": r.mean, "lo": r.lo, "hi": r.hi, "level": r.level, "method": r.method, "n": r.n,
                     "seeds": ",".join(str(x) for x in r.seeds), "sd": r.sd, "p": r.p, "margin": r.margin,
                     "p_tost": r.p_tost,
                     **{k: float(v) if v is not None else np.nan
                        for k, v in zip(("seeds_needed", "seeds_needed_lo", "seeds_needed_hi"), need)}})
    df = pd.DataFrame(rows, columns=[c for c in FAMILY_COLUMNS if c not in ("p_holm", "p_tost_holm", "verdict")])
    df["p_holm"] = holm(df["p"].to_numpy(dtype=float)) if len(df) else []
    df["p_tost_holm"] = holm(df["p_tost"].to_numpy(dtype=float)) if len(df) else []
    against = "contradicts" if is_paper_metric(metric) else "harms here"
    seq = _sequential_columns(pairs, finals, sweep, scale, margin, alpha) if sweep.stopping and len(df) else None
    if seq is not None:
        for k, v in seq.items():
            df[k] = v
    p_dec, t_dec = (("p_seq_holm", "p_tost_seq_holm") if seq is not None else ("p_holm", "p_tost_holm"))
    # no paper direction: a decided difference "differs" (a significant change nobody predicted is no reproduction)
    df["verdict"] = [effect_verdict(mu, p, pt, predicted=int(np.sign(d)) if np.isfinite(d) and d else 0,
                                    alpha=alpha, yes="reproduces", no=against)
                     for mu, p, pt, d in zip(df["mean"], df[p_dec], df[t_dec], df["paper_delta"])]
    df = df[FAMILY_COLUMNS + (SEQUENTIAL_COLUMNS if seq is not None else [])]
    df.attrs.update(metric=metric, scale=scale, m=m, alpha=alpha, final_k=final_k,
                    stopping=dict(sweep.stopping) if seq is not None else None,
                    unplanned=bool(seq is not None and any(seq["unplanned"])))
    return df


SEQUENTIAL_COLUMNS = ["looks_done", "look", "p_seq", "p_seq_holm", "p_tost_seq", "p_tost_seq_holm", "unplanned"]
"""family.csv's columns under a declared stopping rule (analysis.sequential): the declared looks the pairs
complete, the look that decided the row (0: none yet), the repeated p and its Holm adjustment, the same
for TOST, and whether there were more pairs than the last declared look."""


def _sequential_columns(pairs, finals, sweep: SweepInfo, scale: float, margin: float, alpha: float) -> dict:
    """The repeated p-values of each comparison under the spec's stopping rule, pairs in declared seed order."""
    from .sequential import sequential_family
    st = sweep.stopping
    seeds = list(sweep.seeds)
    diffs = []
    for off, on in pairs:
        a, b = _seed_finals(finals, off.name, scale), _seed_finals(finals, on.name, scale)
        extra = sorted((set(a.index) & set(b.index)) - set(seeds))   # seeds the declaration never named
        diffs.append(np.array([b.get(x, np.nan) - a.get(x, np.nan) for x in seeds + extra], dtype=float))
    fam = sequential_family(diffs, tuple(st["looks"]), st["spending"], margin=margin, alpha=float(st.get("alpha", alpha)))
    return {"looks_done": [",".join(map(str, r["looks_done"])) for r in fam], "look": [r["look"] for r in fam],
            "p_seq": [r["p_seq"] for r in fam], "p_seq_holm": [r["p_seq_holm"] for r in fam],
            "p_tost_seq": [r["p_tost_seq"] for r in fam], "p_tost_seq_holm": [r["p_tost_seq_holm"] for r in fam],
            "unplanned": [bool(r["unplanned"]) for r in fam]}


def loop_seconds(tidy: pd.DataFrame) -> pd.Series:
    """{run: the training loop's own seconds}: the sum of ``time/step_s`` (each step, its evaluation
    included) + the evaluation before training (``time/eval_s`` at rollout step 0). Never last point −
    start, which would count the time between a stopped run and its resumption."""
    ev = tidy.loc[tidy["metric"] == "time/eval_s"]
    ev0 = ev[ev["rollout_step"].fillna(0) == 0].groupby("run")["value"].sum()
    steps = _run_sum(tidy, "time/step_s")                  # runs without step times: no loop time at all
    return steps + ev0.reindex(steps.index).fillna(0.0)


# --------------------------------------------------------------------------- Table 1
def table1(tidy: pd.DataFrame, sweep_info: SweepInfo, final_k: int | None = 3, *,
           metric: str | None = None, configs: dict | None = None, family: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per arm of the sweep (sweep order; arms without runs have n_seeds 0), numeric columns:

    arm, label; ours, ci_lo, ci_hi (% if the metric is an accuracy in [0, 1]; the 95% Student-t
    interval over seeds, :func:`analysis.stats.t_interval`); n_seeds; paper (Table 1's value for the
    arm's configuration, NaN for one the paper never ran: :func:`analysis.arms.arm_paper_value`; %); diff = ours − paper, only when the metric is the paper's own (AIME 2024 avg@32,
    ``metric_names.is_paper_metric``), else NaN; grad_steps, rollout_steps (mean over seeds of
    each run's last step); wall_min (mean over seeds of each run's loop minutes, :func:`loop_seconds`).
    Ladders only, the row vs the row above, from the primary family (:func:`family_table`; NaN on the
    first row and for other kinds): d_prev, d_lo, d_hi, d_level, d_method, p_prev, p_holm,
    p_tost_holm, verdict, n_pairs, sd_prev, paper_delta, seeds_needed (_lo, _hi).
    ``df.attrs``: metric, final_k, scale, vs_paper, kind, m (family size).
    """
    final_k = final_k or sweep_info.final_k
    metric = metric or sweep_info.metric or primary_metric(tidy)
    vs_paper = is_paper_metric(metric)
    scale = metric_scale(tidy, metric) if metric else 1.0
    finals = run_finals(tidy, metric, final_k) if metric else pd.DataFrame(columns=["arm", "final"])
    fam = family if family is not None else family_table(tidy, sweep_info, configs, final_k, metric=metric)
    per_run = tidy.groupby(["arm", "run"], sort=False).agg(
        grad=("grad_step", "max"), rollout=("rollout_step", "max")).reset_index()
    per_run["loop"] = per_run["run"].map(loop_seconds(tidy)).astype(float)
    rows = []
    names = {a.name for a in sweep_info.arms}
    arms = list(sweep_info.arms) + [a for a in arms_with_runs(tidy, sweep_info) if a.name not in names]
    acfg = flat_arm_configs(tidy, sweep_info, configs)
    prev = None
    for arm in arms:
        f = finals.loc[finals["arm"] == arm.name, "final"].to_numpy(dtype=float)
        iv = t_interval(f)
        pr = per_run[per_run["arm"] == arm.name]
        ours = iv.mean * scale
        paper = arm_paper_value(arm, acfg)
        step = fam[(fam["off"] == prev.name) & (fam["on"] == arm.name)] if prev is not None and len(fam) else fam[:0]
        rows.append({
            "arm": arm.name, "label": arm.label, "ours": ours, "ci_lo": iv.lo * scale, "ci_hi": iv.hi * scale,
            "n_seeds": int(np.isfinite(f).sum()), "paper": paper,
            "diff": ours - paper if vs_paper else np.nan,
            "grad_steps": float(pr["grad"].mean()),
            "rollout_steps": float(pd.to_numeric(pr["rollout"], errors="coerce").astype(float).mean()),
            "wall_min": float(pr["loop"].mean() / 60.0),
            **_step_cols(step if sweep_info.kind == "ladder" else fam[:0]),
        })
        prev = arm
    df = pd.DataFrame(rows, columns=TABLE1_COLUMNS)
    df.attrs.update(metric=metric, final_k=final_k, scale=scale, vs_paper=vs_paper, kind=sweep_info.kind,
                    m=fam.attrs.get("m", len(fam)))
    return df


def _step_cols(step: pd.DataFrame) -> dict:
    """Table 1's paired columns from one family row (NaN when there is none)."""
    if not len(step):
        return {"d_prev": np.nan, "d_lo": np.nan, "d_hi": np.nan, "d_level": np.nan, "d_method": "",
                "p_prev": np.nan, "p_holm": np.nan, "p_tost_holm": np.nan, "verdict": "", "n_pairs": 0,
                "sd_prev": np.nan, "paper_delta": np.nan, "seeds_needed": np.nan, "seeds_needed_lo": np.nan,
                "seeds_needed_hi": np.nan}
    r = step.iloc[0]
    return {"d_prev": r["mean"], "d_lo": r["lo"], "d_hi": r["hi"], "d_level": r["level"], "d_method": r["method"],
            "p_prev": r["p"], "p_holm": r["p_holm"], "p_tost_holm": r["p_tost_holm"], "verdict": r["verdict"],
            "n_pairs": int(r["n"]), "sd_prev": r["sd"], "paper_delta": r["paper_delta"],
            "seeds_needed": r["seeds_needed"], "seeds_needed_lo": r["seeds_needed_lo"],
            "seeds_needed_hi": r["seeds_needed_hi"]}


def _seed_finals(finals: pd.DataFrame, arm: str, scale: float = 1.0) -> pd.Series:
    """{seed: final × scale} of one arm (a run_finals frame; several runs of one seed are averaged)."""
    g = finals.loc[finals["arm"] == arm]
    return (g.groupby("seed")["final"].mean() * scale).astype(float)


def _fmt(v, digits=1) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{v:.{digits}f}"


def _signed(v, digits=1) -> str:
    """+1.2 / −0.5 / 0.0 / – ."""
    if v is None or not np.isfinite(v):
        return "–"
    s = f"{v:+.{digits}f}"
    return "0.0" if float(s) == 0 else s.replace("-", "−")


def _fmt_diff_ci(m, lo, hi, n, level=np.nan, method="", *, with_level: bool = False) -> str:
    """"+1.2 [−0.3, +2.5]" (+ " 96.9% sign-flip" with_level; one pair: no interval)."""
    if not np.isfinite(m):
        return "–"
    if n < 2 or not np.isfinite(lo):
        return _signed(m)
    return _signed(m) + f" [{_signed(lo)}, {_signed(hi)}]" + (f" {interval_label(method, level)}" if with_level else "")


def _interval_head(levels, methods) -> tuple[str, bool]:
    """("96.9% sign-flip", False) when every interval shown has that level and method, else ("interval", True)."""
    shown = {interval_label(m, lv) for lv, m in zip(levels, methods) if m and m != "none" and np.isfinite(lv)}
    return (shown.pop(), False) if len(shown) == 1 else ("interval, level in the cell", True)


def _fmt_need(need, lo, hi, paper_delta) -> str:
    """"10 (6–48) for +1": seeds needed for the paper's Δ, in parentheses over the SD's interval; "–" when undefined."""
    if need is None or not np.isfinite(need):
        return "–"
    d = _fmt(paper_delta, 0) if float(paper_delta).is_integer() else _fmt(paper_delta)
    rng = (f" ({int(lo)}–{int(hi)})" if np.isfinite(lo) and np.isfinite(hi) and (lo != need or hi != need) else "")
    return f"{int(need)}{rng} for {'+' if paper_delta > 0 else ''}{d.replace('-', '−')}"


PAPER_ALONE = "paper's value (Qwen2.5-32B, AIME 2024 avg@32)"
"""The paper column's header when the sweep's metric is not the paper's: its number stands alone."""


def format_table1(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1 as display strings (what the .md and .tex files show).

    "paper" and "ours − paper" side by side only when the metric is the paper's (``attrs
    vs_paper``); otherwise the paper's value stands alone under :data:`PAPER_ALONE`.
    """
    metric = df.attrs.get("metric") or ""
    unit = " (%)" if df.attrs.get("scale", 1.0) == 100 else ""
    head = f"{dataset_name(metric)} {metric_short(metric)}{unit}".strip()
    vs_paper = bool(df.attrs.get("vs_paper", is_paper_metric(metric)))
    ladder = df.attrs.get("kind", "ladder") == "ladder"
    ihead, per_cell = _interval_head(df["d_level"], df["d_method"])
    m = df.attrs.get("m", 0)
    out = pd.DataFrame({
        "Arm": df["label"],
        f"{head}, ours [95% t]": [
            f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]" if n > 1 else _fmt(v)
            for v, lo, hi, n in zip(df["ours"], df["ci_lo"], df["ci_hi"], df["n_seeds"])],
        "seeds": df["n_seeds"].astype(int).astype(str),
        "paper" if vs_paper else PAPER_ALONE:
            [_fmt(v, 0) if np.isfinite(v) and float(v).is_integer() else _fmt(v) for v in df["paper"]],
        **({"ours − paper": [("+" if np.isfinite(v) and v > 0 else "") + _fmt(v) for v in df["diff"]]}
           if vs_paper else {}),
        "grad steps": [_fmt(v, 0) for v in df["grad_steps"]],
        "rollout steps": [_fmt(v, 0) for v in df["rollout_steps"]],
        "loop (min/run)": [_fmt(v) for v in df["wall_min"]],
    })
    if ladder:
        out[f"Δ vs previous arm ({'pp' if df.attrs.get('scale', 1.0) == 100 else 'units'}) [{ihead}]"] = [
            _fmt_diff_ci(v, lo, hi, n, lv, me, with_level=per_cell)
            for v, lo, hi, n, lv, me in zip(df["d_prev"], df["d_lo"], df["d_hi"], df["n_pairs"], df["d_level"],
                                            df["d_method"])]
        out["p (sign-flip)"] = [format_p(v) for v in df["p_prev"]]
        out[f"p Holm (family of {m})"] = [format_p(v) for v in df["p_holm"]]
        out["verdict"] = [v or "–" for v in df["verdict"]]
        out["seeds for paper's Δ (80% power, Holm)"] = [
            _fmt_need(n, lo, hi, d) for n, lo, hi, d in zip(df["seeds_needed"], df["seeds_needed_lo"],
                                                           df["seeds_needed_hi"], df["paper_delta"])]
    out.attrs.update(df.attrs)
    return out


SPENDING_NAMES = {"obrien_fleming": "O'Brien–Fleming-type", "pocock": "Pocock-type"}


def decision_rule(m: int, alpha: float = ALPHA, *, declared: bool = False, stopping: dict | None = None) -> str:
    """The rule every report states at its top (one paragraph); ``declared``: the spec names the family;
    ``stopping``: the spec's stopping rule (looks, spending). When the family was chosen is not said
    here: :func:`analysis.declared.declaration_sentence` derives it from the records."""
    which = ("the comparisons the sweep spec lists under `family`" if declared else
             "each step of the ladder (a row vs the row above; for other sweeps, each pair that isolates one "
             "technique) and the full arm vs the baseline")
    if stopping:
        looks = ", ".join(str(n) for n in stopping["looks"])
        test = (f"Each is tested at the declared looks ({looks} pairs: the first n of the spec's seeds) by the "
                f"exact sign-flip test with {SPENDING_NAMES.get(stopping['spending'], stopping['spending'])} "
                f"α spending; p is its repeated p-value (valid however the looks were stopped), Holm-adjusted over "
                f"the family, and a verdict comes from the adjusted p alone")
    else:
        test = ("Each is tested with the two-sided exact sign-flip test; p is Holm-adjusted over the family and a "
                "verdict comes from the adjusted p alone")
    return (f"**Decision rule.** The primary family: {which} — here {m} "
            f"comparison{'s' if m != 1 else ''} of the sweep's metric, final value per run, "
            f"paired by seed. {test}: p_Holm ≤ {alpha} in the paper's direction: "
            f"**reproduces**; in the other: **harms here** (**contradicts** only on the paper's own metric); "
            f"without a paper direction: **differs**; "
            f"else, when TOST (two one-sided sign-flip tests, Holm-adjusted) bounds the difference inside the "
            f"metric's declared margin: **bounded null**; else **inconclusive**. Intervals are labelled with "
            f"their method and true level (the exact sign-flip interval at n pairs has level 1 − 2k/2^n). Every "
            f"other number in this report (mechanisms, learning, the arm-vs-arm comparison) is **exploratory**: "
            f"its p is unadjusted and its verdict a lead, not a finding. Methods: docs/STATISTICS.md.")


def decidable_note(m: int, pairs: int, alpha: float = ALPHA) -> str:
    """One sentence when the family cannot be decided with ``pairs`` pairs (the fewest of any row), else "".

    The exact two-sided sign-flip test's smallest p at n pairs is 2/2^n, and Holm's first step needs
    p ≤ α/m, so below :func:`min_pairs_sign_flip` (α/m) pairs no row can be decided whatever the data."""
    if m < 1:
        return ""
    need = min_pairs_sign_flip(alpha / m)
    if pairs >= need:
        return ""
    if pairs < 2:
        what = (f"With {max(pairs, 0)} pair{'s' if pairs != 1 else ''} per comparison there is no test: every p "
                f"below is 1 (or –) by construction, whatever the data")
    else:
        what = (f"With {pairs} pairs (the fewest of any row) the exact test's smallest p is 2/2^{pairs} = "
                f"{2 / 2 ** pairs:.3f}, and Holm over {m} needs {alpha / m:.4f} for its first row")
    return (f"**What these seeds can decide: nothing yet.** {what}; {need} pairs per comparison are the fewest "
            f"with which a row of this family can be decided. The differences below are directions, not findings.")


def format_family(df: pd.DataFrame) -> pd.DataFrame:
    """The primary family as shown at the top of report.md."""
    unit = " (pp)" if df.attrs.get("scale", 1.0) == 100 else ""
    return pd.DataFrame({
        "comparison": df["comparison"],
        "paper's Δ": [_signed(v, 0) if np.isfinite(v) and float(v).is_integer() else _signed(v)
                      for v in df["paper_delta"]],
        f"Δ{unit} [interval, level]": [_fmt_diff_ci(v, lo, hi, n, lv, me, with_level=True) for v, lo, hi, n, lv, me
                                      in zip(df["mean"], df["lo"], df["hi"], df["n"], df["level"], df["method"])],
        "pairs": df["n"].astype(int).astype(str),
        "p": [format_p(v) for v in df["p"]],
        "p Holm": [format_p(v) for v in df["p_holm"]],
        f"TOST ±m{unit}, p Holm": [f"±{_fmt(mg, 2 if mg < 1 else 1)}: {format_p(pt)}" if np.isfinite(mg) else "–"
                                   for mg, pt in zip(df["margin"], df["p_tost_holm"])],
        **({"look (repeated p, Holm)": [
            (f"{'unplanned ' if u else ''}look {k}: {format_p(ph)}" if k else f"undecided after {ld or 'no look'}: "
             f"{format_p(ph)}") for k, ph, ld, u in zip(df["look"], df["p_seq_holm"], df["looks_done"], df["unplanned"])]}
           if "p_seq_holm" in df.columns else {}),
        "verdict": [f"{v} (unplanned look)" if u else v
                    for v, u in zip(df["verdict"], df["unplanned"] if "unplanned" in df.columns else [False] * len(df))],
        "seeds for paper's Δ (80% power, Holm)": [
            _fmt_need(n, lo, hi, d) for n, lo, hi, d in zip(df["seeds_needed"], df["seeds_needed_lo"],
                                                           df["seeds_needed_hi"], df["paper_delta"])],
    })


def table1_footnote(df: pd.DataFrame) -> str:
    """The note under Table 1: which intervals, which test, which family, which power assumptions."""
    unit = "percentage points" if df.attrs.get("scale", 1.0) == 100 else "the metric's units"
    ours = ("ours [95% t]: mean over seeds of each run's final value and the 95% Student-t interval over seeds "
            "(exact for normal seed values; no interval with one seed). Loop: the run's own training-loop time "
            "(steps and evaluations), not the wall clock between its first and last point.")
    if df.attrs.get("kind", "ladder") != "ladder":
        return (ours + " Paired columns are computed for ladders only; this sweep is a "
                f"{df.attrs.get('kind')}: see the primary family above and compare.md for its pairs.")
    return (f"{ours} Δ vs previous arm: this row − the row above, per seed (pairs = seeds both arms ran), mean "
            f"over pairs in {unit}; interval: the exact sign-flip interval (Hartigan's subset means; level "
            f"1 − 2k/2^n, the nearest at or above 95%, so [min, max] at 96.9% with 6 pairs and 75% with 3; "
            f"Student-t above 16 pairs). p: two-sided exact paired sign-flip test (all 2^n flips), smallest "
            f"possible 2/2^n; p Holm: adjusted over the primary family of {df.attrs.get('m', 0)} (each step "
            f"and the last arm vs the first); verdict: from p Holm and TOST, see the decision rule. Seeds for "
            f"paper's Δ: the paper's step for the one technique the pair isolates (its Table 1, points), "
            f"{SEEDS_NEEDED_METHOD}; tested at α/m (Holm's first step), so an upper bound; – when undefined.")


def compare_table(tidy: pd.DataFrame, arm_a: str, arm_b: str, *, final_k: int = 3) -> pd.DataFrame:
    """Every logged metric: final value (mean of each run's last final_k points), mean over seeds,
    for arm_a and arm_b, and ``diff = b − a``. Accuracies in %, other metrics as logged. Exploratory.

    Columns: metric, unit, <arm_a>, <arm_b>, diff, n_a, n_b, then paired by seed
    (:func:`analysis.stats.paired_diff`, seeds both arms have): paired_diff, paired_lo,
    paired_hi, level, method (the difference's interval), p (two-sided exact sign-flip,
    unadjusted), n_pairs. Points that are undefined (``metric_names.mask_undefined``: no
    up-clipped token) are left out, not averaged in as 0.
    """
    d = mask_undefined(tidy[tidy["arm"].isin([arm_a, arm_b])])
    d = d.sort_values(["run", "metric", "grad_step"], kind="stable")
    last = d.groupby(["run", "metric"], sort=False).tail(final_k)
    per_run = last.groupby(["arm", "run", "seed", "metric"], sort=False)["value"].mean().reset_index()
    agg = per_run.groupby(["metric", "arm"])["value"].agg(["mean", "count"]).unstack("arm")
    by_seed = {k: g.groupby("seed")["value"].mean() for k, g in per_run.groupby(["metric", "arm"], sort=False)}
    empty = pd.Series(dtype=float)
    rows = []
    for metric in sorted(agg.index):
        s = metric_scale(tidy, metric)
        a = agg.loc[metric].get(("mean", arm_a), np.nan) * s
        b = agg.loc[metric].get(("mean", arm_b), np.nan) * s
        r = paired_diff(by_seed.get((metric, arm_a), empty) * s, by_seed.get((metric, arm_b), empty) * s)
        rows.append({"metric": metric, "unit": "%" if s == 100 else "", arm_a: a, arm_b: b, "diff": b - a,
                     "n_a": int(np.nan_to_num(agg.loc[metric].get(("count", arm_a), 0))),
                     "n_b": int(np.nan_to_num(agg.loc[metric].get(("count", arm_b), 0))),
                     "paired_diff": r.mean, "paired_lo": r.lo, "paired_hi": r.hi,
                     "level": r.level, "method": r.method, "p": r.p, "n_pairs": r.n})
    return pd.DataFrame(rows, columns=["metric", "unit", arm_a, arm_b, "diff", "n_a", "n_b",
                                       "paired_diff", "paired_lo", "paired_hi", "level", "method", "p", "n_pairs"])


def paired_line(tidy: pd.DataFrame, off: ArmInfo, on: ArmInfo, metric: str, final_k: int = 3, *,
                configs: dict | None = None, sweep: SweepInfo | None = None) -> str:
    """One markdown line: ``on`` − ``off`` on ``metric`` paired over seeds, its interval and level, the
    unadjusted p, the TOST against the metric's margin and the seeds needed for the paper's Δ
    (exploratory: a pair of the primary family has its adjusted verdict in the family table)."""
    scale = metric_scale(tidy, metric)
    unit = " pp" if scale == 100 else ""
    margin = equivalence_margin(metric, sweep.margins if sweep is not None else None)
    finals = run_finals(tidy, metric, final_k)
    r = paired_diff(_seed_finals(finals, off.name, scale), _seed_finals(finals, on.name, scale), margin=margin)
    if r.n == 0:
        return f"Paired over seeds on `{metric}`: no seed ran in both arms.\n"
    test = f"exact sign-flip, 2^{r.n} = {2 ** r.n} flips" if r.exact else "Monte Carlo sign flips"
    ci = f" [{_signed(r.lo)}, {_signed(r.hi)}; {interval_label(r.method, r.level)}]" if r.n > 1 else ""
    tost = (f"; TOST against ±{_fmt(margin, 2 if margin < 1 else 1)}{unit}: p = {format_p(r.p_tost)}"
            if margin is not None else "")
    acfg = flat_arm_configs(tidy, sweep, configs) if sweep is not None else None
    delta = paper_delta(off, on, acfg)
    if np.isfinite(delta):
        need = seeds_needed_sign_flip(r.sd, delta, POWER, ALPHA)
        lo_sd, hi_sd = sd_interval(r.sd, r.n)
        lo, hi = (seeds_needed_sign_flip(x, delta, POWER, ALPHA) for x in (lo_sd, hi_sd))
        lo, hi = (np.nan if v is None else v for v in (lo, hi))
        paper = (f"; seeds for the paper's Δ ({_fmt_need(need, lo, hi, delta)}"
                 f", 80% power, α = 0.05 unadjusted)" if need is not None else "")
    else:
        paper = "; no paper values for this pair, so no seeds-needed"
    return (f"**Paired over seeds** on `{metric}` (n = {r.n} pairs, seeds {', '.join(str(x) for x in r.seeds)}): "
            f"Δ = {_signed(r.mean)}{unit}{ci}, p = {format_p(r.p)} ({test}, unadjusted; SD of differences "
            f"{_fmt(r.sd, 2)}{unit}){tost}{paper}.\n")


# --------------------------------------------------------------------------- cost ledger
COST_NOTE = ("Per run, mean over seeds. Generated tokens: sum of `sampling/gen_tokens` over the rollout steps "
             "(every sampled response, including groups dynamic sampling discards; evaluation not counted). "
             "Trained tokens: sum over rollout steps of `perf/train_tokens_per_s` × `time/train_s`, which is "
             "exactly the prompt + response tokens of the kept batch × `train.ppo_epochs` that went through "
             "forward and backward. Thread-s: loop seconds (sum of `time/step_s`, which includes each step's "
             "evaluation, + the evaluation before training) × `train.threads`: the run records wall time only, "
             "so this is wall × threads, an upper bound on CPU-seconds (model loading not counted; – when "
             "threads was left to all cores). Gain: final − first evaluation of the metric, in points, and p: "
             "the two-sided exact sign-flip test of that change over seeds (exploratory, unadjusted). Thread-s "
             "per point = thread-s / gain, only where the gain is positive with p ≤ 0.05; else –, since a cost "
             "per point of a gain not shown to exist would be a ratio of noise.")
"""What the cost ledger counts, in words (under the table)."""

COST_COLUMNS = ["arm", "label", "n_runs", "gen_tokens", "trained_tokens", "loop_s", "threads", "thread_s",
                "first", "final", "gain", "gain_p", "thread_s_per_point"]


def _run_sum(tidy: pd.DataFrame, metric: str) -> pd.Series:
    """{run: sum of metric over its points}."""
    return tidy.loc[tidy["metric"] == metric].groupby("run")["value"].sum()


def _threads(configs: dict | None, run: str) -> float:
    t = ((configs or {}).get(run) or {}).get("train", {}).get("threads")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 1 else np.nan


def cost_ledger(tidy: pd.DataFrame, sweep_info: SweepInfo, configs: dict | None = None, *,
                metric: str | None = None, final_k: int = 3) -> pd.DataFrame:
    """One row per arm with runs (sweep order): what a run cost and what it bought (see :data:`COST_NOTE`).

    Columns (per run, mean over the arm's seeds): gen_tokens, trained_tokens, loop_s, threads,
    thread_s = loop_s × threads (NaN when threads is unknown); first, final (the metric's first
    evaluation and the mean of its last final_k, in the table's unit), gain = final − first, gain_p (the
    two-sided sign-flip p of final − first paired by seed), thread_s_per_point = thread_s / gain where
    gain > 0 and gain_p ≤ α (else NaN). configs: {run: resolved config}.
    """
    metric = metric or sweep_info.metric or primary_metric(tidy)
    scale = metric_scale(tidy, metric) if metric else 1.0
    runs = tidy[["arm", "run"]].drop_duplicates()
    gen = _run_sum(tidy, "sampling/gen_tokens")
    tr = tidy.loc[tidy["metric"].isin(["perf/train_tokens_per_s", "time/train_s"])]
    tr = tr.pivot_table(index=["run", "grad_step"], columns="metric", values="value", aggfunc="last")
    trained = ((tr["perf/train_tokens_per_s"] * tr["time/train_s"]).round().groupby(level="run").sum()
               if {"perf/train_tokens_per_s", "time/train_s"} <= set(tr.columns) else pd.Series(dtype=float))
    loop = loop_seconds(tidy)
    m = tidy.loc[tidy["metric"] == metric].dropna(subset=["value"]).sort_values(["run", "grad_step"], kind="stable")
    first = m.groupby("run")["value"].first() * scale
    final = m.groupby("run").tail(final_k).groupby("run")["value"].mean() * scale
    seed_of = tidy[["run", "seed"]].drop_duplicates("run").set_index("run")["seed"]
    per = pd.DataFrame({"run": runs["run"].to_numpy(), "arm": runs["arm"].to_numpy()})
    for name, ser in (("gen_tokens", gen), ("trained_tokens", trained), ("loop_s", loop),
                      ("first", first), ("final", final)):
        per[name] = per["run"].map(ser).astype(float)
    per["threads"] = [_threads(configs, r) for r in per["run"]]
    per["thread_s"] = per["loop_s"] * per["threads"]
    rows = []
    for arm in arms_with_runs(tidy, sweep_info):
        g = per[per["arm"] == arm.name]
        mean = {c: float(g[c].mean()) if g[c].notna().any() else np.nan
                for c in ("gen_tokens", "trained_tokens", "loop_s", "threads", "thread_s", "first", "final")}
        gain = mean["final"] - mean["first"]
        by_seed = g.assign(seed=g["run"].map(seed_of)).groupby("seed")[["first", "final"]].mean()
        p = paired_diff(by_seed["first"].dropna(), by_seed["final"].dropna()).p
        shown = np.isfinite(gain) and gain > 0 and np.isfinite(p) and p <= ALPHA
        rows.append({"arm": arm.name, "label": arm.label, "n_runs": int(len(g)), **mean, "gain": gain, "gain_p": p,
                     "thread_s_per_point": mean["thread_s"] / gain if shown else np.nan})
    df = pd.DataFrame(rows, columns=COST_COLUMNS)
    df.attrs.update(metric=metric, scale=scale, final_k=final_k)
    return df


def _fmt_count(v) -> str:
    """12345678 → "12.3M"; 45678 → "45.7k"."""
    if v is None or not np.isfinite(v):
        return "–"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.1f}{suf}"
    return f"{v:.0f}"


def format_cost(df: pd.DataFrame) -> pd.DataFrame:
    """The cost ledger as display strings."""
    unit = " (pp)" if df.attrs.get("scale", 1.0) == 100 else ""
    metric = metric_short(df.attrs.get("metric") or "")
    return pd.DataFrame({
        "Arm": df["label"], "runs": df["n_runs"].astype(int).astype(str),
        "generated tokens/run": [_fmt_count(v) for v in df["gen_tokens"]],
        "trained tokens/run": [_fmt_count(v) for v in df["trained_tokens"]],
        "threads": [_fmt(v, 0) for v in df["threads"]],
        "thread-s/run (loop × threads)": [_fmt(v, 0) for v in df["thread_s"]],
        f"{metric} first → final{unit}": [f"{_fmt(a)} → {_fmt(b)}" for a, b in zip(df["first"], df["final"])],
        f"gain{unit}": [f"{_signed(v)} (p {format_p(p)})" if np.isfinite(p) else _signed(v)
                            for v, p in zip(df["gain"], df["gain_p"])],
        "thread-s per point gained": [_fmt(v, 0) for v in df["thread_s_per_point"]],
    })


# --------------------------------------------------------------------------- writers
def _cell(v, floatfmt: str) -> str:
    if isinstance(v, (float, np.floating)):
        return "–" if not np.isfinite(v) else format(float(v), floatfmt)
    return str(v)


def to_markdown(df: pd.DataFrame, path: str | Path | None = None, *, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured pipe table (numbers right-aligned); written to path if given."""
    cols = [str(c) for c in df.columns]
    cells = [[_cell(v, floatfmt).replace("|", "\\|") for v in row] for row in df.itertuples(index=False)]
    num = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(
        v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, num)) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if n else ("-" * (w + 2)) for w, n in zip(widths, num)) + "|"
    text = "\n".join([line(cols), sep] + [line(r) for r in cells]) + "\n"
    if path is not None:
        Path(path).write_text(text)
    return text


def to_csv(df: pd.DataFrame, path: str | Path) -> Path:
    df.to_csv(path, index=False)
    return Path(path)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
        "−": "$-$", "–": "--", "Δ": r"$\Delta$", "α": r"$\alpha$", "≤": r"$\leq$", "→": r"$\rightarrow$"}


def _tex(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def to_latex(df: pd.DataFrame, path: str | Path | None = None, *, caption: str | None = None,
             label: str | None = None, floatfmt: str = ".4g") -> str:
    """A booktabs ``table`` environment; written to path if given."""
    align = "".join("r" if pd.api.types.is_numeric_dtype(df[c]) else "l" for c in df.columns)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(r"\caption{" + _tex(caption) + "}")
    if label:
        lines.append(r"\label{" + label + "}")
    lines += [r"\begin{tabular}{" + align + "}", r"\toprule",
              " & ".join(_tex(str(c)) for c in df.columns) + r" \\", r"\midrule"]
    for row in df.itertuples(index=False):
        lines.append(" & ".join(_tex(_cell(v, floatfmt)) for v in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    text = "\n".join(lines) + "\n"
    if path is not None:
        Path(path).write_text(text)
    return text
