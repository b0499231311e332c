"""The behaviour policy in a sweep's runs: how far the rollout engine's sampling distribution is from
the trainer's π_old (``mismatch/*``, dapo/algo/corrections.py; docs/METRICS.md), whether the gap grows
over training, and how it depends on the response length.

Per run, ``mismatch/k3`` (mean ρ − log ρ − 1 over the response tokens, ρ = π_old/π_rollout) is
summarised over the first and the last quarter of its rollout steps (:func:`analysis.mechanisms.window_means`).
Per arm: those levels over seeds (mean, 95% Student-t interval), and "grows", the within-run change
last − first quarter tested with the exact sign-flip test (two-sided; predicted to rise: the
literature reports the gap widening as training sharpens the policy). Every row is exploratory.
The figure: k3 over rollout steps per arm (mean over seeds, its band), and k3 per response-length
bucket (``mismatch/k3_len_*``, each run's mean over its steps, then the mean over seeds).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .runs import ArmInfo, SweepInfo, arm_order
from .stats import effect_verdict, format_p, interval_label, paired_diff, t_interval

__all__ = ["MISMATCH", "LENGTH_BUCKETS", "mismatch_table", "format_mismatch", "mismatch_figure",
           "behaviour_section", "BEHAVIOUR_NOTE"]

MISMATCH = "mismatch/k3"
LENGTH_BUCKETS = ("le16", "le64", "le256", "le1024", "le4096", "gt4096")   # dapo.algo.corrections.LENGTH_BUCKETS
_BUCKET_LABEL = {"le16": "≤ 16", "le64": "17–64", "le256": "65–256", "le1024": "257–1024",
                 "le4096": "1025–4096", "gt4096": "> 4096"}

BEHAVIOUR_NOTE = ("Exploratory. k3 = mean(ρ − log ρ − 1) over the response tokens, ρ = π_old / π_rollout "
                  "(nats/token; 0 when the engine samples from exactly the trainer's distribution). Per run: the "
                  "mean over the first / last quarter of its rollout steps; per arm: the mean over seeds "
                  "[95% Student-t interval]. Grows: last − first quarter within each run, [exact sign-flip "
                  "interval, its level], p: two-sided exact sign-flip test; \"grows\" when p ≤ 0.05 and it "
                  "rose, \"shrinks\" when p ≤ 0.05 and it fell, else \"inconclusive\".")


def _arms(tidy: pd.DataFrame, sweep: SweepInfo) -> list[str]:
    """The arms that logged ``mismatch/k3``: the sweep's order, then any others as first logged."""
    present = set(tidy.loc[tidy["metric"] == MISMATCH, "arm"])
    order = list(dict.fromkeys([a.name for a in sweep.arms] + arm_order(tidy)))
    return [a for a in order if a in present]


def mismatch_table(tidy: pd.DataFrame, sweep: SweepInfo) -> pd.DataFrame:
    """One row per arm that logged ``mismatch/k3``: its first- and last-quarter level over seeds and
    the within-run change; ``abs_diff_mean`` (mean |Δ log p|, whole run) beside it. Empty without it."""
    from .mechanisms import window_means
    cols = ["arm", "n", "first", "first_lo", "first_hi", "last", "last_lo", "last_hi", "level", "method",
            "grows", "grows_lo", "grows_hi", "grows_level", "grows_method", "p", "verdict", "abs_diff_mean"]
    rows = []
    for arm in _arms(tidy, sweep):
        w = window_means(tidy, MISMATCH, arm).set_index("seed")
        first, last = t_interval(w["first"].to_numpy(float)), t_interval(w["last"].to_numpy(float))
        d = paired_diff(w["first"], w["last"])
        ad = window_means(tidy, "mismatch/abs_diff_mean", arm) if (
            tidy["metric"] == "mismatch/abs_diff_mean").any() else pd.DataFrame({"all": []})
        rows.append({"arm": arm, "n": len(w), "first": first.mean, "first_lo": first.lo, "first_hi": first.hi,
                     "last": last.mean, "last_lo": last.lo, "last_hi": last.hi, "level": last.level,
                     "method": last.method, "grows": d.mean, "grows_lo": d.lo, "grows_hi": d.hi,
                     "grows_level": d.level, "grows_method": d.method, "p": d.p,
                     "verdict": effect_verdict(d.mean, d.p, predicted=1, yes="grows", no="shrinks"),
                     "abs_diff_mean": float(ad["all"].mean()) if len(ad) else float("nan")})
    return pd.DataFrame(rows, columns=cols)


def _g(v: float) -> str:
    return "–" if not np.isfinite(v) else f"{v:.3g}"


