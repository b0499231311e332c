"""Do the DAPO mechanisms act? One row per mechanism, each read from its own logged metric.

Accuracy says whether a technique helped; these rows say whether it did anything at all,
which is the first thing to check at a new scale (the v1 mini reproduction was a null
because none of them acted). Per run, a metric is summarised over a window of its rollout
steps (``first``/``last``: the first/last quarter, at least one step; ``all``: every
step); the seeds give a 95% percentile-bootstrap CI (:func:`analysis.stats.bootstrap_ci`)
and, for a difference, the exact paired sign-flip p (:func:`analysis.stats.paired_diff`).

Rows (arms found with :func:`analysis.arms.find_pair`, the baseline with ``baseline_arm``):

========================  ==============================================================
off-policy updates        baseline: clipped tokens (``clip_frac_low + clip_frac_high``), %
entropy collapse          baseline: ``train/entropy`` last − first quarter, per run
Clip-Higher binds         the ε_high = 0.2 arm of the Clip-Higher pair: ``clip_frac_high``, %
Clip-Higher → entropy     Clip-Higher pair: last-quarter entropy, on − off (paired)
length spread             baseline: ``response_len_max / response_len_mean`` per step
token-level loss          token-loss pair: last-quarter entropy and length, on − off
overlong: truncation      baseline: ``rollout/truncated_frac``, %
soft punishment           soft-punish pair: last-quarter truncation and length, on − off
dynamic sampling          its pair: gradient steps to the off arm's final accuracy (a run
                          that never gets there: the next evaluation after its end), and
                          generated tokens per rollout step, on / off
========================  ==============================================================
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .arms import baseline_arm, find_pair
from .metric_names import primary_metric
from .runs import SweepInfo
from .stats import bootstrap_ci, paired_diff

__all__ = ["window_means", "steps_to_reach", "next_evaluation", "mechanism_table", "format_mechanisms", "MECHANISMS_NOTE"]

MECHANISMS_NOTE = ("Each row reads the mechanism off its own metric (not accuracy). Per run: mean over the "
                   "first / last quarter of rollout steps, or all of them; [95% percentile-bootstrap CI over "
                   "seeds]; p: exact paired sign-flip test over seeds (differences within a run, or between "
                   "two arms with the same seed). \"acts\": for a difference, its CI excludes 0; for a level, "
                   "it is above the bound its evidence names (else above 0).")


def window_means(tidy: pd.DataFrame, metric: str, arm: str, frac: float = 0.25) -> pd.DataFrame:
    """``[seed, first, last, all]``: per run of ``arm``, the mean of ``metric`` over the first /
    last ``frac`` of its logged rollout steps (at least one step) and over all of them.

    Several runs of one seed are averaged. Rollout step 0 (the evaluation before training)
    is left out, so train/rollout metrics and evaluations use the same steps.
    """
    d = tidy[(tidy["metric"] == metric) & (tidy["arm"] == arm) & (tidy["rollout_step"] > 0)]
    rows = []
    for (run, seed), g in d.groupby(["run", "seed"], sort=False):
        v = g.groupby("rollout_step")["value"].mean().sort_index().to_numpy(dtype=float)  # [steps]
        k = max(1, int(round(frac * len(v))))
        rows.append({"seed": seed, "first": v[:k].mean(), "last": v[-k:].mean(), "all": v.mean()})
    out = pd.DataFrame(rows, columns=["seed", "first", "last", "all"])
    return out.groupby("seed", sort=True).mean().reset_index() if len(out) else out


def steps_to_reach(tidy: pd.DataFrame, metric: str, arm: str, threshold: float) -> pd.Series:
    """{seed: first gradient step after training starts at which ``metric`` ≥ ``threshold``}
    for ``arm`` (NaN: never). The evaluation before training (rollout step 0) does not count,
    as in :func:`window_means`."""
    d = tidy[(tidy["metric"] == metric) & (tidy["arm"] == arm) & (tidy["rollout_step"] > 0)]
    out = {}
    for seed, g in d.sort_values("grad_step").groupby("seed", sort=True):
        hit = g.loc[g["value"] >= threshold, "grad_step"]
        out[seed] = float(hit.iloc[0]) if len(hit) else float("nan")
    return pd.Series(out, dtype=float)


def next_evaluation(tidy: pd.DataFrame, metric: str, arms: tuple[str, ...]) -> float:
    """The gradient step of the evaluation that would follow the last one logged for ``arms``:
    the latest last step over their runs + the median gap between a run's evaluations (a lower
    bound for a run that never reached a threshold by its end)."""
    d = tidy[(tidy["metric"] == metric) & tidy["arm"].isin(arms)]
    ends, gaps = [], []
    for _, g in d.groupby("run", sort=False):
        steps = np.sort(g["grad_step"].unique())  # [evaluations]
        ends.append(float(steps[-1]))
        gaps.extend(np.diff(steps).tolist())
    return max(ends) + (float(np.median(gaps)) if gaps else 0.0) if ends else float("nan")


def _by_seed(w: pd.DataFrame, col: str, scale: float = 1.0) -> pd.Series:
    return pd.Series(w[col].to_numpy(dtype=float) * scale, index=w["seed"].to_numpy()) if len(w) else \
        pd.Series(dtype=float)


def _level(mechanism: str, evidence: str, arms: str, values: pd.Series, fig: str, *, above: float = 0.0) -> dict:
    """A row for one arm's per-seed values: mean [CI]; acts when the mean is above ``above``."""
    mean, lo, hi = bootstrap_ci(values.to_numpy(dtype=float))
    acts = mean > above
    return {"mechanism": mechanism, "evidence": evidence, "arms": arms, "value": mean, "lo": lo, "hi": hi,
            "p": np.nan, "n": int(np.isfinite(values.to_numpy(dtype=float)).sum()), "acts": bool(acts),
            "figure": fig}


