"""Seed statistics: intervals that keep their stated level, one test per decision, families, power.

The methods, one rule each (docs/STATISTICS.md gives their coverage and why):

- **a level over seeds** (an arm's mean, a curve's band): the Student-t interval
  (:func:`t_interval`); its test against a bound is the one-sided t-test (:func:`t_test_p`).
- **a paired difference over seeds** (arm b − arm a with the same seed, or end − start of one
  run): the exact sign-flip test (:func:`sign_flip_p`) and the interval that inverts it
  (:func:`sign_flip_interval`, Hartigan's subset means) for n ≤ :data:`EXACT_MAX_N`
  pairs; the t-interval above (:func:`diff_interval` applies the rule). With n pairs the
  sign-flip interval's level is 1 − 2k/2^n, the nearest at or above 1 − α (6 pairs:
  [min, max], 96.9%; 3 pairs: [min, max] is all there is, 75%), and it is labelled so.
- **equivalence**: two one-sided sign-flip tests against ±margin (:func:`tost_p`).
- **a family**: Holm's step-down adjustment (:func:`holm`).
- **seeds needed**: the power of the exact sign-flip test by simulation
  (:func:`sign_flip_power`, :func:`seeds_needed_sign_flip`), with the spread that the SD's own
  χ² interval implies (:func:`sd_interval`).
- **verdicts**: :func:`effect_verdict` and :func:`level_verdict` read the decision off the p
  of the row's own test, never off an interval or a point estimate.

:func:`bootstrap_ci` (percentile bootstrap) stays for quantities with many units (problems),
never for a handful of seeds: at 3–6 seeds it covers 75–85% where it says 95%.
Random draws use ``numpy.random.default_rng(seed)``, so every number is reproducible.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
import pandas as pd

__all__ = ["Interval", "bootstrap_ci", "t_interval", "sign_flip_interval", "diff_interval", "seed_band",
           "run_finals", "final_points", "FinalKError", "per_run_curve", "PairedDiff", "paired_diff", "sign_flip_p", "t_test_p", "tost_p", "holm",
           "sd_interval", "sign_flip_power", "seeds_needed", "seeds_needed_sign_flip", "min_pairs_sign_flip",
           "effect_verdict", "level_verdict", "interval_label", "SEEDS_NEEDED_METHOD", "BAND_METHOD",
           "EXACT_MAX_N", "ALPHA"]

ALPHA = 0.05
"""The level of every test and the (1 − α) of every interval, unless a caller says otherwise."""
EXACT_MAX_N = 16
"""Up to this many pairs the sign-flip test enumerates all 2^n sign flips and the difference
interval is the exact sign-flip one; above, Monte Carlo flips and the t-interval."""


def _finite(values) -> np.ndarray:
    v = np.asarray(values, dtype=float).ravel()
    return v[np.isfinite(v)]


@lru_cache(maxsize=32)
def _sign_matrix(n: int) -> np.ndarray:
    """All 2^n sign vectors: [2^n, n] of ±1; row 0 is all +1 (the observed assignment)."""
    bits = (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1
    return 1.0 - 2.0 * bits


# --------------------------------------------------------------------------- intervals
@dataclass(frozen=True)
class Interval:
    """A mean and its interval, with the method and the level it really has."""
    mean: float
    lo: float
    hi: float
    level: float           # coverage the method guarantees (exact) or targets (t: exact under normality)
    method: str            # "t" | "sign-flip" | "bootstrap" | "none" (fewer than 2 values)
    n: int


def format_p(p) -> str:
    """A p-value as reports print it: 3 decimals, "< 0.001" below (never "0.000"), "–" when undefined."""
    if p is None or not np.isfinite(p):
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def interval_label(method: str, level: float) -> str:
    """"96.9% sign-flip" / "95% t" — how a table or a figure names its interval."""
    if method == "none" or not np.isfinite(level):
        return "no interval"
    pct = 100 * level
    return f"{pct:.0f}% {method}" if abs(pct - round(pct)) < 0.05 else f"{pct:.1f}% {method}"


def t_interval(values, alpha: float = ALPHA) -> Interval:
    """Student-t interval for the mean of ``values``: [n] (NaNs dropped).

    mean ± t_{1−α/2, n−1} · s/√n, s the SD with ddof 1. Exact coverage 1 − α for normal
    values; one value: lo = hi = NaN, method "none"; none: all NaN.
    """
    from scipy.stats import t
    v = _finite(values)
    n = v.size
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), float("nan"), "none", 0)
    mean = float(v.mean())
    if n == 1:
        return Interval(mean, float("nan"), float("nan"), float("nan"), "none", 1)
    half = float(t.ppf(1 - alpha / 2, n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, 1 - alpha, "t", n)


def sign_flip_interval(diffs, alpha: float = ALPHA) -> Interval:
    """The exact interval of the sign-flip test for the centre of symmetric differences.

    diffs: [n] (NaNs dropped; 2 ≤ n ≤ :data:`EXACT_MAX_N`). Hartigan (1969): the 2^n − 1
    means of the non-empty subsets of d cut the line into 2^n intervals that each hold the
    centre μ with probability 2^−n when the d_i are independent and symmetric about μ (paired
    differences with exchangeable arms are). So [k-th smallest, k-th largest subset mean] has
    level exactly 1 − 2k/2^n; k = max(1, ⌊α·2^n/2⌋) gives the nearest level ≥ 1 − α, or
    the widest there is when none reaches it (n = 3: [min, max] at 75%; n = 5: 93.75%).
    k = 1 is [min d, max d]. The reported level is the true one.
    """
    d = _finite(diffs)
    n = d.size
    if n < 2:
        return Interval(float(d.mean()) if n else float("nan"), float("nan"), float("nan"), float("nan"), "none", n)
    if n > EXACT_MAX_N:
        raise ValueError(f"sign_flip_interval: {n} differences (the exact interval enumerates 2^n; at most "
                         f"{EXACT_MAX_N})")
    inc = (_sign_matrix(n)[1:] < 0).astype(float)                # [2^n − 1, n] non-empty subsets
    means = np.sort(inc @ d / inc.sum(axis=1))                    # [2^n − 1]
    total = 2 ** n
    k = max(1, int(math.floor(alpha * total / 2 + 1e-9)))
    return Interval(float(d.mean()), float(means[k - 1]), float(means[total - 1 - k]), 1 - 2 * k / total,
                    "sign-flip", n)


def diff_interval(diffs, alpha: float = ALPHA) -> Interval:
    """The interval for a mean paired difference, by the one rule: exact sign-flip for
    2 ≤ n ≤ :data:`EXACT_MAX_N` pairs, Student-t above (no interval below 2)."""
    n = _finite(diffs).size
    return sign_flip_interval(diffs, alpha) if n <= EXACT_MAX_N else t_interval(diffs, alpha)


def bootstrap_ci(values, n_boot: int = 10000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of ``values`` and its (1 − alpha) percentile-bootstrap CI.

    values: [n] (NaNs dropped). n_boot resamples of size n with replacement, drawn as
    ``default_rng(seed).integers(0, n, (n_boot, n))``; lo/hi are the alpha/2 and 1 − alpha/2
    percentiles of the resample means (numpy's linear interpolation). One value: lo = hi =
    mean; none: all NaN. For many units only (problems): over 3 seeds it is [min, max] and
    covers 75% (docs/STATISTICS.md).
    """
    v = _finite(values)
    n = v.size
    if n == 0:
        return (float("nan"),) * 3
    mean = float(v.mean())
    if n == 1:
        return mean, mean, mean
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # [n_boot, n]
    boots = v[idx].mean(axis=1)                                         # [n_boot]
    lo, hi = np.percentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return mean, float(lo), float(hi)


