"""Does DAPO's gain hold in every setting? Naive GRPO vs DAPO run at several values of another key
(the rollout staleness of ``sweeps/staleness-mini.yaml``): the gain in each setting and, paired by seed,
its change from the first setting (a difference of differences). Exploratory: the sweep's declared
family, not this table, holds its findings (docs/STATISTICS.md).

    gain_table(tidy, sweep)     one row per setting (:func:`analysis.arms.dapo_pairs`), empty below two
    format_gain(df)             as report.md shows it
    gain_figure(g, tidy, sweep) (a) each arm's final value by setting, (b) the gain by setting
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .arms import dapo_pairs
from .metric_names import equivalence_margin, metric_scale, primary_metric
from .runs import SweepInfo
from .stats import effect_verdict, format_p, interval_label, paired_diff, run_finals, t_interval
from .tables import _fmt_diff_ci, _seed_finals

__all__ = ["GAIN_NOTE", "gain_table", "format_gain", "gain_figure"]

GAIN_NOTE = ("**Exploratory** (p unadjusted). Per setting of the keys other than DAPO's techniques (e.g. the "
             "rollout staleness): DAPO − naive GRPO on the sweep's metric (final value per run, paired by seed), "
             "and how that gain differs from the first setting's: per seed (gain here − gain in the first setting), "
             "a difference of differences with its exact sign-flip interval and test. \"differs\" when its p ≤ 0.05, "
             "\"bounded null\" when TOST bounds it inside the metric's margin, else \"inconclusive\".")
"""What the gain table shows (under it in report.md)."""


def gain_table(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None, final_k: int | None = None, *,
               metric: str | None = None) -> pd.DataFrame:
    """DAPO's gain over naive GRPO in each setting (:func:`analysis.arms.dapo_pairs`), when there are two or
    more: one row per setting. Columns: setting, off, on; gain, gain_lo, gain_hi, gain_level,
    gain_method, gain_p (:func:`analysis.stats.paired_diff` of on − off); change, change_lo, change_hi,
    change_level, change_method, change_p, change_p_tost, change_verdict (paired by seed: this setting's
    gain − the first setting's; NaN in the first row); n (seeds in all four arms for a change, in both
    for the first row). In the metric's shown unit (% for accuracies). Empty below two settings."""
    final_k = final_k or sweep.final_k
    metric = metric or sweep.metric or primary_metric(tidy)
    cols = ["setting", "off", "on", "gain", "gain_lo", "gain_hi", "gain_level", "gain_method", "gain_p",
            "change", "change_lo", "change_hi", "change_level", "change_method", "change_p", "change_p_tost",
            "change_verdict", "n"]
    pairs = dapo_pairs(tidy, sweep, configs) if metric else []
    if len(pairs) < 2:
        return pd.DataFrame(columns=cols)
    scale = metric_scale(tidy, metric)
    finals = run_finals(tidy, metric, final_k)
    margin = equivalence_margin(metric, sweep.margins)
    arms = {a.name: _seed_finals(finals, a.name, scale) for off, on, _ in pairs for a in (off, on)}  # {seed: final}
    gains = [(arms[on.name] - arms[off.name]).dropna() for off, on, _ in pairs]
    none = {"change": np.nan, "change_lo": np.nan, "change_hi": np.nan, "change_level": np.nan, "change_method": "",
            "change_p": np.nan, "change_p_tost": np.nan, "change_verdict": ""}
    rows = []
    for i, ((off, on, setting), g) in enumerate(zip(pairs, gains)):
        r = paired_diff(arms[off.name], arms[on.name])
        row = {"setting": setting, "off": off.name, "on": on.name, "gain": r.mean, "gain_lo": r.lo, "gain_hi": r.hi,
               "gain_level": r.level, "gain_method": r.method, "gain_p": r.p, **none, "n": r.n}
        if i:       # this setting's gain − the first setting's, paired by seed
            c = paired_diff(gains[0], g, margin=margin)
            row.update(change=c.mean, change_lo=c.lo, change_hi=c.hi, change_level=c.level, change_method=c.method,
                       change_p=c.p, change_p_tost=c.p_tost,
                       change_verdict=effect_verdict(c.mean, c.p, c.p_tost, predicted=0), n=c.n)
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    out.attrs.update(metric=metric, scale=scale, margin=margin)
    return out


