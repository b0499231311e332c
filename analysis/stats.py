"""Seed statistics: percentile bootstrap over seeds, bands for curves, final values.

Every interval here is a percentile bootstrap of the mean over seeds (runs), drawn with
``numpy.random.default_rng(seed)`` so the numbers are reproducible.
:func:`seed_band` computes, for every x, exactly what :func:`bootstrap_ci` computes on that
x's seed values (same seed, same resamples), only vectorized over x.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
import pandas as pd

__all__ = ["bootstrap_ci", "seed_band", "run_finals", "per_run_curve", "PairedDiff", "paired_diff",
           "sign_flip_p", "seeds_needed", "min_pairs_sign_flip", "SEEDS_NEEDED_METHOD"]


def bootstrap_ci(values, n_boot: int = 10000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of ``values`` and its (1 − alpha) percentile-bootstrap CI.

    values: [n] (NaNs dropped). n_boot resamples of size n with replacement, drawn as
    ``default_rng(seed).integers(0, n, (n_boot, n))``; lo/hi are the alpha/2 and 1 − alpha/2
    percentiles of the resample means (numpy's linear interpolation). One value: lo = hi =
    mean; none: all NaN.
    """
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
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


@lru_cache(maxsize=64)
def _resample_counts(n: int, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The resamples bootstrap_ci draws for n values, compressed: distinct count rows + multiplicity.

    Returns U: [n_u, n] (how often each value appears in a resample), w: [n_u] (how many
    of the n_boot resamples have that row). With 3 seeds n_u ≤ 10, whatever n_boot.
    """
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))   # [n_boot, n]
    counts = np.zeros((n_boot, n), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(n_boot), n), idx.ravel()), 1)
    U, w = np.unique(counts, axis=0, return_counts=True)
    return U.astype(float), w


def _percentile_index(n: int, q: float) -> tuple[int, float]:
    """numpy's 'linear' method: virtual index (n − 1)·q → (floor, fraction), as numpy computes it."""
    virtual = n * q + (1 + q * (1 - 1 - 1)) - 1
    below = int(np.floor(virtual))
    return below, float(virtual - below)


def _bootstrap_rows(V: np.ndarray, n_boot: int, alpha: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """bootstrap_ci's (lo, hi) for every row of V: [m, n] (no NaNs), vectorized."""
    m, n = V.shape
    U, w = _resample_counts(n, n_boot, seed)
    M = V @ U.T / n                                         # [m, n_u] resample means
    order = np.argsort(M, axis=1, kind="stable")
    S = np.take_along_axis(M, order, axis=1)                # [m, n_u] sorted
    cw = np.cumsum(w[order], axis=1)                        # [m, n_u] cumulative multiplicity
    out = []
    for q in (alpha / 2, 1 - alpha / 2):
        k, t = _percentile_index(n_boot, q)
        a = S[np.arange(m), (cw <= k).sum(axis=1)]          # order statistic k
        b = S[np.arange(m), (cw <= min(k + 1, n_boot - 1)).sum(axis=1)]
        d = b - a
        out.append(np.where(t >= 0.5, b - d * (1 - t), a + d * t))  # numpy's _lerp
    return out[0], out[1]


def per_run_curve(tidy: pd.DataFrame, metric: str, x: str = "grad_step") -> pd.DataFrame:
    """``[arm, run, seed, x, value]``: one value per run and x (mean if several points share x)."""
    d = tidy.loc[tidy["metric"] == metric, ["arm", "run", "seed", x, "value"]]
    d = d.dropna(subset=[x])
    if x == "rollout_step":
        d = d.astype({x: "int64"})
    return d.groupby(["arm", "run", "seed", x], sort=False, observed=True)["value"].mean().reset_index()


def seed_band(tidy: pd.DataFrame, metric: str, x: str = "grad_step", *, arms=None,
              n_boot: int = 10000, alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Mean over seeds and its bootstrap band, per arm per x.

    Returns columns ``[arm, <x>, mean, lo, hi, n]`` (n = seeds with a value at that x),
    sorted by arm (first-seen order) then x. With one seed lo = hi = mean.
    """
    cols = ["arm", x, "mean", "lo", "hi", "n"]
    curves = per_run_curve(tidy, metric, x)
    if arms is not None:
        curves = curves[curves["arm"].isin(list(arms))]
    frames = []
    for arm, g in curves.groupby("arm", sort=False):
        P = g.pivot(index=x, columns="run", values="value").sort_index()  # [n_x, n_runs]
        V = P.to_numpy(dtype=float)
        ok = np.isfinite(V)
        mean, lo, hi = (np.full(len(P), np.nan) for _ in range(3))
        n = ok.sum(axis=1)
        patterns, inverse = np.unique(ok, axis=0, return_inverse=True)
        for p, pattern in enumerate(patterns):
            rows = np.flatnonzero(inverse.ravel() == p)
            sub = V[np.ix_(rows, np.flatnonzero(pattern))]          # [rows, seeds present]
            if sub.shape[1] == 0:
                continue
            mean[rows] = sub.mean(axis=1)
            if sub.shape[1] == 1:
                lo[rows] = hi[rows] = mean[rows]
            else:
                lo[rows], hi[rows] = _bootstrap_rows(sub, n_boot, alpha, seed)
        frames.append(pd.DataFrame({"arm": arm, x: P.index.to_numpy(), "mean": mean,
                                    "lo": lo, "hi": hi, "n": n}))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                             zip(cols, [object, "int64", float, float, float, "int64"])})
    return pd.concat(frames, ignore_index=True)[cols]


def run_finals(tidy: pd.DataFrame, metric: str, final_k: int = 3) -> pd.DataFrame:
    """``[arm, run, seed, final, last_step]``: per run, the mean of its last final_k points of metric."""
    d = tidy.loc[tidy["metric"] == metric, ["arm", "run", "seed", "grad_step", "value"]]
    d = d.sort_values(["run", "grad_step"], kind="stable")
    last = d.groupby("run", sort=False).tail(final_k)
    out = last.groupby(["arm", "run", "seed"], sort=False).agg(
        final=("value", "mean"), last_step=("grad_step", "max")).reset_index()
    return out


# --------------------------------------------------------------------------- paired arms
@dataclass(frozen=True)
class PairedDiff:
    """Arm b − arm a, paired by seed (see :func:`paired_diff`)."""
    mean: float            # mean over paired seeds of (b − a)
    lo: float              # 95% (1 − alpha) percentile-bootstrap CI over pairs
    hi: float
    p: float               # two-sided sign-flip permutation p-value
    n: int                 # paired seeds (seeds present in both arms)
    sd: float              # SD (ddof 1) of the per-seed differences; NaN below 2 pairs
    exact: bool            # True: all 2^n sign flips; False: Monte Carlo flips
    seeds: tuple = ()      # the paired seeds, sorted


EXACT_MAX_N = 16
"""Up to this many pairs the permutation test enumerates all 2^n sign flips; above, Monte Carlo."""


def _by_seed(values) -> pd.Series:
    """A mapping / Series {seed: value} → float Series indexed by seed (NaNs dropped, duplicate seeds averaged)."""
    s = pd.Series(values, dtype=float) if not isinstance(values, pd.Series) else values.astype(float)
    s = s[np.isfinite(s.to_numpy())]
    return s.groupby(level=0).mean()


def sign_flip_p(diffs, *, n_perm: int = 100_000, seed: int = 0) -> tuple[float, bool]:
    """``(p, exact)``: two-sided paired permutation test of mean(diffs) = 0 by sign flips.

    diffs: [n]. Under H0 each difference is as likely + as −; the statistic is |mean|.
    n ≤ :data:`EXACT_MAX_N`: all 2^n sign vectors S: [2^n, n] (the observed one among them),
    p = #{|S·d|/n ≥ |mean(d)|} / 2^n (exact; smallest possible p is 2/2^n). Larger n:
    ``n_perm`` random sign vectors from ``default_rng(seed)``, p = (1 + hits) / (1 + n_perm).
    Ties count as "at least as extreme" (relative tolerance 1e-12). n = 0: NaN.
    """
    d = np.asarray(diffs, dtype=float).ravel()
    d = d[np.isfinite(d)]
    n = d.size
    if n == 0:
        return float("nan"), True
    obs = abs(d.mean())
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if n <= EXACT_MAX_N:
        bits = (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1      # [2^n, n]
        signs = 1.0 - 2.0 * bits
        means = np.abs(signs @ d) / n                                         # [2^n]
        return float((means >= obs - tol).mean()), True
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_perm, n))  # [n_perm, n]
    hits = int((np.abs(signs @ d) / n >= obs - tol).sum())
    return (1 + hits) / (1 + n_perm), False


def paired_diff(a, b, *, n_boot: int = 10000, alpha: float = 0.05, seed: int = 0,
                n_perm: int = 100_000) -> PairedDiff:
    """Arm b − arm a over the seeds both arms have.

    a, b: {seed: final value} (a mapping or a Series indexed by seed); seeds in only one
    arm are dropped (``n`` says how many pairs are left). Per seed d = b − a: [n].
    mean = mean(d); lo, hi = :func:`bootstrap_ci` of d (percentile bootstrap over pairs,
    ``default_rng(seed)``); p = :func:`sign_flip_p` (exact paired sign-flip permutation test
    for n ≤ 16, else Monte Carlo with ``n_perm`` flips and the same seed). Swapping a and b
    negates mean/lo/hi and keeps p. No pairs: everything NaN, n = 0.
    """
    sa, sb = _by_seed(a), _by_seed(b)
    seeds = sorted(set(sa.index) & set(sb.index))
    d = (sb.loc[seeds] - sa.loc[seeds]).to_numpy(dtype=float) if seeds else np.zeros(0)
    mean, lo, hi = bootstrap_ci(d, n_boot=n_boot, alpha=alpha, seed=seed)
    p, exact = sign_flip_p(d, n_perm=n_perm, seed=seed)
    sd = float(d.std(ddof=1)) if d.size >= 2 else float("nan")
    return PairedDiff(mean, lo, hi, p, int(d.size), sd, exact, tuple(seeds))


def min_pairs_sign_flip(alpha: float = 0.05) -> int:
    """The fewest pairs with which the exact two-sided sign-flip test can give p ≤ alpha: 2/2^n ≤ alpha (α 0.05 → 6)."""
    return max(1, int(np.ceil(np.log2(2.0 / alpha) - 1e-12)))


def _z(q: float) -> float:
    """Standard normal quantile (the standard library's ``NormalDist``)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} not in (0, 1)")
    return NormalDist().inv_cdf(q)


def _t_ppf():
    """scipy.stats.t.ppf if scipy is importable, else None (scipy is not a declared dependency)."""
    try:
        from scipy.stats import t
    except ImportError:
        return None
    return t.ppf


SEEDS_NEEDED_METHOD = ("paired t-test, two-sided: normal approximation n₀ = ⌈((z₁₋α/₂ + z_power)·sd/Δ)²⌉, "
                       "then the smallest n ≥ n₀ with n ≥ ((t₁₋α/₂,ₙ₋₁ + t_power,ₙ₋₁)·sd/Δ)² "
                       "(t quantiles from scipy; without scipy: n₀ + 1)")
"""How :func:`seeds_needed` counts, in words (for footnotes)."""


def seeds_needed(sd_diff: float, effect: float, power: float = 0.8, alpha: float = 0.05, *,
                 t_ppf=..., max_n: int = 1_000_000) -> int | None:
    """Paired seeds needed to detect a mean difference ``effect`` with a two-sided paired test.

    sd_diff: the SD of the per-seed differences (same units as effect; the sign of effect is
    ignored). Normal approximation n₀ = ⌈((z_{1−α/2} + z_{power})·sd/|effect|)²⌉ (at least 2).
    With t quantiles (``t_ppf``: default scipy.stats.t.ppf when scipy imports, None forces the
    fallback): the smallest n ≥ n₀ with n ≥ ((t_{1−α/2, n−1} + t_{power, n−1})·sd/|effect|)²,
    i.e. the t-iteration n ← f(n) taken at its fixed point from below (the right side falls
    as n grows, so the search is monotone; a plain iteration can jump between 2 and a large
    n when sd/|effect| is small). Without scipy: n₀ + 1 (small-sample correction).
    None when sd_diff or effect is 0, negative or not finite (the table shows "–").
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