# --------------------------------------------------------------------------- curves
BAND_METHOD = ("line: mean over seeds; band: 95% Student-t interval over the seeds that have a value at that "
               "point (no band where only one seed has one)")
"""How every figure's band is computed (figure notes and the report say it)."""


def per_run_curve(tidy: pd.DataFrame, metric: str, x: str = "grad_step") -> pd.DataFrame:
    """``[arm, run, seed, x, value]``: one value per run and x (mean if several points share x)."""
    d = tidy.loc[tidy["metric"] == metric, ["arm", "run", "seed", x, "value"]]
    d = d.dropna(subset=[x])
    if x == "rollout_step":
        d = d.astype({x: "int64"})
    return d.groupby(["arm", "run", "seed", x], sort=False, observed=True)["value"].mean().reset_index()


def seed_band(tidy: pd.DataFrame, metric: str, x: str = "grad_step", *, arms=None,
              alpha: float = ALPHA) -> pd.DataFrame:
    """Mean over seeds and its Student-t band (:func:`t_interval` per x), per arm per x.

    Returns columns ``[arm, <x>, mean, lo, hi, n]`` (n = seeds with a value at that x),
    sorted by arm (first-seen order) then x. With one seed at an x, lo = hi = NaN (no band).
    """
    from scipy.stats import t
    cols = ["arm", x, "mean", "lo", "hi", "n"]
    curves = per_run_curve(tidy, metric, x)
    if arms is not None:
        curves = curves[curves["arm"].isin(list(arms))]
    frames = []
    for arm, g in curves.groupby("arm", sort=False):
        P = g.pivot(index=x, columns="run", values="value").sort_index()  # [n_x, n_runs]
        V = P.to_numpy(dtype=float)
        n = np.isfinite(V).sum(axis=1)                                      # [n_x]
        with warnings.catch_warnings():                                     # all-NaN rows → NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(V, axis=1)
            sd = np.nanstd(V, axis=1, ddof=1)
        half = np.where(n > 1, t.ppf(1 - alpha / 2, np.maximum(n - 1, 1)) * sd / np.sqrt(np.maximum(n, 1)), np.nan)
        frames.append(pd.DataFrame({"arm": arm, x: P.index.to_numpy(), "mean": mean,
                                    "lo": mean - half, "hi": mean + half, "n": n}))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t_) for c, t_ in
                             zip(cols, [object, "int64", float, float, float, "int64"])})
    return pd.concat(frames, ignore_index=True)[cols]


