"""Do the DAPO mechanisms act? One row per mechanism, each read from its own logged metric.

Accuracy says whether a technique helped; these rows say whether it did anything at all,
which is the first thing to check at a new scale (the v1 mini reproduction was a null
because none of them acted). Per run, a metric is summarised over a window of its rollout
steps (``first``/``last``: the first/last quarter, at least one step; ``all``: every
step). A level (is there clipping at all?) is tested one-sided against the bound its evidence
declares (one-sided t-test, Student-t interval); a difference (does entropy fall?) with the
exact paired sign-flip test and its interval (:func:`analysis.stats.paired_diff`), its verdict
in the direction the paper or the mechanism predicts (:func:`analysis.stats.effect_verdict`).
A pair that changes other techniques too (GRPO → DAPO) is "not isolated": its number is the
combination's, not the technique's. Every row is exploratory (unadjusted p).

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
dynamic sampling          its pair: gradient steps to a pooled threshold (the mean over
                          both arms' runs of their last-quarter accuracy: the same when
                          the arms swap; a run that never gets there: the next evaluation
                          after the end), and generated tokens per rollout step, on / off
bf16 rollout → mismatch   fp32 vs bf16 engine: ``mismatch/k3`` last quarter, on − off (rises)
rollout correction        none vs a correction: last-quarter entropy and clipped tokens, on − off
                          (no direction predicted: "differs")
staleness → mismatch      each pair that changes only ``train.staleness`` (0 → k): ``mismatch/k3``
                          (π_old vs π_rollout, now holding the lag) last quarter, on − off (rises)
staleness → entropy       the same pairs: last-quarter entropy, on − off (either way)
staleness → steps         the same pairs: gradient steps to a pooled accuracy, as for dynamic
                          sampling (either way: efficiency; the final accuracy is the ceiling)
bypass → clipping         decoupled vs bypass (π_old = π_rollout): clipped tokens, last quarter,
                          on − off (rises: the lag is then inside the clipped ratio)
<successor> binds         its arm: the fraction its own metric counts (:data:`SUCCESSORS`;
                          GSPO's clipped sequences, CISPO's capped weights, Clip-Cov's /
                          KL-Cov's selected tokens), %
<successor> → entropy     its pair (a one-at-a-time sweep: the baseline vs the arm with it
                          alone): last-quarter entropy, on − off; predicted to rise only
                          for Clip-Cov and KL-Cov (built against entropy collapse,
                          arXiv 2505.22617), else tested both ways ("differs")
========================  ==============================================================
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .arms import TOGGLES, baseline_arm, exact_pairs, find_pair, grid_change
from .metric_names import equivalence_margin, metric_scale, primary_metric
from .runs import SweepInfo
from .stats import (bh_q, effect_verdict, format_p, interval_label, level_verdict, paired_diff, t_interval, t_test_p,
                    too_few_seeds)

__all__ = ["window_means", "steps_to_reach", "next_evaluation", "evaluation_gap", "mechanism_table",
           "format_mechanisms", "MECHANISMS_NOTE", "SUCCESSORS"]

# DAPO's successors (analysis.arms.TOGGLES): toggle → (its own metric, what it counts, the "acts" bound in %,
# the predicted sign of its entropy change: +1 rises, 0 none stated, tested both ways)
SUCCESSORS: dict[str, tuple[str | None, str, float, int]] = {
    "dr_grpo": (None, "", 0.0, 0),
    "batch_std": (None, "", 0.0, 0),
    "rloo": (None, "", 0.0, 0),
    "gspo": ("train/seq_clip_frac", "tokens of clipped sequences", 0.01, 0),
    "cispo": ("train/weight_clip_frac", "tokens whose importance weight is capped", 0.01, 0),
    "clip_cov": ("train/cov_selected_frac", "tokens whose gradient is cut", 0.0, 1),
    "kl_cov": ("train/cov_selected_frac", "tokens KL-penalised", 0.0, 1),
    "top_entropy": (None, "", 0.0, 0),
    "group_token_mean": (None, "", 0.0, 0),
    "ds_filter": (None, "", 0.0, 0),
    "ds_mask": (None, "", 0.0, 0),
}

MECHANISMS_NOTE = ("Exploratory (p unadjusted over the rows). Each row reads the mechanism off its own metric "
                   "(not accuracy). Per run: mean over the first / last quarter of rollout steps, or all of them. "
                   "A level: [95% Student-t interval over seeds], p: one-sided t-test that it exceeds the bound its "
                   "evidence declares; \"acts\" when p ≤ 0.05, else \"not shown\" (\"too few seeds\" below 3 seeds for a level, "
                   "below 6 pairs for a difference, where the test cannot decide). A difference (within a run, "
                   "or between two arms with the same seed): [exact sign-flip interval, its level], p: two-sided "
                   "exact sign-flip test; \"acts\" when p ≤ 0.05 in the direction the paper predicts "
                   "(\"predicts\" column), \"opposite\" in the other, \"differs\" where none is predicted "
                   "(\"either way\"), \"bounded null\" when TOST bounds it "
                   "inside the metric's margin, else \"inconclusive\"; \"not isolated\" when the two arms also "
                   "differ in other techniques (the number is then the combination's).")


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


def evaluation_gap(tidy: pd.DataFrame, metric: str, arms: tuple[str, ...]) -> float:
    """The median gradient-step gap between a run's consecutive evaluations of ``metric`` (the
    resolution of a steps-to-reach number); NaN with fewer than two evaluations."""
    d = tidy[(tidy["metric"] == metric) & tidy["arm"].isin(arms)]
    gaps = [g for _, r in d.groupby("run", sort=False) for g in np.diff(np.sort(r["grad_step"].unique())).tolist()]
    return float(np.median(gaps)) if gaps else float("nan")


COLUMNS = ["mechanism", "evidence", "arms", "value", "lo", "hi", "level", "method", "p", "q", "test", "predicts",
           "n", "verdict", "figure"]
"""mechanisms.csv's columns; q: Benjamini–Hochberg over the table's rows (a lead: q ≤ analysis.stats.LEAD_Q)."""


def _level(mechanism: str, evidence: str, arms: str, values: pd.Series, fig: str, *, above: float = 0.0) -> dict:
    """A row for one arm's per-seed values: mean [t interval]; one-sided t-test of mean > ``above``."""
    v = values.to_numpy(dtype=float)
    iv = t_interval(v)
    p = t_test_p(v, above, alternative="greater")
    return {"mechanism": mechanism, "evidence": evidence, "arms": arms, "value": iv.mean, "lo": iv.lo, "hi": iv.hi,
            "level": iv.level, "method": iv.method, "p": p, "test": f"t, one-sided, > {above:g}",
            "predicts": f"> {above:g}", "n": iv.n, "verdict": too_few_seeds(iv.n, "t") or level_verdict(p),
            "figure": fig}