def format_gain(df: pd.DataFrame) -> pd.DataFrame:
    """The gain table as shown in report.md."""
    unit = " (pp)" if df.attrs.get("scale", 1.0) == 100 else ""
    return pd.DataFrame({
        "setting": df["setting"], "GRPO → DAPO": [f"{a} → {b}" for a, b in zip(df["off"], df["on"])],
        f"DAPO − GRPO{unit} [interval]": [_fmt_diff_ci(m, lo, hi, 2, lv, me, with_level=True) for m, lo, hi, lv, me in
                                          zip(df["gain"], df["gain_lo"], df["gain_hi"], df["gain_level"],
                                              df["gain_method"])],
        "p": [format_p(v) for v in df["gain_p"]],
        f"change from the first setting{unit} [interval]": [
            _fmt_diff_ci(m, lo, hi, 2, lv, me, with_level=True) if np.isfinite(m) else "–"
            for m, lo, hi, lv, me in zip(df["change"], df["change_lo"], df["change_hi"], df["change_level"],
                                         df["change_method"])],
        "p (change)": [format_p(v) for v in df["change_p"]],
        "TOST p (change)": [format_p(v) for v in df["change_p_tost"]],
        "seeds": df["n"], "verdict (exploratory)": [v or "–" for v in df["change_verdict"]],
    })


def gain_figure(g: pd.DataFrame, tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None,
                final_k: int | None = None):
    """Of :func:`gain_table`'s ``g`` (for these runs and ``final_k``): (a) naive GRPO's and DAPO's final
    value per setting (mean over seeds, 95% t interval); (b) DAPO − GRPO per setting, paired by seed (its
    exact sign-flip interval, level in the note). None below two settings (an empty ``g``)."""
    if g.empty:
        return None
    import matplotlib

    from .figures import STYLE, _context, _finish, _new_figure
    final_k = final_k or sweep.final_k
    ctx = _context(tidy, sweep, "rollout_step", configs)
    scale = g.attrs["scale"]
    finals = run_finals(tidy, g.attrs["metric"], final_k)
    x = np.arange(len(g))
    fig, axes = _new_figure(ncols=2)
    with matplotlib.rc_context(STYLE):
        for col, label, color in (("off", "naive GRPO", "#4C72B0"), ("on", "DAPO", "#DD8452")):
            ivs = [t_interval(_seed_finals(finals, arm, scale).to_numpy(float)) for arm in g[col]]
            mean = np.array([iv.mean for iv in ivs])
            err = np.array([[iv.mean - iv.lo, iv.hi - iv.mean] for iv in ivs]).T
            axes[0].errorbar(x, mean, yerr=np.nan_to_num(err), marker="o", capsize=3, color=color, label=label)
        err = np.array([g["gain"] - g["gain_lo"], g["gain_hi"] - g["gain"]])
        axes[1].errorbar(x, g["gain"], yerr=np.nan_to_num(err.astype(float)), marker="o", capsize=3,
                         color="#333333", linestyle="none")
        axes[1].axhline(0.0, color="#999999", linewidth=0.8)
    levels = sorted({interval_label(m, lv) for m, lv in zip(g["gain_method"], g["gain_level"])
                     if m and np.isfinite(lv)})
    unit = " (pp)" if scale == 100 else ""
    fig = _finish(ctx, fig, axes, 0, "DAPO's gain by setting",
                  ylabels=[f"final {ctx.metric.split('/')[-1]}{' (%)' if scale == 100 else ''}",
                           f"DAPO − GRPO{unit}"],
                  panel_titles=["(a) each arm", "(b) the gain, paired by seed"],
                  xlabel="setting",
                  note=f"final = mean of each run's last {final_k} evaluations; (a) mean over seeds, 95% t; "
                       f"(b) mean paired difference, {', '.join(levels) or 'no interval (one pair)'}")
    with matplotlib.rc_context(STYLE):     # after _finish, whose integer locator would replace the settings
        for ax in axes:
            ax.set_xticks(x, list(g["setting"]))
            ax.margins(x=0.15)
    fig.suptitle(f"DAPO's gain by setting ({ctx.tag or sweep.name})", x=0.01, ha="left", fontweight="bold")
    return fig