class FinalKError(ValueError):
    """A ``final_k`` the runs cannot supply: fewer evaluations after step 0 than final values average."""


def final_points(d: pd.DataFrame, final_k: int, metric: str = "metric") -> pd.DataFrame:
    """The rows of each run's last ``final_k`` points of ``d`` (one metric: columns run, grad_step),
    never its step-0 point (the untrained model is a start, not a final value).

    Raises :class:`FinalKError` when no run has ``final_k`` points after step 0 (final values would mean
    fewer evaluations than they say); a run with some but fewer (still running) averages those it has."""
    if final_k < 1:
        raise FinalKError(f"final_k {final_k}: expected an integer >= 1")
    after = d[d["grad_step"] > 0].sort_values(["run", "grad_step"], kind="stable")
    most = int(after.groupby("run", sort=False).size().max()) if len(after) else 0
    if len(d) and most < final_k:
        raise FinalKError(f"final_k {final_k}: the runs have at most {most} evaluation{'s' if most != 1 else ''} of "
                          f"{metric} after step 0 (step 0, the untrained model, is never a final value); "
                          f"use final_k <= {most}" + (" or wait for the runs to evaluate" if most == 0 else ""))
    return after.groupby("run", sort=False).tail(final_k)


def run_finals(tidy: pd.DataFrame, metric: str, final_k: int = 3) -> pd.DataFrame:
    """``[arm, run, seed, final, last_step]``: per run, the mean of its last final_k points of metric
    after step 0 (:func:`final_points`: a final_k the runs cannot supply is a :class:`FinalKError`)."""
    d = tidy.loc[tidy["metric"] == metric, ["arm", "run", "seed", "grad_step", "value"]]
    last = final_points(d, final_k, metric)
    out = last.groupby(["arm", "run", "seed"], sort=False).agg(
        final=("value", "mean"), last_step=("grad_step", "max")).reset_index()
    return out


