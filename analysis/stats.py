"""Seed statistics: percentile bootstrap over seeds, bands for curves, final values.

Every interval here is a percentile bootstrap of the mean over seeds (runs), drawn with
``numpy.random.default_rng(seed)`` so the numbers are reproducible.
:func:`seed_band` computes, for every x, exactly what :func:`bootstrap_ci` computes on that
x's seed values (same seed, same resamples), only vectorized over x.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

__all__ = ["bootstrap_ci", "seed_band", "run_finals", "per_run_curve"]


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