def _diff(mechanism: str, evidence: str, arms: str, a: pd.Series, b: pd.Series, fig: str, *, predicted: int,
          margin: float | None = None, isolated: bool = True) -> dict:
    """A row for b − a paired by seed (a within-run change when a and b are one arm's windows):
    verdict from its two-sided sign-flip p in the ``predicted`` direction (+1 / −1; 0: none, "differs")."""
    r = paired_diff(a, b, margin=margin)
    verdict = ("not isolated" if not isolated else too_few_seeds(r.n)
               or effect_verdict(r.mean, r.p, r.p_tost, predicted=predicted))
    return {"mechanism": mechanism, "evidence": evidence, "arms": arms, "value": r.mean, "lo": r.lo, "hi": r.hi,
            "level": r.level, "method": r.method, "p": r.p, "test": "sign-flip, two-sided",
            "predicts": {1: "rises", -1: "falls", 0: "either way"}[predicted], "n": r.n, "verdict": verdict,
            "figure": fig}


def mechanism_table(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None = None) -> pd.DataFrame:
    """One row per mechanism that the sweep's arms can show (see the module doc).

    Columns: :data:`COLUMNS` (value, lo, hi, level, method: the row's interval; p and its test;
    predicts: the bound or direction; verdict). Values in the unit the evidence names (% for
    fractions). Rows whose arms or metrics are missing are left out.
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
            rows.append(_level("off-policy updates", "clipped tokens, % (clip_frac_low + clip_frac_high; acts: "
                               "> 0.1%)", base, clipped, "fig3", above=0.1))
        ent = w("train/entropy", base)
        if len(ent):
            rows.append(_diff("entropy collapse", "train/entropy, last − first quarter (nats/token)", base,
                              _by_seed(ent, "first"), _by_seed(ent, "last"), "fig2", predicted=-1,
                              margin=equivalence_margin("train/entropy", sweep.margins)))
        mx, mean = w("rollout/response_len_max", base), w("rollout/response_len_mean", base)
        if len(mx) and len(mean):
            ratio = _by_seed(mx, "all") / _by_seed(mean, "all")
            rows.append(_level("length spread", "longest / mean response length in a batch (acts: > 2)", base,
                               ratio, "fig4", above=2.0))
        tr = w("rollout/truncated_frac", base)
        if len(tr):
            rows.append(_level("overlong: truncation", "truncated responses, % (acts: > 1%)", base,
                               _by_seed(tr, "all", pct), "fig5", above=1.0))

    def pair(toggle: str):
        """(off, on, label of the pair, isolated): the label names the other techniques that also differ
        (e.g. GRPO → DAPO in a two-arm sweep); such a pair is not isolated and its rows get no verdict."""
        p = find_pair(toggle, tidy, sweep, configs)
        return None if p is None else described(p)

    def described(p):
        """(off, on, label, isolated) of a found pair."""
        also = f" (also differ: {', '.join(p.other_toggles)})" if p.other_toggles else ""
        arms = grid_change(p.off, p.on) or f"{p.off.name} → {p.on.name}"
        return p.off.name, p.on.name, f"{arms}{also}", not p.other_toggles

    if (p := pair("clip_higher")) is not None:
        off, on, pair_label, iso = p
        hi_off = w("train/clip_frac_high", off)
        if len(hi_off):
            rows.append(_level("Clip-Higher binds", "up-clipped tokens at ε_high 0.2, % (acts: > 0.01%)", off,
                               _by_seed(hi_off, "all", pct), "fig3", above=0.01))
        e_off, e_on = w("train/entropy", off), w("train/entropy", on)
        if len(e_off) and len(e_on):
            rows.append(_diff("Clip-Higher → entropy", "train/entropy, last quarter, on − off", pair_label,
                              _by_seed(e_off, "last"), _by_seed(e_on, "last"), "fig2", predicted=1,
                              margin=equivalence_margin("train/entropy", sweep.margins), isolated=iso))
    if (p := pair("token_loss")) is not None:
        off, on, pair_label, iso = p
        # the paper (Fig. 4): without it, entropy and length grow unhealthily; with it, both stay lower
        for metric, what in (("train/entropy", "train/entropy"), ("rollout/response_len_mean", "response length")):
            a, b = w(metric, off), w(metric, on)
            if len(a) and len(b):
                rows.append(_diff("token-level loss", f"{what}, last quarter, on − off", pair_label,
                                  _by_seed(a, "last"), _by_seed(b, "last"), "fig4", predicted=-1,
                                  margin=equivalence_margin(metric, sweep.margins), isolated=iso))
    if (p := pair("soft_punish")) is not None:
        off, on, pair_label, iso = p
        for metric, what, s in (("rollout/truncated_frac", "truncated responses, %", pct),
                                ("rollout/response_len_mean", "response length", 1.0)):
            a, b = w(metric, off), w(metric, on)
            if len(a) and len(b):
                rows.append(_diff("soft punishment", f"{what}, last quarter, on − off", pair_label,
                                  _by_seed(a, "last", s), _by_seed(b, "last", s), "fig8", predicted=-1,
                                  margin=equivalence_margin(metric, sweep.margins), isolated=iso))
    metric = sweep.metric or primary_metric(tidy)

    def steps_row(name: str, off: str, on: str, pair_label: str, fig: str, *, predicted: int,
                  isolated: bool = True) -> dict | None:
        """Gradient steps until ``metric`` first reaches a threshold pooled over both arms, on − off."""
        t_off, t_on = w(metric, off), w(metric, on)
        if not (len(t_off) and len(t_on)):
            return None
        seeds = sorted(set(t_off["seed"]) & set(t_on["seed"]))
        # pooled over both arms' paired runs: swapping the arms leaves it where it is, so the
        # sign-flip test stays exact (the two arms are exchangeable under H0)
        thr = float(np.nanmean(np.concatenate([t_off.set_index("seed").loc[seeds, "last"].to_numpy(float),
                                               t_on.set_index("seed").loc[seeds, "last"].to_numpy(float)])))
        a, b = steps_to_reach(tidy, metric, off, thr), steps_to_reach(tidy, metric, on, thr)
        never = int(a.reindex(seeds).isna().sum() + b.reindex(seeds).isna().sum())
        cap = next_evaluation(tidy, metric, (off, on))
        gap = evaluation_gap(tidy, metric, (off, on))
        a, b = a.fillna(cap), b.fillna(cap)
        sc = metric_scale(tidy, metric)
        return _diff(name, f"gradient steps to {metric} ≥ {thr * sc:.3g}"
                     f"{'%' if sc == 100 else ''} (pooled: both arms' last-quarter mean), on − off; "
                     f"resolution {gap:.0f} steps (one evaluation)" +
                     (f"; {never} runs never reach it and count as {cap:.0f}, the next evaluation"
                      if never else ""), pair_label, a, b, fig, predicted=predicted, isolated=isolated)

    if (p := pair("dynamic_sampling")) is not None and metric is not None:
        off, on, pair_label, iso = p
        if (row := steps_row("dynamic sampling", off, on, pair_label, "fig6", predicted=-1, isolated=iso)):
            rows.append(row)
        ga, gb = w("sampling/gen_tokens", off), w("sampling/gen_tokens", on)
        if len(ga) and len(gb):
            ratio = _by_seed(gb, "all") / _by_seed(ga, "all")
            rows.append(_level("dynamic sampling: cost", "generated tokens per rollout step, on / off (acts: > 1)",
                               pair_label, ratio.dropna(), "fig6", above=1.0))
    if (p := pair("bf16_rollout")) is not None:   # the behaviour policy (analysis.behaviour has the levels)
        off, on, pair_label, iso = p
        a, b = w("mismatch/k3", off), w("mismatch/k3", on)
        if len(a) and len(b):
            rows.append(_diff("bf16 rollout → mismatch", "mismatch/k3, last quarter, on − off (nats/token)",
                              pair_label, _by_seed(a, "last"), _by_seed(b, "last"), "fig_mismatch", predicted=1,
                              isolated=iso))
    def last(metric: str, arm: str, scale: float = 1.0):
        v = w(metric, arm)
        return _by_seed(v, "last", scale) if len(v) else None

    def clipped(arm: str):   # % of tokens clipped at either end, last quarter
        lo, hi = last("train/clip_frac_low", arm, pct), last("train/clip_frac_high", arm, pct)
        return None if lo is None or hi is None else lo.add(hi, fill_value=0.0)

    if (p := pair("rollout_correction")) is not None:
        off, on, pair_label, iso = p
        for own, what, a, b in (("train/entropy", "train/entropy", last("train/entropy", off),
                                 last("train/entropy", on)),
                                (None, "clipped tokens, %", clipped(off), clipped(on))):
            if a is not None and b is not None:
                rows.append(_diff("rollout correction", f"{what}, last quarter, on − off", pair_label, a, b,
                                  "fig_mismatch", predicted=0, margin=equivalence_margin(own, sweep.margins),
                                  isolated=iso))
    # off-policyness: every pair that changes only the staleness (k = 0 → 1, 0 → 2, for each algorithm)
    for sp in (q for q in exact_pairs(tidy, sweep, configs) if q.toggle == "staleness"):
        pair_label = described(sp)[2]     # an exact pair: isolated, nothing else differs
        for name, own, what, predicted in (
                ("staleness → mismatch", "mismatch/k3", "mismatch/k3 (π_old vs π_rollout), last quarter, on − off "
                                                        "(nats/token)", 1),
                ("staleness → entropy", "train/entropy", "train/entropy, last quarter, on − off", 0)):
            a, b = last(own, sp.off.name), last(own, sp.on.name)
            if a is not None and b is not None:
                rows.append(_diff(name, what, pair_label, a, b, "fig_mismatch" if own.startswith("mismatch")
                                  else "fig2", predicted=predicted, margin=equivalence_margin(own, sweep.margins)))
        # efficiency vs ceiling (ScaleRL, arXiv 2510.13786: the off-policy algorithm moves the first, not
        # the second): steps to a pooled accuracy here, the final accuracy in the family / compare.md
        if metric is not None and (row := steps_row("staleness → steps to reach", sp.off.name, sp.on.name,
                                                    pair_label, "fig1", predicted=0)):
            rows.append(row)
    if (p := pair("bypass")) is not None:
        off, on, pair_label, iso = p
        a, b = clipped(off), clipped(on)
        if a is not None and b is not None:   # π_old := π_rollout: the lag is in the clipped ratio itself
            rows.append(_diff("bypass → clipping", "clipped tokens, %, last quarter, on − off", pair_label, a, b,
                              "fig3", predicted=1, isolated=iso))
    for toggle, (own, what, above, predicted) in SUCCESSORS.items():
        if (p := pair(toggle)) is None:
            continue
        off, on, pair_label, iso = p
        title = TOGGLES[toggle].title
        got = w(own, on) if own else pd.DataFrame()
        if len(got):
            rows.append(_level(f"{title} binds", f"{what}, % ({own.split('/')[-1]}; acts: > {above:g}%)", on,
                               _by_seed(got, "all", pct), "fig3", above=above))
        e_off, e_on = w("train/entropy", off), w("train/entropy", on)
        if len(e_off) and len(e_on):
            rows.append(_diff(f"{title} → entropy", "train/entropy, last quarter, on − off", pair_label,
                              _by_seed(e_off, "last"), _by_seed(e_on, "last"), "fig2", predicted=predicted,
                              margin=equivalence_margin("train/entropy", sweep.margins), isolated=iso))
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "q"])
    df["q"] = bh_q(df["p"]) if len(df) else []
    return df[COLUMNS]


def _num(v: float) -> str:
    if not np.isfinite(v):
        return "–"
    return f"{v:+.3g}" if abs(v) < 1000 else f"{v:+.0f}"


def format_mechanisms(df: pd.DataFrame) -> pd.DataFrame:
    """The table as shown in report.md: value [interval, level], p and its test, seeds, verdict, figure."""
    return pd.DataFrame({
        "mechanism": df["mechanism"], "evidence": df["evidence"], "arm(s)": df["arms"],
        "value [interval]": [f"{_num(v)} [{_num(lo)}, {_num(hi)}] {interval_label(m, lv)}"
                             if np.isfinite(lo) else _num(v)
                             for v, lo, hi, lv, m in zip(df["value"], df["lo"], df["hi"], df["level"], df["method"])],
        "predicts": df["predicts"],
        "p (test)": ["–" if not np.isfinite(p) else f"{format_p(p)} ({t})" for p, t in zip(df["p"], df["test"])],
        "q (BH)": [format_p(q) for q in (df["q"] if "q" in df else [np.nan] * len(df))],
        "seeds": df["n"], "verdict (exploratory)": df["verdict"],
        "figure": [f"[{f}](figures/{f}.png)" for f in df["figure"]],
    })