# --------------------------------------------------------------------------- tests
def sign_flip_p(diffs, *, alternative: str = "two-sided", n_perm: int = 100_000,
                seed: int = 0) -> tuple[float, bool]:
    """``(p, exact)``: the paired permutation test of mean(diffs) = 0 by sign flips.

    diffs: [n]. Under H0 each difference is as likely + as −. Statistic: |mean| for
    ``alternative="two-sided"``, mean for "greater" (H1: mean > 0) and −mean for "less".
    n ≤ :data:`EXACT_MAX_N`: all 2^n sign vectors S: [2^n, n] (the observed one among them),
    p = #{flipped statistic ≥ observed} / 2^n (exact; the smallest two-sided p is 2/2^n,
    the smallest one-sided 1/2^n). Larger n: ``n_perm`` random sign vectors from
    ``default_rng(seed)``, p = (1 + hits) / (1 + n_perm). Ties count as "at least as extreme"
    (relative tolerance 1e-12). n = 0: NaN. Equals ``scipy.stats.permutation_test`` with
    ``permutation_type="samples"`` on one sample (tests/test_statistics.py).
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative = {alternative!r}: expected two-sided, greater or less")
    d = _finite(diffs)
    n = d.size
    if n == 0:
        return float("nan"), True
    stat = {"two-sided": np.abs, "greater": lambda m: m, "less": lambda m: -m}[alternative]
    obs = float(stat(d.mean()))
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if n <= EXACT_MAX_N:
        means = stat(_sign_matrix(n) @ d / n)                                       # [2^n]
        return float((means >= obs - tol).mean()), True
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_perm, n))     # [n_perm, n]
    hits = int((stat(signs @ d / n) >= obs - tol).sum())
    return (1 + hits) / (1 + n_perm), False


def t_test_p(values, mu0: float = 0.0, alternative: str = "two-sided") -> float:
    """p of the one-sample t-test of mean(values) = mu0 (scipy.stats.ttest_1samp); NaN below 2 values
    or when every value is equal."""
    from scipy.stats import ttest_1samp
    v = _finite(values)
    if v.size < 2 or np.ptp(v) == 0:
        return float("nan")
    return float(ttest_1samp(v, mu0, alternative=alternative).pvalue)


def tost_p(diffs, margin: float, **kw) -> float:
    """Equivalence of mean(diffs) to 0 within ±margin: two one-sided sign-flip tests (TOST).

    p = max(p of H0 mean ≤ −margin vs greater, p of H0 mean ≥ +margin vs less), each an exact
    sign-flip test of the shifted differences (d + margin, d − margin). p ≤ α: the mean is
    bounded inside (−margin, +margin) at level α ("bounded null"). NaN without a margin or diffs.
    """
    d = _finite(diffs)
    if d.size == 0 or margin is None or not np.isfinite(margin) or margin <= 0:
        return float("nan")
    lower, _ = sign_flip_p(d + margin, alternative="greater", **kw)
    upper, _ = sign_flip_p(d - margin, alternative="less", **kw)
    return max(lower, upper)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input order (NaNs stay NaN and do not count).

    Sorted finite p_(1) ≤ … ≤ p_(m): adj_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)).
    Rejecting adj ≤ α controls the family-wise error rate at α. Equals statsmodels'
    ``multipletests(method="holm")`` (tests/test_statistics.py).
    """
    p = np.asarray(pvalues, dtype=float).ravel()
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


LEAD_Q = 0.10
"""An exploratory row is a *lead* when its Benjamini–Hochberg q within its table is at most this."""


