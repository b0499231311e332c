"""Compute curves: does a technique raise the ceiling, or only get there sooner? (ScaleRL's framing.)

Each run's held-out accuracy is fitted against a declared compute axis C with the saturating curve

    R(C) = R₀ + (A − R₀) / (1 + (C_mid / C)^B)

(ScaleRL, "The Art of Scaling Reinforcement Learning Compute for LLMs", 2025): R₀ the value at C = 0
(fixed at the run's own step-0 evaluation), A the asymptote (the ceiling), C_mid the compute at which
half of the rise A − R₀ is reached and B the steepness (the efficiency). Per run:

- :func:`compute_points`: the run's evaluations on one of :data:`AXES` (generated tokens, trained
  tokens, training thread-seconds, gradient steps), cumulated from the logged per-step metrics up to
  the rollout step of each evaluation.
- :func:`fit_curve`: bounded nonlinear least squares (``scipy.optimize.least_squares``, trust-region
  reflective) of (A, B, log C_mid) from :data:`N_STARTS` starting points, the lowest cost kept. The fit
  is refused ("too few points") below :data:`MIN_POINTS` evaluations after step 0, and it is called
  "not saturated" when less than :data:`SATURATION` of the fitted rise is reached by the run's last
  compute (or C_mid sits on its upper bound): A is then an extrapolation the data do not carry. A fit
  that moves less than :data:`FLAT_RISE` (the metric's shown unit) over the run is "flat" (no curve to bend).
- :func:`extrapolation_table`: fit on each run's first half of compute, predict the second half;
  the error per arm says whether early stopping plus extrapolation could be trusted on this task.
- :func:`compare_curves`: per pair of arms (the primary family's pairs), A and log₁₀ C_mid paired by
  seed with :func:`analysis.stats.paired_diff` (exact sign-flip interval and test, TOST against a
  margin), exploratory (unadjusted p). Verdicts by :func:`analysis.stats.effect_verdict`: "raises the
  ceiling" / "lowers the ceiling" / "bounded null" / "inconclusive" on A; "reaches it sooner" /
  "reaches it later" / "bounded null" / "inconclusive" on C_mid; and "not decidable: curves not
  saturated" when a paired seed's run is not saturated (dropping it would select seeds by outcome).
- :func:`curves_section` writes ``curves.csv``, ``curve_compare.csv``, ``curve_extrapolation.csv`` and
  ``figures/fig_curves.png`` and returns the report's markdown section.

docs/STATISTICS.md ("Compute curves") states the rules and their reasons.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .arms import arms_with_runs
from .metric_names import equivalence_margin, metric_scale, metric_short, primary_metric
from .runs import SweepInfo
from .stats import ALPHA, bh_q, effect_verdict, format_p, interval_label, paired_diff

__all__ = ["AXES", "saturating", "compute_points", "CurveFit", "fit_curve", "fit_runs", "extrapolation_table",
           "compare_curves", "curve_figure", "curves_section", "CURVES_NOTE", "SATURATION", "MIN_POINTS",
           "EFFICIENCY_MARGIN", "FLAT_RISE"]

AXES = {
    "gen_tokens": "generated tokens",
    "trained_tokens": "trained tokens",
    "thread_s": "training thread-seconds",
    "grad_step": "gradient steps",
}
"""The compute axes a curve can be fitted against (key → what it counts). gen_tokens: Σ
``sampling/gen_tokens`` (every sampled response, discarded groups included); trained_tokens: Σ
``perf/train_tokens_per_s`` × ``time/train_s``; thread_s: Σ (``time/step_s`` − ``time/eval_s``) ×
``train.threads`` (the loop's time without its evaluations); grad_step: the evaluation's gradient step.
Each summed over the rollout steps up to and including the evaluation's."""

SATURATION = 0.8
"""A fit is "saturated" when at least this share of its rise A − R₀ is reached at the run's last compute."""
MIN_POINTS = 3
"""Evaluations after step 0 a fit needs: as many as its free parameters (A, B, C_mid)."""
B_BOUNDS = (0.2, 10.0)
"""Bounds of the steepness B."""
CMID_SPAN = (0.1, 100.0)
"""C_mid is bounded to [0.1 × the smallest positive compute, 100 × the largest]."""
N_STARTS = 16
"""Starting points of each fit: C_mid at 4 log-spaced points of the data's range × B in {0.7, 3} × A in
{the last value, the value farthest from R₀}."""
EFFICIENCY_MARGIN = math.log10(1.25)
"""TOST margin of the paired difference of log₁₀ C_mid: reaching half the rise within a factor 1.25 of compute."""
FLAT_RISE = 1.0
"""In the metric's shown unit (points for accuracies): a fit that moves less than this over the run's compute,
|A − R₀| × the share of the rise reached, is "flat"."""


# --------------------------------------------------------------------------- the curve
def saturating(C, R0: float, A: float, B: float, C_mid: float) -> np.ndarray:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), elementwise; C: [n] ≥ 0 (R(0) = R0).

    Units: R0 and A in the metric's unit, C and C_mid in the axis' unit, B dimensionless (B > 0, C_mid > 0).
    At C = C_mid the curve is halfway: R0 + (A − R0)/2."""
    C = np.asarray(C, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        frac = np.where(C > 0, 1.0 / (1.0 + np.power(C_mid / np.where(C > 0, C, 1.0), B)), 0.0)
    return R0 + (A - R0) * frac


def _cumulative(tidy: pd.DataFrame, metric: str) -> pd.DataFrame:
    """[run, rollout_step, cum]: per run, Σ metric over its rollout steps ≤ each logged one."""
    d = tidy.loc[tidy["metric"] == metric, ["run", "rollout_step", "value"]].dropna()
    d = d.groupby(["run", "rollout_step"], sort=True)["value"].sum().reset_index()
    d["cum"] = d.groupby("run", sort=False)["value"].cumsum()
    return d[["run", "rollout_step", "cum"]]


def _per_step(tidy: pd.DataFrame, axis: str, configs: dict | None) -> pd.DataFrame:
    """[run, rollout_step, value]: the compute each rollout step adds on ``axis`` (not grad_step)."""
    if axis == "gen_tokens":
        d = tidy.loc[tidy["metric"] == "sampling/gen_tokens", ["run", "rollout_step", "grad_step", "value"]]
        return d.dropna(subset=["rollout_step", "value"])
    wide = tidy.loc[tidy["metric"].isin(["perf/train_tokens_per_s", "time/train_s", "time/step_s", "time/eval_s"])]
    wide = wide.dropna(subset=["rollout_step"]).pivot_table(index=["run", "rollout_step"], columns="metric",
                                                             values="value", aggfunc="last")
    if axis == "trained_tokens":
        need = {"perf/train_tokens_per_s", "time/train_s"}
        v = (wide["perf/train_tokens_per_s"] * wide["time/train_s"]).round() if need <= set(wide.columns) else None
    else:  # thread_s
        if "time/step_s" not in wide.columns:
            v = None
        else:
            ev = wide["time/eval_s"].fillna(0.0) if "time/eval_s" in wide.columns else 0.0
            threads = pd.Series({r: _threads(configs, r) for r in wide.index.get_level_values("run").unique()})
            v = (wide["time/step_s"] - ev) * wide.index.get_level_values("run").map(threads).to_numpy(dtype=float)
    if v is None:
        return pd.DataFrame(columns=["run", "rollout_step", "value"])
    return v.rename("value").reset_index().dropna(subset=["value"])


def _threads(configs: dict | None, run: str) -> float:
    t = ((configs or {}).get(run) or {}).get("train", {}).get("threads")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 1 else np.nan


def compute_points(tidy: pd.DataFrame, metric: str, axis: str = "gen_tokens",
                   configs: dict | None = None) -> pd.DataFrame:
    """``[arm, run, seed, rollout_step, grad_step, compute, value]``: each evaluation of ``metric`` (value as
    logged, e.g. a fraction) with the compute spent before it on ``axis`` (:data:`AXES`).

    Compute at an evaluation of rollout step r = Σ over the run's rollout steps s ≤ r of what step s
    logged (0 at step 0, where the evaluation precedes any training); grad_step: the evaluation's own
    gradient step. Rows whose compute is unknown (the run did not log the axis' metric) are dropped.
    """
    if axis not in AXES:
        raise ValueError(f"axis = {axis!r}: expected one of {', '.join(AXES)}")
    ev = tidy.loc[tidy["metric"] == metric, ["arm", "run", "seed", "rollout_step", "grad_step", "value"]]
    ev = ev.dropna(subset=["value"])
    ev = ev.groupby(["arm", "run", "seed", "rollout_step"], sort=False, observed=True).agg(
        grad_step=("grad_step", "max"), value=("value", "mean")).reset_index()
    cols = ["arm", "run", "seed", "rollout_step", "grad_step", "compute", "value"]
    if ev.empty:
        return pd.DataFrame(columns=cols)
    if axis == "grad_step":
        ev["compute"] = ev["grad_step"].astype(float)
        return ev[cols].sort_values(["arm", "seed", "rollout_step"], kind="stable").reset_index(drop=True)
    step = _per_step(tidy, axis, configs)
    out = []
    for run, g in ev.groupby("run", sort=False):
        s = step[step["run"] == run].groupby("rollout_step")["value"].sum().sort_index()
        if s.empty:
            continue
        cum = s.cumsum()
        r = g["rollout_step"].to_numpy(dtype=float)
        i = np.searchsorted(cum.index.to_numpy(dtype=float), r, side="right") - 1
        c = np.where(i >= 0, cum.to_numpy(dtype=float)[np.clip(i, 0, None)], 0.0)
        out.append(g.assign(compute=np.where(r == 0, 0.0, c)))
    if not out:
        return pd.DataFrame(columns=cols)
    res = pd.concat(out, ignore_index=True)[cols]
    return res.sort_values(["arm", "seed", "rollout_step"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- one fit
@dataclass(frozen=True)
class CurveFit:
    """One run's saturating fit (values in the metric's logged unit, compute in the axis' unit)."""
    status: str                 # "saturated" | "not saturated" | "flat" | "too few points" | "failed"
    reason: str                 # why not "saturated", in words ("" when saturated)
    R0: float = float("nan")
    A: float = float("nan")
    B: float = float("nan")
    C_mid: float = float("nan")
    n_points: int = 0           # evaluations after step 0 used
    c_max: float = float("nan")  # the largest compute fitted
    frac_end: float = float("nan")   # share of the rise reached at c_max: 1/(1 + (C_mid/c_max)^B)
    rmse: float = float("nan")       # root mean square residual over the fitted points after step 0

    @property
    def ok(self) -> bool:
        """A converged fit (saturated or not): it can predict; only a saturated one has a ceiling."""
        return self.status in ("saturated", "not saturated", "flat")


FIT_DIGITS = 8
"""Significant digits kept of a fitted parameter (and its rmse): the optimizer stops at a tolerance far above
1e-8, and beyond these digits two CPUs' floating-point kernels give different fits of the same points, so a
committed curve table would not regenerate byte for byte on another machine."""


def _significant(x: float, digits: int = FIT_DIGITS) -> float:
    """x rounded to ``digits`` significant digits (0, ±inf and NaN unchanged)."""
    return float(f"{x:.{digits - 1}e}") if math.isfinite(x) and x != 0 else x


def fit_curve(C, R, *, R0: float | None = None, a_bounds: tuple[float, float] = (0.0, 1.0),
              flat_rise: float = 0.01, saturation: float = SATURATION, scale: float = 1.0) -> CurveFit:
    """Fit :func:`saturating` to points (C, R): C, R: [n] (C ≥ 0; NaNs dropped).

    R0: the value at C = 0, fixed (default: the mean of the points at C = 0; without one the fit is
    refused). Free: A ∈ a_bounds, B ∈ :data:`B_BOUNDS`, log C_mid ∈ log of :data:`CMID_SPAN` × the data's
    positive compute range. ``scipy.optimize.least_squares`` (method "trf", bounded) from
    :data:`N_STARTS` starts; the lowest cost wins. Status: "too few points" below :data:`MIN_POINTS`
    points with C > 0; "failed" when no start converges; "flat" when the fitted curve moves less than
    flat_rise within the data, |A − R0| · frac_end < flat_rise (same unit
    as R; ``scale`` only says it in the shown unit); "not saturated" when the share of the rise reached at the largest C is below ``saturation``
    or C_mid is within 1% (in log) of its upper bound; else "saturated". A, B, log C_mid and the rmse are
    kept to :data:`FIT_DIGITS` significant digits.
    """
    from scipy.optimize import least_squares
    from scipy.special import expit

    C = np.asarray(C, dtype=float)
    R = np.asarray(R, dtype=float)
    keep = np.isfinite(C) & np.isfinite(R)
    C, R = C[keep], R[keep]
    if R0 is None:
        at0 = R[C == 0]
        R0 = float(at0.mean()) if at0.size else float("nan")
    pos = C > 0
    Cp, Rp = C[pos], R[pos]
    n = int(Cp.size)
    if not np.isfinite(R0):
        return CurveFit("too few points", "no evaluation at compute 0 to fix R₀", n_points=n)
    if n < MIN_POINTS:
        return CurveFit("too few points", f"{n} evaluation(s) after step 0, {MIN_POINTS} needed", R0=R0, n_points=n,
                        c_max=float(Cp.max()) if n else float("nan"))
    c_lo, c_hi = float(Cp.min()), float(Cp.max())
    lo = np.array([a_bounds[0], B_BOUNDS[0], math.log(c_lo * CMID_SPAN[0])])
    hi = np.array([a_bounds[1], B_BOUNDS[1], math.log(c_hi * CMID_SPAN[1])])

    lnC = np.log(Cp)

    def resid(theta):                       # R(C) − R: [n]; frac = expit(B·(ln C − ln C_mid)), overflow-free
        A, B, lc = theta
        return R0 + (A - R0) * expit(B * (lnC - lc)) - Rp

    def jac(theta):                         # [n, 3]: ∂/∂A = frac; ∂/∂B, ∂/∂ln C_mid from frac' = frac(1 − frac)
        A, B, lc = theta
        f = expit(B * (lnC - lc))
        g = (A - R0) * f * (1 - f)
        return np.column_stack([f, g * (lnC - lc), -g * B])

    last, extreme = float(Rp[np.argmax(Cp)]), float(Rp[np.argmax(np.abs(Rp - R0))])
    starts = [(a, b, lc) for lc in np.linspace(math.log(c_lo), math.log(c_hi), 4)
              for b in (0.7, 3.0) for a in (last, extreme)]
    best = None
    for s in starts:
        x0 = np.clip(np.array(s, dtype=float), lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                r = least_squares(resid, x0, jac=jac, bounds=(lo, hi), method="trf", max_nfev=300)
            except (ValueError, FloatingPointError):
                continue
        if r.status > 0 and np.isfinite(r.cost) and (best is None or r.cost < best.cost - 1e-15):
            best = r
    if best is None:
        return CurveFit("failed", "no start converged", R0=R0, n_points=n, c_max=c_hi)
    A, B, lc = (_significant(float(v)) for v in best.x)   # an optimum is not defined finer than this, and the
    C_mid = math.exp(lc)                                      # last digits differ between CPUs' float kernels
    frac = float(1.0 / (1.0 + (C_mid / c_hi) ** B))
    rmse = _significant(float(np.sqrt(np.mean(resid((A, B, lc)) ** 2))))
    base = dict(R0=float(R0), A=A, B=B, C_mid=C_mid, n_points=n, c_max=c_hi, frac_end=frac, rmse=rmse)
    moved = abs(A - R0) * frac                   # what the fitted curve moves within the data
    if moved < flat_rise:
        return CurveFit("flat", f"the fit moves {moved * scale:.2g} over the run, below {flat_rise * scale:g}", **base)
    at_top = lc >= hi[2] - 0.01 * abs(hi[2] - lo[2])
    if frac < saturation or at_top:
        return CurveFit("not saturated", f"{100 * frac:.0f}% of the fitted rise reached by the last evaluation "
                        f"(needs {100 * saturation:.0f}%)" + ("; C_mid at its upper bound" if at_top else ""), **base)
    return CurveFit("saturated", "", **base)


def _a_bounds(scale: float, values: np.ndarray) -> tuple[float, float]:
    """A's bounds: [0, 1] for a fraction (shown in %), else the data's range widened by twice its span."""
    if scale == 100:
        return 0.0, 1.0
    v = values[np.isfinite(values)]
    span = float(np.ptp(v)) if v.size else 1.0
    return float(v.min() - 2 * span - 1e-9), float(v.max() + 2 * span + 1e-9)


FIT_COLUMNS = ["arm", "run", "seed", "axis", "status", "reason", "R0", "A", "B", "C_mid", "log10_C_mid", "n_points",
               "c_max", "frac_end", "rmse"]


def fit_runs(points: pd.DataFrame, axis: str, scale: float = 100.0, *, max_compute: dict | None = None,
             saturation: float = SATURATION) -> pd.DataFrame:
    """One :func:`fit_curve` per run of ``points`` (:func:`compute_points`): :data:`FIT_COLUMNS`, R0 and A
    in the shown unit (× scale), C_mid in the axis' unit. ``max_compute``: {run: C} fits only the points
    with compute ≤ C (the extrapolation check's first half)."""
    rows = []
    bounds = _a_bounds(scale, points["value"].to_numpy(dtype=float)) if len(points) else (0.0, 1.0)
    for (arm, run, seed), g in points.groupby(["arm", "run", "seed"], sort=False, observed=True):
        if max_compute is not None:
            g = g[g["compute"] <= max_compute.get(run, np.inf)]
        f = fit_curve(g["compute"], g["value"], a_bounds=bounds, flat_rise=FLAT_RISE / scale, saturation=saturation,
                      scale=scale)
        d = asdict(f)
        for k in ("R0", "A", "rmse"):
            d[k] = d[k] * scale
        rows.append({"arm": arm, "run": run, "seed": int(seed), "axis": axis, **d,
                     "log10_C_mid": math.log10(f.C_mid) if np.isfinite(f.C_mid) and f.C_mid > 0 else np.nan})
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


# --------------------------------------------------------------------------- extrapolation
EXTRA_COLUMNS = ["arm", "runs", "fitted", "saturated_first_half", "points", "bias", "rmse", "max_abs",
                 "sat_points", "sat_rmse"]


def extrapolation_table(points: pd.DataFrame, axis: str, scale: float = 100.0, arms: list[str] | None = None
                        ) -> pd.DataFrame:
    """Per arm (:data:`EXTRA_COLUMNS`): each run fitted on its evaluations with compute ≤ half its largest,
    then the fit's prediction at each later evaluation minus the observed value (shown unit): bias
    (mean error), rmse and max_abs over all those points of the arm's runs; fitted: runs whose first-half
    fit converged (:attr:`CurveFit.ok`: saturated or not, as a user stopping early would use it);
    saturated_first_half: those among them that were saturated already; sat_points, sat_rmse: the same
    error over those saturated first-half fits only."""
    half = {r: float(g["compute"].max()) / 2 for r, g in points.groupby("run", sort=False)}
    first = fit_runs(points, axis, scale, max_compute=half)
    rows = []
    for arm in arms or list(dict.fromkeys(points["arm"])):
        fa = first[first["arm"] == arm]
        errs, sat_errs = [], []
        n_ok = 0
        for f in fa.itertuples(index=False):
            if f.status not in ("saturated", "not saturated", "flat"):
                continue
            n_ok += 1
            g = points[(points["run"] == f.run) & (points["compute"] > half[f.run])]
            pred = saturating(g["compute"], f.R0 / scale, f.A / scale, f.B, f.C_mid) * scale
            errs += list(pred - g["value"].to_numpy(dtype=float) * scale)
            if f.status == "saturated":
                sat_errs += list(pred - g["value"].to_numpy(dtype=float) * scale)
        e, es = np.asarray(errs, dtype=float), np.asarray(sat_errs, dtype=float)
        rows.append({"arm": arm, "runs": int(len(fa)), "fitted": n_ok,
                     "saturated_first_half": int((fa["status"] == "saturated").sum()), "points": int(e.size),
                     "bias": float(e.mean()) if e.size else np.nan,
                     "rmse": float(np.sqrt(np.mean(e ** 2))) if e.size else np.nan,
                     "max_abs": float(np.abs(e).max()) if e.size else np.nan, "sat_points": int(es.size),
                     "sat_rmse": float(np.sqrt(np.mean(es ** 2))) if es.size else np.nan})
    return pd.DataFrame(rows, columns=EXTRA_COLUMNS)


# --------------------------------------------------------------------------- paired comparisons
COMPARE_COLUMNS = ["comparison", "off", "on", "pairs", "saturated_pairs", "A_off", "A_on", "dA", "dA_lo", "dA_hi",
                   "dA_level", "dA_p", "dA_p_tost", "A_margin", "A_verdict", "dlogC", "dlogC_lo", "dlogC_hi",
                   "dlogC_p", "dlogC_p_tost", "C_verdict", "dB", "level", "method", "dA_q", "dlogC_q"]
NOT_SATURATED = "not decidable: curves not saturated"


def compare_curves(fits: pd.DataFrame, pairs: list[tuple[str, str, str]], *, margin: float | None = 1.0,
                   alpha: float = ALPHA) -> pd.DataFrame:
    """Per (label, off, on) pair: A and log₁₀ C_mid of on − off, paired by seed (:data:`COMPARE_COLUMNS`).

    pairs: seeds with a run in both arms. When every one of them has both runs "saturated", dA =
    :func:`analysis.stats.paired_diff` of A (shown unit; TOST against ±``margin``) and dlogC = of
    log₁₀ C_mid (TOST against ±:data:`EFFICIENCY_MARGIN`); dB the mean paired difference of B
    (descriptive). Verdicts from :func:`analysis.stats.effect_verdict` on the unadjusted p
    (exploratory): A "raises the ceiling" / "lowers the ceiling" / "bounded null" / "inconclusive";
    C_mid "reaches it sooner" (smaller C_mid) / "reaches it later" / "bounded null" / "inconclusive".
    When any paired seed's run is not saturated both verdicts are :data:`NOT_SATURATED` and the
    differences are computed over the saturated pairs only, for description. dA_q, dlogC_q: the
    Benjamini–Hochberg q of each p over the rows (a lead when q ≤ 0.10, as for every exploratory table).
    """
    rows = []
    for label, off, on in pairs:
        a = fits[fits["arm"] == off].set_index("seed")
        b = fits[fits["arm"] == on].set_index("seed")
        seeds = sorted(set(a.index) & set(b.index))
        sat = [s for s in seeds if a.loc[s, "status"] == "saturated" and b.loc[s, "status"] == "saturated"]
        dA = paired_diff(a.loc[sat, "A"], b.loc[sat, "A"], alpha=alpha, margin=margin)
        dC = paired_diff(a.loc[sat, "log10_C_mid"], b.loc[sat, "log10_C_mid"], alpha=alpha, margin=EFFICIENCY_MARGIN)
        all_sat = len(sat) == len(seeds) and len(seeds) > 0
        if all_sat:
            va = effect_verdict(dA.mean, dA.p, dA.p_tost, predicted=1, alpha=alpha, yes="raises the ceiling",
                                no="lowers the ceiling")
            vc = effect_verdict(dC.mean, dC.p, dC.p_tost, predicted=-1, alpha=alpha, yes="reaches it sooner",
                                no="reaches it later")
        else:
            va = vc = NOT_SATURATED
        dB = float((b.loc[sat, "B"] - a.loc[sat, "B"]).mean()) if sat else np.nan
        rows.append({"comparison": label, "off": off, "on": on, "pairs": len(seeds), "saturated_pairs": len(sat),
                     "A_off": float(a.loc[sat, "A"].mean()) if sat else np.nan,
                     "A_on": float(b.loc[sat, "A"].mean()) if sat else np.nan,
                     "dA": dA.mean, "dA_lo": dA.lo, "dA_hi": dA.hi, "dA_level": dA.level, "dA_p": dA.p,
                     "dA_p_tost": dA.p_tost, "A_margin": margin if margin is not None else np.nan, "A_verdict": va,
                     "dlogC": dC.mean, "dlogC_lo": dC.lo, "dlogC_hi": dC.hi, "dlogC_p": dC.p,
                     "dlogC_p_tost": dC.p_tost, "C_verdict": vc, "dB": dB, "level": dA.level, "method": dA.method})
    out = pd.DataFrame(rows, columns=[c for c in COMPARE_COLUMNS if c not in ("dA_q", "dlogC_q")])
    out["dA_q"], out["dlogC_q"] = bh_q(out["dA_p"]), bh_q(out["dlogC_p"])
    return out[COMPARE_COLUMNS]


# --------------------------------------------------------------------------- the figure
def curve_figure(points: pd.DataFrame, fits: pd.DataFrame, sweep: SweepInfo, tidy: pd.DataFrame, metric: str,
                 axis: str, scale: float = 100.0):
    """Fig. C1, in the style of ScaleRL's Fig. 1: one panel per arm (its colour from
    :func:`analysis.figures.arm_colors`; shared axes), every run's evaluations after step 0 as points and
    its saturating fit as a thin line (solid: saturated; dashed: not saturated or flat), the mean A over
    the arm's saturated runs as a dotted horizontal line; compute on a log axis (step 0, at compute 0,
    is off it: R₀ is where each fitted line starts). The y axis spans the points (fits that run beyond
    them are cut). None without points."""
    import matplotlib

    from .figures import STYLE, _footnote, _new_figure, arm_colors
    pos = points[points["compute"] > 0]
    if pos.empty:
        return None
    colors = arm_colors(tidy, sweep)
    labels = {a.name: a.label for a in sweep.arms}
    arms = list(dict.fromkeys(points["arm"]))
    ncols = min(4, len(arms))
    nrows = -(-len(arms) // ncols)
    fig, axes = _new_figure(ncols=ncols, nrows=nrows, size=(3.1 * ncols + 0.6, 2.5 * nrows + 0.9))
    lo, hi = float(pos["compute"].min()), float(pos["compute"].max())
    grid = np.geomspace(lo / 1.5, hi * 1.05, 120)
    y = points["value"].to_numpy(dtype=float) * scale
    pad = 0.15 * max(float(np.ptp(y)), 1e-9)
    ylim = (float(y.min()) - pad, float(y.max()) + pad)
    with matplotlib.rc_context(STYLE):
        for i, (ax, arm) in enumerate(zip(axes, arms)):
            c = colors.get(arm, "#333333")
            p = pos[pos["arm"] == arm]
            ax.plot(p["compute"], p["value"] * scale, linestyle="none", marker="o", markersize=2.6, alpha=0.5,
                    color=c)
            fa = fits[fits["arm"] == arm]
            for f in fa.itertuples(index=False):
                if f.status in ("saturated", "not saturated", "flat"):
                    ax.plot(grid, saturating(grid, f.R0, f.A, f.B, f.C_mid), color=c, linewidth=0.9, alpha=0.7,
                            linestyle="-" if f.status == "saturated" else "--")
            sat = fa[fa["status"] == "saturated"]
            if len(sat):
                ax.axhline(float(sat["A"].mean()), color="#333333", linestyle=":", linewidth=1.2)
            ax.set_xscale("log")
            ax.set_ylim(*ylim)
            name = textwrap.shorten(labels.get(arm, arm), 40, placeholder="…")
            ax.set_title(f"{name}\n{len(sat)} of {len(fa)} runs saturated", fontsize=8)
            if i // ncols == nrows - 1 or i + ncols >= len(arms):
                ax.set_xlabel(AXES[axis])
            if i % ncols == 0:
                ax.set_ylabel(metric_short(metric) + (" (%)" if scale == 100 else ""))
        for ax in axes[len(arms):]:
            ax.set_visible(False)
        fig.suptitle(f"Fig. C1: {metric_short(metric)} against {AXES[axis]}, per run, with R(C) = R₀ + (A − R₀)/"
                     f"(1 + (C_mid/C)^B)", x=0.01, ha="left", fontweight="bold")
        _footnote(fig, "Points: each run's evaluations after step 0 (compute on a log axis). Lines: each run's fit, "
                       "R₀ fixed at its step-0 value (solid: saturated; dashed: not saturated or flat). Dotted: the "
                       "mean A over the arm's saturated runs.")
    return fig


# --------------------------------------------------------------------------- the report section
CURVES_NOTE = (
    "Method: per run, R(C) = R₀ + (A − R₀)/(1 + (C_mid/C)^B) fitted to its evaluations against the compute "
    "spent before each (R₀ fixed at its step-0 value; A, B, C_mid by bounded least squares, "
    f"scipy.optimize.least_squares, from {N_STARTS} starts; B in [{B_BOUNDS[0]:g}, {B_BOUNDS[1]:g}], C_mid within "
    f"{CMID_SPAN[0]:g}–{CMID_SPAN[1]:g}× the data's compute range). A fit is saturated when at least "
    f"{100 * SATURATION:.0f}% of its rise A − R₀ is reached by the run's last evaluation; otherwise A is an "
    "extrapolation and no ceiling is read from it. Flat: a fit that moves less than "
    f"{FLAT_RISE:g} point over the run. Comparisons pair the arms' A and log₁₀ C_mid by seed (exact sign-flip interval and "
    "test; TOST against the metric's margin for A and ±log₁₀ 1.25 for C_mid), exploratory (unadjusted p; q: "
    "Benjamini–Hochberg over the table's rows); a "
    "comparison with any paired seed's run not saturated gets no verdict: dropping those seeds would select "
    "seeds by their outcome. Extrapolation: each run fitted on the first half of its compute, predicted on "
    "the second; error = predicted − observed. docs/STATISTICS.md, \"Compute curves\".")


def _f(v, digits: int = 1, signed: bool = False) -> str:
    if v is None or not np.isfinite(v):
        return "–"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def _count(v) -> str:
    if not np.isfinite(v):
        return "–"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suf}"
    return f"{v:.3g}"


def curve_pairs(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None) -> list[tuple[str, str, str]]:
    """(label, off, on): the primary family's pairs (:func:`analysis.tables.primary_pairs`), then, in arm
    order, every other pair of arms whose resolved configs differ in exactly one key (a staleness sweep:
    staleness 0 → 1 → 2 within each algorithm; the bypass objective vs its decoupled arm)."""
    from .arms import _other_keys, flat_arm_configs
    from .tables import comparison_label, primary_pairs
    out = [(comparison_label(on, off), off.name, on.name) for off, on in primary_pairs(tidy, sweep, configs)]
    seen = {(o, n) for _, o, n in out} | {(n, o) for _, o, n in out}
    acfg = flat_arm_configs(tidy, sweep, configs)
    arms = arms_with_runs(tidy, sweep)
    for i, off in enumerate(arms):
        for on in arms[i + 1:]:
            if (off.name, on.name) in seen or off.name not in acfg or on.name not in acfg:
                continue
            keys = _other_keys(acfg[off.name], acfg[on.name], set())
            if len(keys) == 1:
                out.append((f"{comparison_label(on, off)} ({keys[0]})", off.name, on.name))
    return out


def curves_section(tidy: pd.DataFrame, sweep: SweepInfo, configs: dict | None, out_dir=None, *,
                   axis: str = "gen_tokens", metric: str | None = None,
                   pairs: list[tuple[str, str, str]] | None = None, formats: tuple[str, ...] = ("png",)
                   ) -> list[str]:
    """The report's "Ceiling or efficiency: compute curves" section (markdown lines).

    Fits every run (:func:`fit_runs` on :func:`compute_points` of the sweep's metric against ``axis``),
    compares :func:`curve_pairs` (or ``pairs``: (label, off, on)) with :func:`compare_curves`, and checks extrapolation (:func:`extrapolation_table`). With
    ``out_dir``: writes curves.csv, curve_compare.csv, curve_extrapolation.csv and figures/fig_curves.*.
    """
    from .tables import to_markdown
    metric = metric or sweep.metric or primary_metric(tidy)
    head = [f"## Ceiling or efficiency: compute curves ({AXES.get(axis, axis)})", ""]
    if not metric or not (tidy["metric"] == metric).any():
        return head + ["No evaluation metric in these runs: no curve.", ""]
    scale = metric_scale(tidy, metric)
    points = compute_points(tidy, metric, axis, configs)
    if points.empty:
        return head + [f"No run logged what the {AXES[axis]} axis needs: no curve.", ""]
    arms = [a.name for a in arms_with_runs(tidy, sweep) if a.name in set(points["arm"])]
    labels = {a.name: a.label for a in sweep.arms}
    fits = fit_runs(points, axis, scale)
    if pairs is None:
        pairs = curve_pairs(tidy, sweep, configs)
    margin = equivalence_margin(metric, sweep.margins)
    comp = compare_curves(fits, pairs, margin=margin)
    extra = extrapolation_table(points, axis, scale, arms)
    fig = None
    if out_dir is not None:
        out = Path(out_dir)
        (out / "figures").mkdir(parents=True, exist_ok=True)
        fits.to_csv(out / "curves.csv", index=False)
        comp.to_csv(out / "curve_compare.csv", index=False)
        extra.to_csv(out / "curve_extrapolation.csv", index=False)
        fig = curve_figure(points, fits, sweep, tidy, metric, axis, scale)
        if fig is not None:
            from .figures import save_figure
            save_figure(fig, out / "figures" / "fig_curves", formats)
            fig.clear()
    unit = " (pp)" if scale == 100 else ""
    # per arm: status counts and the saturated runs' parameters
    rows = []
    for arm in arms:
        fa = fits[fits["arm"] == arm]
        sat = fa[fa["status"] == "saturated"]
        counts = fa["status"].value_counts()
        rows.append({"arm": labels.get(arm, arm), "runs": str(len(fa)),
                     "saturated": str(int(counts.get("saturated", 0))),
                     "not saturated / flat / too few": f"{int(counts.get('not saturated', 0))} / "
                                                       f"{int(counts.get('flat', 0))} / "
                                                       f"{int(counts.get('too few points', 0) + counts.get('failed', 0))}",
                     f"R₀{unit}": _f(fa["R0"].mean()),
                     f"A{unit} (saturated, mean)": _f(sat["A"].mean()),
                     "B (median)": _f(sat["B"].median(), 2),
                     f"C_mid (median, {AXES[axis]})": _count(sat["C_mid"].median()),
                     "share of rise reached (median)": _f(100 * fa["frac_end"].median(), 0) + "%"
                     if fa["frac_end"].notna().any() else "–"})
    lines = head + [f"Per run, `{metric_short(metric)}` against {AXES[axis]} spent before each evaluation. "
                    f"Exploratory: no Holm adjustment, and a verdict here is a lead, not a finding.", "",
                    to_markdown(pd.DataFrame(rows)), ""]
    bad = fits[fits["status"] != "saturated"]
    if len(bad):
        why = bad.groupby(["arm", "status"], sort=False).agg(seeds=("seed", lambda s: ", ".join(map(str, sorted(s)))),
                                                             reason=("reason", "first")).reset_index()
        lines += ["Runs without a ceiling: " + "; ".join(
            f"{labels.get(r.arm, r.arm)}, seed(s) {r.seeds}: {r.status} (e.g. {r.reason})" if r.reason else
            f"{labels.get(r.arm, r.arm)}, seed(s) {r.seeds}: {r.status}" for r in why.itertuples(index=False)) + ".",
                  ""]
    if len(comp):
        lvl = comp["level"].dropna()
        head_iv = f" [{interval_label('sign-flip', float(lvl.iloc[0]))}]" if len(lvl) and lvl.nunique() == 1 else ""
        shown = pd.DataFrame({
            "comparison": comp["comparison"],
            "saturated pairs": [f"{s} of {n}" for s, n in zip(comp["saturated_pairs"], comp["pairs"])],
            f"ΔA{unit}{head_iv}": [f"{_f(m, 1, True)} [{_f(lo, 1, True)}, {_f(hi, 1, True)}]" if np.isfinite(m) else "–"
                                   for m, lo, hi in zip(comp["dA"], comp["dA_lo"], comp["dA_hi"])],
            "p (A), q": [f"{format_p(p)}, {format_p(q)}" for p, q in zip(comp["dA_p"], comp["dA_q"])],
            "ceiling": comp["A_verdict"],
            f"Δlog₁₀ C_mid{head_iv}": [f"{_f(m, 2, True)} [{_f(lo, 2, True)}, {_f(hi, 2, True)}]"
                                       if np.isfinite(m) else "–"
                                       for m, lo, hi in zip(comp["dlogC"], comp["dlogC_lo"], comp["dlogC_hi"])],
            "p (C_mid), q": [f"{format_p(p)}, {format_p(q)}" for p, q in zip(comp["dlogC_p"], comp["dlogC_q"])],
            "efficiency": comp["C_verdict"],
        })
        lines += [to_markdown(shown), ""]
    lines += ["Extrapolation checked: each run fitted on the first half of its compute, its prediction at the "
              "later evaluations minus what they measured:", "",
              to_markdown(pd.DataFrame({
                  "arm": [labels.get(a, a) for a in extra["arm"]],
                  "first-half fits (saturated)": [f"{f} of {r} ({s})" for f, r, s in
                                                  zip(extra["fitted"], extra["runs"], extra["saturated_first_half"])],
                  "points": extra["points"].astype(str),
                  f"bias{unit}": [_f(v, 1, True) for v in extra["bias"]],
                  f"RMSE{unit}": [_f(v) for v in extra["rmse"]],
                  f"max |error|{unit}": [_f(v) for v in extra["max_abs"]],
                  f"RMSE, saturated first halves{unit}": [f"{_f(v)} ({n})" for v, n in
                                                          zip(extra["sat_rmse"], extra["sat_points"])]})), ""]
    if out_dir is not None and fig is not None:
        lines += ["![compute curves](figures/fig_curves.png)", ""]
    files = ("Numbers: [curves.csv](curves.csv), [curve_compare.csv](curve_compare.csv), "
             "[curve_extrapolation.csv](curve_extrapolation.csv).") if out_dir is not None else ""
    return lines + [CURVES_NOTE + (" " + files if files else ""), ""]
