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
from .runs import SweepInfo
from .stats import bootstrap_ci, run_finals

__all__ = ["table1", "format_table1", "compare_table", "to_markdown", "to_csv", "to_latex"]

TABLE1_COLUMNS = ["arm", "label", "ours", "ci_lo", "ci_hi", "n_seeds", "paper", "diff",
                  "grad_steps", "rollout_steps", "wall_min"]


def table1(tidy: pd.DataFrame, sweep_info: SweepInfo, final_k: int | None = 3, *,
           metric: str | None = None, n_boot: int = 10000, seed: int = 0) -> pd.DataFrame:
    """One row per arm of the sweep (sweep order; arms without runs have n_seeds 0), numeric columns:

    arm, label; ours, ci_lo, ci_hi (% if the metric is an accuracy in [0, 1]); n_seeds;
    paper (the sweep's value, %); diff = ours − paper, only when the metric is the paper's own
    (AIME 2024 avg@32, ``metric_names.is_paper_metric``), else NaN: a number on another task
    is not comparable; grad_steps, rollout_steps (mean over seeds of each run's last step);
    wall_min (mean over seeds of each run's wall-clock minutes, start to last logged point).
    ``df.attrs``: metric, final_k, scale, vs_paper (whether diff is computed).
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
        })
    df = pd.DataFrame(rows, columns=TABLE1_COLUMNS)
    df.attrs.update(metric=metric, final_k=final_k, scale=scale, vs_paper=vs_paper)
    return df


def _fmt(v, digits=1) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{v:.{digits}f}"


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
    })
    out.attrs.update(df.attrs)
    return out


def compare_table(tidy: pd.DataFrame, arm_a: str, arm_b: str, *, final_k: int = 3) -> pd.DataFrame:
    """Every logged metric: final value (mean of each run's last final_k points), mean over seeds,
    for arm_a and arm_b, and ``diff = b − a``. Accuracies in %, other metrics as logged.

    Columns: metric, unit, <arm_a>, <arm_b>, diff, n_a, n_b. Points that are undefined
    (``metric_names.mask_undefined``: no up-clipped token) are left out, not averaged in as 0.
    """
    d = mask_undefined(tidy[tidy["arm"].isin([arm_a, arm_b])])
    d = d.sort_values(["run", "metric", "grad_step"], kind="stable")
    last = d.groupby(["run", "metric"], sort=False).tail(final_k)
    per_run = last.groupby(["arm", "run", "metric"], sort=False)["value"].mean().reset_index()
    agg = per_run.groupby(["metric", "arm"])["value"].agg(["mean", "count"]).unstack("arm")
    rows = []
    for metric in sorted(agg.index):
        s = metric_scale(tidy, metric)
        a = agg.loc[metric].get(("mean", arm_a), np.nan) * s
        b = agg.loc[metric].get(("mean", arm_b), np.nan) * s
        rows.append({"metric": metric, "unit": "%" if s == 100 else "", arm_a: a, arm_b: b, "diff": b - a,
                     "n_a": int(np.nan_to_num(agg.loc[metric].get(("count", arm_a), 0))),
                     "n_b": int(np.nan_to_num(agg.loc[metric].get(("count", arm_b), 0)))})
    return pd.DataFrame(rows, columns=["metric", "unit", arm_a, arm_b, "diff", "n_a", "n_b"])


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
        "−": "$-$", "–": "--"}


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