def bh_q(pvalues) -> np.ndarray:
    """Benjamini–Hochberg q-values of the finite p-values, in the input order (NaNs stay NaN and do not
    count); statsmodels ``multipletests(method="fdr_bh")``. An exploratory table's q: its false-discovery
    rate among the rows read as leads (q ≤ :data:`LEAD_Q`)."""
    from statsmodels.stats.multitest import multipletests
    v = np.asarray(pvalues, dtype=float).ravel()
    q = np.full(v.shape, np.nan)
    ok = np.isfinite(v)
    if ok.any():
        q[ok] = multipletests(v[ok], method="fdr_bh")[1]
    return q


# --------------------------------------------------------------------------- verdicts
def effect_verdict(mean: float, p: float, p_tost: float = float("nan"), *, predicted: int = 0,
                   alpha: float = ALPHA, yes: str = "acts", no: str = "opposite") -> str:
    """One decision for a difference, from its own test (the p printed beside it).

    p ≤ α: ``yes`` when the sign of ``mean`` is the ``predicted`` one (+1 / −1), ``no`` when it is
    the other ("differs" without a prediction); else p_tost ≤ α: "bounded null" (the TOST of the
    row's declared margin); else "inconclusive". Never read off an interval or a point estimate.
    """
    if np.isfinite(p) and p <= alpha:
        if predicted == 0:
            return "differs"
        return yes if np.sign(mean) == np.sign(predicted) else no
    if np.isfinite(p_tost) and p_tost <= alpha:
        return "bounded null"
    return "inconclusive"


def level_verdict(p: float, alpha: float = ALPHA) -> str:
    """A level tested one-sided against its bound: "acts" when p ≤ α, else "not shown"."""
    return "acts" if np.isfinite(p) and p <= alpha else "not shown"


# --------------------------------------------------------------------------- paired arms
@dataclass(frozen=True)
class PairedDiff:
    """Arm b − arm a, paired by seed (see :func:`paired_diff`)."""
    mean: float            # mean over paired seeds of (b − a)
    lo: float              # interval of :func:`diff_interval` (its level and method below)
    hi: float
    p: float               # two-sided exact sign-flip p
    n: int                 # paired seeds (seeds present in both arms)
    sd: float              # SD (ddof 1) of the per-seed differences; NaN below 2 pairs
    exact: bool            # True: all 2^n sign flips; False: Monte Carlo flips
    seeds: tuple = ()      # the paired seeds, sorted
    level: float = float("nan")
    method: str = "none"
    p_tost: float = float("nan")    # TOST p against ±margin (NaN: no margin given)
    margin: float = float("nan")


def _by_seed(values) -> pd.Series:
    """A mapping / Series {seed: value} → float Series indexed by seed (NaNs dropped, duplicate seeds averaged)."""
    s = pd.Series(values, dtype=float) if not isinstance(values, pd.Series) else values.astype(float)
    s = s[np.isfinite(s.to_numpy())]
    return s.groupby(level=0).mean()


def paired_diff(a, b, *, alpha: float = ALPHA, margin: float | None = None, seed: int = 0,
                n_perm: int = 100_000) -> PairedDiff:
    """Arm b − arm a over the seeds both arms have.

    a, b: {seed: value} (a mapping or a Series indexed by seed); seeds in only one arm are
    dropped (``n`` says how many pairs are left). Per seed d = b − a: [n]. mean = mean(d);
    lo, hi, level, method = :func:`diff_interval` of d; p = :func:`sign_flip_p` (two-sided;
    exact for n ≤ 16, else Monte Carlo with ``n_perm`` flips and ``seed``); p_tost =
    :func:`tost_p` against ±margin when a margin is given. Swapping a and b negates
    mean/lo/hi and keeps p and p_tost. No pairs: everything NaN, n = 0.
    """
    sa, sb = _by_seed(a), _by_seed(b)
    seeds = sorted(set(sa.index) & set(sb.index))
    d = (sb.loc[seeds] - sa.loc[seeds]).to_numpy(dtype=float) if seeds else np.zeros(0)
    iv = diff_interval(d, alpha)
    p, exact = sign_flip_p(d, n_perm=n_perm, seed=seed)
    sd = float(d.std(ddof=1)) if d.size >= 2 else float("nan")
    m = float(margin) if margin is not None else float("nan")
    return PairedDiff(iv.mean, iv.lo, iv.hi, p, int(d.size), sd, exact, tuple(seeds), iv.level, iv.method,
                      tost_p(d, m, n_perm=n_perm, seed=seed), m)