def _diff(mechanism: str, evidence: str, arms: str, a: pd.Series, b: pd.Series, fig: str) -> dict:
    """A row for b − a paired by seed (a within-run change when a and b are one arm's windows)."""
    r = paired_diff(a, b)
    return {"mechanism": mechanism, "evidence": evidence, "arms": arms, "value": r.mean, "lo": r.lo, "hi": r.hi,
            "p": r.p, "n": r.n, "acts": bool(r.n >= 2 and (r.lo > 0 or r.hi < 0)), "figure": fig}


def mechanism_table(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None) -> pd.DataFrame:
    """One row per mechanism that the sweep's arms can show (see the module doc).

    Columns: mechanism, evidence, arms, value, lo, hi, p, n, acts, figure. Values in the
    unit the evidence names (% for fractions). Rows whose arms or metrics are missing are left out.
    """
    rows: list[dict] = []
    has = set(tidy["metric"].unique())
    base = baseline_arm(tidy, sweep, configs)
    base = base.name if base is not None else None
    pct = 100.0

    def w(metric: str, arm: str) -> pd.DataFrame:
        return window_means(tidy, metric, arm) if metric in has else pd.DataFrame(columns=["seed"])

    if base is not None:
        lo_, hi_ = w("train/clip_frac_low", base), w("train/clip_frac_high", base)
        if len(lo_) and len(hi_):
            clipped = _by_seed(lo_, "all", pct).add(_by_seed(hi_, "all", pct), fill_value=0.0)
            rows.append(_level("off-policy updates", "clipped tokens, % (clip_frac_low + clip_frac_high)", base,
                               clipped, "fig3"))
        ent = w("train/entropy", base)
        if len(ent):
            rows.append(_diff("entropy collapse", "train/entropy, last − first quarter (nats/token)", base,
                              _by_seed(ent, "first"), _by_seed(ent, "last"), "fig2"))
        mx, mean = w("rollout/response_len_max", base), w("rollout/response_len_mean", base)
        if len(mx) and len(mean):
            ratio = _by_seed(mx, "all") / _by_seed(mean, "all")
            rows.append(_level("length spread", "longest / mean response length in a batch (acts: > 2)", base,
                               ratio, "fig4", above=2.0))
        tr = w("rollout/truncated_frac", base)
        if len(tr):
            rows.append(_level("overlong: truncation", "truncated responses, %", base, _by_seed(tr, "all", pct),
                               "fig5"))

    def pair(toggle: str):
        """(off, on, label of the pair): the label names the other techniques that also differ
        (e.g. GRPO → DAPO in a two-arm sweep), whose effect the row then includes."""
        p = find_pair(toggle, tidy, sweep, configs)
        if p is None:
            return None
        also = f" (also differ: {', '.join(p.other_toggles)})" if p.other_toggles else ""
        return p.off.name, p.on.name, f"{p.off.name} → {p.on.name}{also}"

    if (p := pair("clip_higher")) is not None:
        off, on, pair_label = p
        hi_off = w("train/clip_frac_high", off)
        if len(hi_off):
            rows.append(_level("Clip-Higher binds", "up-clipped tokens at ε_high 0.2, %", off,
                               _by_seed(hi_off, "all", pct), "fig3"))
        e_off, e_on = w("train/entropy", off), w("train/entropy", on)
        if len(e_off) and len(e_on):
            rows.append(_diff("Clip-Higher → entropy", "train/entropy, last quarter, on − off", pair_label,
                              _by_seed(e_off, "last"), _by_seed(e_on, "last"), "fig2"))
    if (p := pair("token_loss")) is not None:
        off, on, pair_label = p
        for metric, what in (("train/entropy", "train/entropy"), ("rollout/response_len_mean", "response length")):
            a, b = w(metric, off), w(metric, on)
            if len(a) and len(b):
                rows.append(_diff("token-level loss", f"{what}, last quarter, on − off", pair_label,
                                  _by_seed(a, "last"), _by_seed(b, "last"), "fig4"))
    if (p := pair("soft_punish")) is not None:
        off, on, pair_label = p
        for metric, what, s in (("rollout/truncated_frac", "truncated responses, %", pct),
                                ("rollout/response_len_mean", "response length", 1.0)):
            a, b = w(metric, off), w(metric, on)
            if len(a) and len(b):
                rows.append(_diff("soft punishment", f"{what}, last quarter, on − off", pair_label,
                                  _by_seed(a, "last", s), _by_seed(b, "last", s), "fig8"))
    metric = primary_metric(tidy)
    if (p := pair("dynamic_sampling")) is not None and metric is not None:
        off, on, pair_label = p
        target = w(metric, off)
        if len(target):
            thr = float(np.nanmean(target["last"]))
            # a run that never gets there counts as the next evaluation after the end: a lower bound,
            # the same for both arms, so the sign-flip test stays exact (the two are exchangeable under H0)
            a, b = steps_to_reach(tidy, metric, off, thr), steps_to_reach(tidy, metric, on, thr)
            never = int(a.isna().sum() + b.isna().sum())
            cap = next_evaluation(tidy, metric, (off, on))
            a, b = a.fillna(cap), b.fillna(cap)
            rows.append(_diff("dynamic sampling", f"gradient steps to {metric} ≥ {thr:.3f} (the off arm's "
                              f"last-quarter mean), on − off" +
                              (f"; {never} runs never reach it and count as {cap:.0f}, the next evaluation"
                               if never else ""), pair_label, a, b, "fig6"))
        ga, gb = w("sampling/gen_tokens", off), w("sampling/gen_tokens", on)
        if len(ga) and len(gb):
            ratio = _by_seed(gb, "all") / _by_seed(ga, "all")
            rows.append(_level("dynamic sampling: cost", "generated tokens per rollout step, on / off (acts: > 1)",
                               pair_label, ratio.dropna(), "fig6", above=1.0))
    cols = ["mechanism", "evidence", "arms", "value", "lo", "hi", "p", "n", "acts", "figure"]
    return pd.DataFrame(rows, columns=cols)


def _num(v: float) -> str:
    if not np.isfinite(v):
        return "–"
    return f"{v:+.3g}" if abs(v) < 1000 else f"{v:+.0f}"


def format_mechanisms(df: pd.DataFrame) -> pd.DataFrame:
    """The table as shown in report.md: value [CI], p, seeds, acts, figure."""
    return pd.DataFrame({
        "mechanism": df["mechanism"], "evidence": df["evidence"], "arm(s)": df["arms"],
        "value [95% CI]": [f"{_num(v)} [{_num(lo)}, {_num(hi)}]" for v, lo, hi in zip(df["value"], df["lo"], df["hi"])],
        "p": ["–" if not np.isfinite(p) else f"{p:.3f}" for p in df["p"]],
        "seeds": df["n"], "acts": ["yes" if a else "no" for a in df["acts"]],
        "figure": [f"[{f}](figures/{f}.png)" for f in df["figure"]],
    })
