"""Table 1 (final accuracy per arm, vs the paper) and arm-vs-arm comparison tables.

"Final" for one run is the mean of its last ``final_k`` evaluations of the primary metric;
an arm's value is the mean of its seeds' finals with a 95% percentile-bootstrap CI over
seeds (stats.bootstrap_ci, seed 0). Accuracies are shown in % (the paper's unit).

Writers (no extra dependencies): :func:`to_markdown`, :func:`to_csv`, :func:`to_latex`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .arms import arms_with_runs
from .metric_names import dataset_name, is_paper_metric, mask_undefined, metric_scale, metric_short, primary_metric
from .runs import ArmInfo, SweepInfo
from .stats import (SEEDS_NEEDED_METHOD, PairedDiff, bootstrap_ci, min_pairs_sign_flip, paired_diff, run_finals,
                    seeds_needed)

__all__ = ["table1", "format_table1", "table1_footnote", "compare_table", "paired_arms", "paired_line",
           "cost_ledger", "format_cost", "COST_NOTE", "to_markdown", "to_csv", "to_latex"]

TABLE1_COLUMNS = ["arm", "label", "ours", "ci_lo", "ci_hi", "n_seeds", "paper", "diff",
                  "grad_steps", "rollout_steps", "wall_min",
                  "d_prev", "d_lo", "d_hi", "p_prev", "n_pairs", "sd_prev", "paper_delta", "seeds_needed", "seeds_needed_t"]
POWER, ALPHA = 0.8, 0.05
"""Power and two-sided level of the seeds-needed column."""


def table1(tidy: pd.DataFrame, sweep_info: SweepInfo, final_k: int | None = 3, *,
           metric: str | None = None, n_boot: int = 10000, seed: int = 0) -> pd.DataFrame:
    """One row per arm of the sweep (sweep order; arms without runs have n_seeds 0), numeric columns:

    arm, label; ours, ci_lo, ci_hi (% if the metric is an accuracy in [0, 1]); n_seeds;
    paper (the sweep's value, %); diff = ours − paper, only when the metric is the paper's own
    (AIME 2024 avg@32, ``metric_names.is_paper_metric``), else NaN: a number on another task
    is not comparable; grad_steps, rollout_steps (mean over seeds of each run's last step);
    wall_min (mean over seeds of each run's wall-clock minutes, start to last logged point).
    Paired vs the previous row (ladders only, see :func:`paired_arms`; NaN on the first row and
    for other sweep kinds): d_prev, d_lo, d_hi (this arm − the previous one over the seeds both
    have, in the table's unit, 95% bootstrap CI over pairs), p_prev (exact sign-flip
    permutation p), n_pairs, sd_prev (SD of the per-seed differences), paper_delta (the
    paper's value of this row − the previous row's) and seeds_needed (paired seeds to detect
    paper_delta at 80% power, α = 0.05, given sd_prev; NaN when undefined).
    ``df.attrs``: metric, final_k, scale, vs_paper (whether diff is computed), kind.
    """
    final_k = final_k or sweep_info.final_k
    metric = metric or sweep_info.metric or primary_metric(tidy)
    vs_paper = is_paper_metric(metric)
    scale = metric_scale(tidy, metric) if metric else 1.0
    finals = run_finals(tidy, metric, final_k) if metric else pd.DataFrame(columns=["arm", "final"])
    per_run = tidy.groupby(["arm", "run"], sort=False).agg(
        grad=("grad_step", "max"), rollout=("rollout_step", "max"), time=("time", "max")).reset_index()
    rows = []
    # every arm of the sweep (one without runs yet shows n_seeds 0), then arms only the runs know
    names = {a.name for a in sweep_info.arms}
    arms = list(sweep_info.arms) + [a for a in arms_with_runs(tidy, sweep_info) if a.name not in names]
    prev = None
    for arm in arms:
        f = finals.loc[finals["arm"] == arm.name, "final"].to_numpy(dtype=float)
        mean, lo, hi = bootstrap_ci(f, n_boot=n_boot, seed=seed)
        pr = per_run[per_run["arm"] == arm.name]
        ours = mean * scale
        paper = float(arm.paper) if arm.paper is not None else np.nan
        rows.append({
            "arm": arm.name, "label": arm.label, "ours": ours, "ci_lo": lo * scale, "ci_hi": hi * scale,
            "n_seeds": int(np.isfinite(f).sum()), "paper": paper,
            "diff": ours - paper if vs_paper else np.nan,
            "grad_steps": float(pr["grad"].mean()),
            "rollout_steps": float(pd.to_numeric(pr["rollout"], errors="coerce").astype(float).mean()),
            "wall_min": float(pr["time"].mean() / 60.0),
            **_paired_cols(finals, prev, arm, scale, n_boot, seed, sweep_info.kind == "ladder"),
        })
        prev = arm
    df = pd.DataFrame(rows, columns=TABLE1_COLUMNS)
    df.attrs.update(metric=metric, final_k=final_k, scale=scale, vs_paper=vs_paper, kind=sweep_info.kind)
    return df


def _seed_finals(finals: pd.DataFrame, arm: str, scale: float = 1.0) -> pd.Series:
    """{seed: final × scale} of one arm (a run_finals frame; several runs of one seed are averaged)."""
    g = finals.loc[finals["arm"] == arm]
    return (g.groupby("seed")["final"].mean() * scale).astype(float)


def paired_arms(finals: pd.DataFrame, off: ArmInfo, on: ArmInfo, scale: float = 1.0, *,
                n_boot: int = 10000, seed: int = 0) -> tuple[PairedDiff, float, int | None, int | None]:
    """``(paired, paper_delta, seeds_needed, seeds_needed_t)`` for arm ``on`` − arm ``off``, finals × scale
    paired by seed.

    paper_delta = on.paper − off.paper (NaN without both); seeds_needed: paired seeds to
    detect paper_delta at 80% power (α = 0.05) given the SD of the per-seed differences
    (:func:`analysis.stats.seeds_needed`), and at least :func:`analysis.stats.min_pairs_sign_flip`
    (6: fewer pairs cannot give p ≤ 0.05 in the exact sign-flip test the table reports);
    seeds_needed_t: the t-test count alone. None when undefined (fewer than 2 pairs, SD 0, no paper values).
    """
    pd_ = paired_diff(_seed_finals(finals, off.name, scale), _seed_finals(finals, on.name, scale),
                      n_boot=n_boot, seed=seed)
    paper_delta = (float(on.paper) - float(off.paper)) if on.paper is not None and off.paper is not None else np.nan
    need = seeds_needed(pd_.sd, paper_delta, POWER, ALPHA)
    return pd_, paper_delta, (max(need, min_pairs_sign_flip(ALPHA)) if need is not None else None), need


def _paired_cols(finals: pd.DataFrame, prev: ArmInfo | None, arm: ArmInfo, scale: float,
                 n_boot: int, seed: int, ladder: bool) -> dict:
    """The paired columns of one Table 1 row (NaN for the first row or outside a ladder)."""
    if prev is None or not ladder or "seed" not in finals:
        return {"d_prev": np.nan, "d_lo": np.nan, "d_hi": np.nan, "p_prev": np.nan, "n_pairs": 0,
                "sd_prev": np.nan, "paper_delta": np.nan, "seeds_needed": np.nan, "seeds_needed_t": np.nan}
    r, paper_delta, need, need_t = paired_arms(finals, prev, arm, scale, n_boot=n_boot, seed=seed)
    return {"d_prev": r.mean, "d_lo": r.lo, "d_hi": r.hi, "p_prev": r.p, "n_pairs": r.n, "sd_prev": r.sd,
            "paper_delta": paper_delta, "seeds_needed": float(need) if need is not None else np.nan,
            "seeds_needed_t": float(need_t) if need_t is not None else np.nan}


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


def _fmt_p(p) -> str:
    """p-values: 3 decimals, "< 0.001" below."""
    if p is None or not np.isfinite(p):
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _fmt_diff_ci(m, lo, hi, n) -> str:
    """"+1.2 [−0.3, +2.5]" (one pair: no interval)."""
    if not np.isfinite(m):
        return "–"
    return _signed(m) + (f" [{_signed(lo)}, {_signed(hi)}]" if n > 1 else "")


def _fmt_need(need, paper_delta) -> str:
    """"4 (for +6)": seeds needed for the paper's Δ; "–" when undefined."""
    if need is None or not np.isfinite(need):
        return "–"
    d = _fmt(paper_delta, 0) if float(paper_delta).is_integer() else _fmt(paper_delta)
    return f"{int(need)} (for {'+' if paper_delta > 0 else ''}{d.replace('-', '−')})"


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
    out = pd.DataFrame({
        "Arm": df["label"],
        f"{head}, ours [95% CI]": [
            f"{_fmt(m)} [{_fmt(lo)}, {_fmt(hi)}]" if n > 1 else _fmt(m)
            for m, lo, hi, n in zip(df["ours"], df["ci_lo"], df["ci_hi"], df["n_seeds"])],
        "seeds": df["n_seeds"].astype(int).astype(str),
        "paper" if vs_paper else PAPER_ALONE:
            [_fmt(v, 0) if np.isfinite(v) and float(v).is_integer() else _fmt(v) for v in df["paper"]],
        **({"ours − paper": [("+" if np.isfinite(v) and v > 0 else "") + _fmt(v) for v in df["diff"]]}
           if vs_paper else {}),
        "grad steps": [_fmt(v, 0) for v in df["grad_steps"]],
        "rollout steps": [_fmt(v, 0) for v in df["rollout_steps"]],
        "wall (min/run)": [_fmt(v) for v in df["wall_min"]],
        f"Δ vs previous arm ({'pp' if df.attrs.get('scale', 1.0) == 100 else 'units'}) [95% CI]": [
            _fmt_diff_ci(m, lo, hi, n) for m, lo, hi, n in zip(df["d_prev"], df["d_lo"], df["d_hi"], df["n_pairs"])],
        "p (paired perm.)": [_fmt_p(v) for v in df["p_prev"]],
        "seeds for paper's Δ (80% power)": [_fmt_need(n, d) for n, d in zip(df["seeds_needed"], df["paper_delta"])],
    })
    out.attrs.update(df.attrs)
    return out


def table1_footnote(df: pd.DataFrame) -> str:
    """The note under Table 1: which test, which CI, which power assumptions (one paragraph)."""
    unit = "percentage points" if df.attrs.get("scale", 1.0) == 100 else "the metric's units"
    if df.attrs.get("kind", "ladder") != "ladder":
        return ("Paired columns (Δ vs previous arm, p, seeds needed) are computed for ladders only; "
                f"this sweep is a {df.attrs.get('kind')}: see compare.md for its pairs.")
    return (f"Δ vs previous arm: this row − the row above, per seed (pairs = seeds both arms ran; a seed "
            f"in one arm only is dropped), mean over pairs in {unit}; [95% CI]: percentile bootstrap over the "
            f"pairs (10,000 resamples, seed 0). p: two-sided exact paired sign-flip permutation test of the "
            f"mean difference (all 2^n sign flips, n ≤ 16; Monte Carlo above), so with n pairs the smallest "
            f"possible p is 2/2^n (n = 3: 0.25). Seeds for paper's Δ: paired seeds needed to detect the "
            f"paper's difference between the same two rows (its Table 1, in points) with 80% power at "
            f"α = 0.05 two-sided, taking the SD of our per-seed differences as the truth: "
            f"{SEEDS_NEEDED_METHOD}; never fewer than {min_pairs_sign_flip(ALPHA)}, the fewest pairs with which the "
            f"exact sign-flip test can reach p ≤ 0.05 at all (2/2^{min_pairs_sign_flip(ALPHA)} = "
            f"{2 / 2 ** min_pairs_sign_flip(ALPHA):.3f}); – when undefined (fewer than 2 pairs, SD 0, no paper value).")


def compare_table(tidy: pd.DataFrame, arm_a: str, arm_b: str, *, final_k: int = 3,
                  n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Every logged metric: final value (mean of each run's last final_k points), mean over seeds,
    for arm_a and arm_b, and ``diff = b − a``. Accuracies in %, other metrics as logged.

    Columns: metric, unit, <arm_a>, <arm_b>, diff, n_a, n_b, then paired by seed
    (:func:`analysis.stats.paired_diff`, seeds both arms have): paired_diff, paired_lo,
    paired_hi (95% bootstrap CI over pairs, ``n_boot`` resamples), p (exact sign-flip
    permutation), n_pairs. Points that are undefined (``metric_names.mask_undefined``: no
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
        r = paired_diff(by_seed.get((metric, arm_a), empty) * s, by_seed.get((metric, arm_b), empty) * s,
                        n_boot=n_boot, seed=seed)
        rows.append({"metric": metric, "unit": "%" if s == 100 else "", arm_a: a, arm_b: b, "diff": b - a,
                     "n_a": int(np.nan_to_num(agg.loc[metric].get(("count", arm_a), 0))),
                     "n_b": int(np.nan_to_num(agg.loc[metric].get(("count", arm_b), 0))),
                     "paired_diff": r.mean, "paired_lo": r.lo, "paired_hi": r.hi, "p": r.p, "n_pairs": r.n})
    return pd.DataFrame(rows, columns=["metric", "unit", arm_a, arm_b, "diff", "n_a", "n_b",
                                       "paired_diff", "paired_lo", "paired_hi", "p", "n_pairs"])


def paired_line(tidy: pd.DataFrame, off: ArmInfo, on: ArmInfo, metric: str, final_k: int = 3, *,
                n_boot: int = 10000, seed: int = 0) -> str:
    """One markdown line: ``on`` − ``off`` on ``metric`` paired over seeds, p, seeds needed for the paper's Δ."""
    scale = metric_scale(tidy, metric)
    unit = " pp" if scale == 100 else ""
    r, paper_delta, need, need_t = paired_arms(run_finals(tidy, metric, final_k), off, on, scale,
                                               n_boot=n_boot, seed=seed)
    if r.n == 0:
        return f"Paired over seeds on `{metric}`: no seed ran in both arms.\n"
    test = f"exact sign-flip permutation, 2^{r.n} = {2 ** r.n} flips" if r.exact else "Monte Carlo sign flips"
    ci = f" [95% CI {_signed(r.lo)}, {_signed(r.hi)}]" if r.n > 1 else ""
    if np.isfinite(paper_delta):
        need_s = (f"{need} (t-test alone: {need_t}; the exact sign-flip test needs ≥ {min_pairs_sign_flip(ALPHA)} "
                  f"pairs to reach p ≤ 0.05)" if need is not None else "– (fewer than 2 pairs or no seed variance)")
        paper = (f"; paper's Δ {_signed(paper_delta, 0 if float(paper_delta).is_integer() else 1)}"
                 f" points: seeds needed at 80% power (α = 0.05): {need_s}")
    else:
        paper = "; no paper values for this pair, so no seeds-needed"
    return (f"**Paired over seeds** on `{metric}` (n = {r.n} pairs, seeds {', '.join(str(x) for x in r.seeds)}): "
            f"Δ = {_signed(r.mean)}{unit}{ci}, p = {_fmt_p(r.p)} ({test}; SD of differences "
            f"{_fmt(r.sd, 2)}{unit}){paper}.\n")


# --------------------------------------------------------------------------- cost ledger
COST_NOTE = ("Per run, mean over seeds. Generated tokens: sum of `sampling/gen_tokens` over the rollout steps "
             "(every sampled response, including groups dynamic sampling discards; evaluation not counted). "
             "Trained tokens: sum over rollout steps of `perf/train_tokens_per_s` × `time/train_s`, which is "
             "exactly the prompt + response tokens of the kept batch × `train.ppo_epochs` that went through "
             "forward and backward. Thread-s: loop seconds (sum of `time/step_s`, which includes each step's "
             "evaluation, + the evaluation before training) × `train.threads`: the run records wall time only, "
             "so this is wall × threads, an upper bound on CPU-seconds (model loading not counted; – when "
             "threads was left to all cores). Gain: final − first evaluation of the metric, in points; "
             "thread-s per point = thread-s / gain, – when the gain is ≤ 0.")
"""What the cost ledger counts, in words (under the table)."""

COST_COLUMNS = ["arm", "label", "n_runs", "gen_tokens", "trained_tokens", "loop_s", "threads", "thread_s",
                "first", "final", "gain", "thread_s_per_point"]


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
    evaluation and the mean of its last final_k, in the table's unit), gain = final − first,
    thread_s_per_point = thread_s / gain (NaN when gain ≤ 0). configs: {run: resolved config}.
    """
    metric = metric or sweep_info.metric or primary_metric(tidy)
    scale = metric_scale(tidy, metric) if metric else 1.0
    runs = tidy[["arm", "run"]].drop_duplicates()
    gen = _run_sum(tidy, "sampling/gen_tokens")
    tr = tidy.loc[tidy["metric"].isin(["perf/train_tokens_per_s", "time/train_s"])]
    tr = tr.pivot_table(index=["run", "grad_step"], columns="metric", values="value", aggfunc="last")
    trained = ((tr["perf/train_tokens_per_s"] * tr["time/train_s"]).round().groupby(level="run").sum()
               if {"perf/train_tokens_per_s", "time/train_s"} <= set(tr.columns) else pd.Series(dtype=float))
    ev = tidy.loc[tidy["metric"] == "time/eval_s"]
    ev0 = ev[ev["rollout_step"].fillna(0) == 0].groupby("run")["value"].sum()
    steps = _run_sum(tidy, "time/step_s")                  # runs without step times: no loop time at all
    loop = steps + ev0.reindex(steps.index).fillna(0.0)
    m = tidy.loc[tidy["metric"] == metric].dropna(subset=["value"]).sort_values(["run", "grad_step"], kind="stable")
    first = m.groupby("run")["value"].first() * scale
    final = m.groupby("run").tail(final_k).groupby("run")["value"].mean() * scale
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
        rows.append({"arm": arm.name, "label": arm.label, "n_runs": int(len(g)), **mean, "gain": gain,
                     "thread_s_per_point": mean["thread_s"] / gain if np.isfinite(gain) and gain > 0 else np.nan})
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
        "thread-s/run (wall × threads)": [_fmt(v, 0) for v in df["thread_s"]],
        f"{metric} first → final{unit}": [f"{_fmt(a)} → {_fmt(b)}" for a, b in zip(df["first"], df["final"])],
        f"gain{unit}": [_signed(v) for v in df["gain"]],
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