# --------------------------------------------------------------------------- power
def min_pairs_sign_flip(alpha: float = ALPHA) -> int:
    """The fewest pairs with which the exact two-sided sign-flip test can give p ≤ alpha: 2/2^n ≤ alpha
    (α 0.05 → 6; Holm's first step over a family of 6, α/6 → 8)."""
    return max(1, int(np.ceil(np.log2(2.0 / alpha) - 1e-12)))


MIN_SEEDS_LEVEL = 3
"""A level (one arm's mean against a bound, one-sided t) is tested from this many seeds on."""


def too_few_seeds(n: int, test: str = "sign-flip", alpha: float = ALPHA) -> str | None:
    """The verdict of a row whose test cannot decide at ``n`` seeds, else None: the exact two-sided
    sign-flip test cannot reach α below :func:`min_pairs_sign_flip` pairs; a level's t-test is not run
    below :data:`MIN_SEEDS_LEVEL` seeds."""
    need = min_pairs_sign_flip(alpha) if test == "sign-flip" else MIN_SEEDS_LEVEL
    return f"too few seeds ({n}; the test needs {need})" if n < need else None


def sd_interval(sd: float, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The (1 − α) χ² interval of a normal SD estimated from n values: sd·√((n−1)/χ²_{1−α/2}),
    sd·√((n−1)/χ²_{α/2}), both with n − 1 degrees of freedom. NaN below 2 values."""
    from scipy.stats import chi2
    if not np.isfinite(sd) or n < 2:
        return float("nan"), float("nan")
    return (float(sd * math.sqrt((n - 1) / chi2.ppf(1 - alpha / 2, n - 1))),
            float(sd * math.sqrt((n - 1) / chi2.ppf(alpha / 2, n - 1))))


POWER_SIMS = 2000
"""Simulated experiments per power value."""
POWER_MAX_FLIPS = 4096
"""Sign flips per simulated test: all 2^n up to n = 12, then this many at random (the identity among them)."""


@lru_cache(maxsize=4096)
def sign_flip_power(n: int, effect_size: float, alpha: float = ALPHA, *, n_sim: int = POWER_SIMS,
                    seed: int = 0) -> float:
    """Power of the two-sided sign-flip test with n pairs when d ~ N(effect_size, 1), by simulation.

    effect_size = Δ / SD of the differences (the test is scale-free, so this is all it depends
    on). n_sim experiments D: [n_sim, n] from ``default_rng(seed)``; each one's p from all 2^n
    flips (n ≤ 12) or :data:`POWER_MAX_FLIPS` random ones (the same for every experiment);
    power = share with p ≤ α. Standard error ≤ 0.011 at n_sim 2000.
    """
    rng = np.random.default_rng(seed)
    D = rng.normal(effect_size, 1.0, size=(n_sim, n))                                  # [n_sim, n]
    if 2 ** n <= POWER_MAX_FLIPS:
        S = _sign_matrix(n)                                                             # [2^n, n]
    else:
        S = np.vstack([np.ones((1, n)), rng.choice([-1.0, 1.0], size=(POWER_MAX_FLIPS - 1, n))])
    obs = np.abs(D.sum(axis=1))                                                         # [n_sim]
    hits = 0
    for i in range(0, n_sim, 250):
        flipped = np.abs(S @ D[i:i + 250].T)                                            # [flips, ≤250]
        p = (flipped >= obs[i:i + 250] - 1e-12 * np.maximum(1.0, obs[i:i + 250])).mean(axis=0)
        hits += int((p <= alpha + 1e-12).sum())
    return hits / n_sim


SEEDS_MAX_SIMULATED = 30
"""seeds_needed_sign_flip simulates up to this many pairs; beyond, the t-test count (the two agree there)."""


def seeds_needed_sign_flip(sd_diff: float, effect: float, power: float = 0.8, alpha: float = ALPHA) -> int | None:
    """Paired seeds with which the two-sided exact sign-flip test reaches ``power`` against a mean
    difference ``effect`` when the differences are N(effect, sd_diff²).

    The smallest n ≥ :func:`min_pairs_sign_flip` (α) with :func:`sign_flip_power` (n) ≥ power,
    searched up to :data:`SEEDS_MAX_SIMULATED`; beyond, the paired t-test's count
    (:func:`seeds_needed`, which the permutation test matches at that size). None when sd_diff
    or effect is 0 or not finite.
    """
    if not (np.isfinite(sd_diff) and np.isfinite(effect)) or sd_diff <= 0 or effect == 0:
        return None
    e = round(abs(effect) / sd_diff, 6)
    for n in range(min_pairs_sign_flip(alpha), SEEDS_MAX_SIMULATED + 1):
        if sign_flip_power(n, e, alpha) >= power:
            return n
    return max(SEEDS_MAX_SIMULATED + 1, seeds_needed(sd_diff, effect, power, alpha) or 0)


def _z(q: float) -> float:
    """Standard normal quantile (the standard library's ``NormalDist``)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} not in (0, 1)")
    return NormalDist().inv_cdf(q)


def _t_ppf():
    """scipy.stats.t.ppf (scipy is a declared dependency; kept as a hook for tests)."""
    try:
        from scipy.stats import t
    except ImportError:
        return None
    return t.ppf


SEEDS_NEEDED_METHOD = ("power of the two-sided exact sign-flip test (the test whose p the table prints) by "
                       f"simulation: normal differences with the measured SD, {POWER_SIMS} simulated experiments "
                       f"per n, all 2^n flips up to n = 12 and {POWER_MAX_FLIPS} random ones above; the fewest n "
                       "with 80% power; in parentheses the same count at the two ends of the SD's 95% χ² "
                       f"interval (the SD itself comes from the pairs measured); above {SEEDS_MAX_SIMULATED} "
                       "the paired t-test's count")
"""How the seeds-needed column counts, in words (for footnotes)."""


def seeds_needed(sd_diff: float, effect: float, power: float = 0.8, alpha: float = 0.05, *,
                 t_ppf=..., max_n: int = 1_000_000) -> int | None:
    """Paired seeds needed to detect a mean difference ``effect`` with a two-sided paired t-test.

    sd_diff: the SD of the per-seed differences (same units as effect; the sign of effect is
    ignored). Normal approximation n₀ = ⌈((z_{1−α/2} + z_{power})·sd/|effect|)²⌉ (at least 2).
    With t quantiles (``t_ppf``: default scipy.stats.t.ppf, None forces the fallback): the
    smallest n ≥ n₀ with n ≥ ((t_{1−α/2, n−1} + t_{power, n−1})·sd/|effect|)², i.e. the
    t-iteration taken at its fixed point from below. Without t quantiles: n₀ + 1. None when
    sd_diff or effect is 0, negative or not finite. (The tables use
    :func:`seeds_needed_sign_flip`, the count for the test they print; this is its large-n tail.)
    """
    if not (np.isfinite(sd_diff) and np.isfinite(effect)) or sd_diff <= 0 or effect == 0:
        return None
    k = sd_diff / abs(effect)
    n0 = max(2, int(np.ceil(((_z(1 - alpha / 2) + _z(power)) * k) ** 2 - 1e-9)))
    ppf = _t_ppf() if t_ppf is ... else t_ppf
    if ppf is None:
        return n0 + 1
    n = n0
    while n < max_n and n < ((ppf(1 - alpha / 2, n - 1) + ppf(power, n - 1)) * k) ** 2 - 1e-9:
        n += 1
    return n