def format_mismatch(df: pd.DataFrame, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """The table as shown in report.md."""
    labels = labels or {}

    def iv(m, lo, hi, level, method):
        return f"{_g(m)} [{_g(lo)}, {_g(hi)}] {interval_label(method, level)}" if np.isfinite(lo) else _g(m)
    return pd.DataFrame({
        "arm": [labels.get(a, a) for a in df["arm"]], "seeds": df["n"],
        "k3, first quarter": [iv(*r) for r in zip(df["first"], df["first_lo"], df["first_hi"], df["level"],
                                                  df["method"])],
        "k3, last quarter": [iv(*r) for r in zip(df["last"], df["last_lo"], df["last_hi"], df["level"],
                                                 df["method"])],
        "grows (last − first)": [iv(*r) for r in zip(df["grows"], df["grows_lo"], df["grows_hi"],
                                                     df["grows_level"], df["grows_method"])],
        "p (sign-flip)": [format_p(p) for p in df["p"]],
        "verdict (exploratory)": df["verdict"],
        "mean \\|Δ log p\\|": [_g(v) for v in df["abs_diff_mean"]],
    })


def bucket_means(tidy: pd.DataFrame, sweep: SweepInfo) -> pd.DataFrame:
    """``[arm, bucket, k3, n]``: per arm and response-length bucket, the mean over seeds of each run's
    mean ``mismatch/k3_len_<bucket>`` over its steps (n: the runs that had such responses)."""
    rows = []
    for arm in _arms(tidy, sweep):
        t = tidy[tidy["arm"] == arm]
        for b in LENGTH_BUCKETS:
            per_run = t[t["metric"] == f"mismatch/k3_len_{b}"].groupby("seed")["value"].mean()
            if len(per_run):
                rows.append({"arm": arm, "bucket": b, "k3": float(per_run.mean()), "n": int(len(per_run))})
    return pd.DataFrame(rows, columns=["arm", "bucket", "k3", "n"])


def mismatch_figure(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None):
    """(a) k3 over rollout steps, per arm; (b) k3 by response length. None without ``mismatch/k3``."""
    if not _arms(tidy, sweep):
        return None
    import matplotlib

    from .figures import STYLE, _context, _draw, _finish, _new_figure
    ctx = _context(tidy, sweep, "rollout_step", configs)
    fig, axes = _new_figure(ncols=2)
    known = {a.name: a for a in sweep.arms}
    arms = [known.get(a) or ArmInfo(a) for a in _arms(tidy, sweep)]
    for arm in arms:
        _draw(ctx, axes[0], MISMATCH, arm)
    buckets = bucket_means(tidy, sweep)
    present = [b for b in LENGTH_BUCKETS if b in set(buckets["bucket"])]
    width = 0.8 / max(len(arms), 1)
    with matplotlib.rc_context(STYLE):   # linear axes: a t band may reach below 0, and bars start at 0
        for i, arm in enumerate(arms):
            sub = buckets[buckets["arm"] == arm.name].set_index("bucket").reindex(present)
            axes[1].bar(np.arange(len(present)) + (i - (len(arms) - 1) / 2) * width, sub["k3"].to_numpy(float),
                        width=width, color=ctx.colors.get(arm.name, "#333333"), label=arm.label)
        for ax in axes:
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig = _finish(ctx, fig, axes, 0, "rollout–trainer mismatch", ylabels=["k3 (nats/token)", "k3 (nats/token)"],
                  panel_titles=["(a) over training", "(b) by response length (tokens)"],
                  note="k3 = mean(ρ − log ρ − 1), ρ = π_old / π_rollout; (b) each run's mean over its steps, "
                       "then the mean over seeds; (a) bands: 95% t over seeds", legend_all=True)
    with matplotlib.rc_context(STYLE):   # after _finish, whose integer locator would replace the buckets
        axes[1].set_xticks(np.arange(len(present)), [_BUCKET_LABEL[b] for b in present])
        axes[1].set_xlabel("response length (tokens)")
    fig.suptitle(f"Behaviour policy ({ctx.tag or sweep.name}): rollout–trainer mismatch", x=0.01, ha="left",
                 fontweight="bold")
    return fig


def behaviour_section(table: pd.DataFrame, labels: dict[str, str], has_figure: bool) -> list[str]:
    """The report's "The behaviour policy" section; nothing when no run logged ``mismatch/k3``."""
    if not len(table):
        return []
    from .tables import to_markdown
    return ["## The behaviour policy", "", to_markdown(format_mismatch(table, labels)), "",
            BEHAVIOUR_NOTE + " Numbers: [mismatch.csv](mismatch.csv).", "",
            *(["![mismatch](figures/fig_mismatch.png)", ""] if has_figure else [])]
