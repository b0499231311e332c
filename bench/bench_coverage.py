"""Coverage of the report's intervals, by simulation: the table in docs/STATISTICS.md.

    python -m bench.bench_coverage [--reps 3000] [--seed 0]
    python -m bench.bench_coverage --asymmetric [--reps 1000]   # what breaks without symmetric differences

For each method and data shape, the share of simulated experiments whose interval holds the true
value, at n = 3, 6 and 10 seeds, beside the level the method states. Deterministic for a seed.
"""
from __future__ import annotations

import argparse

import numpy as np

from analysis.stats import bootstrap_ci, diff_interval, interval_label, sign_flip_p, t_interval

NS = (3, 6, 10)
DIFFS = {  # paired differences: the same noise in both arms, true mean difference 0.5
    "normal differences": lambda r, n: r.normal(0.5, 1, n),
    "exponential noise in both arms": lambda r, n: 0.5 + r.exponential(1, n) - r.exponential(1, n),
    "lognormal noise in both arms": lambda r, n: 0.5 + r.lognormal(0, 1, n) - r.lognormal(0, 1, n),
}
ASYMMETRIC = {  # paired differences that are not symmetric about their mean 0.5
    "skewed noise in one arm only (exponential − 1 vs normal SD 0.3)":
        lambda r, n: 0.5 + (r.exponential(1, n) - 1) - r.normal(0, 0.3, n),
    "a seed-varying effect: a collapse (−1.5) in 1 of 5 seeds, else +1":
        lambda r, n: np.where(r.random(n) < 0.2, -1.5, 1.0) + r.normal(0, 0.3, n),
}
LEVELS = {  # one arm's values and their true mean
    "normal levels": (lambda r, n: r.normal(0.5, 1, n), 0.5),
    "gamma (shape 10) levels": (lambda r, n: r.gamma(10.0, 1.0, n), 10.0),
    "gamma (shape 4) levels": (lambda r, n: r.gamma(4.0, 1.0, n), 4.0),
    "lognormal (σ 1) levels": (lambda r, n: r.lognormal(0, 1, n), float(np.exp(0.5))),
}


def coverage(make, interval, truth: float, n: int, reps: int, seed: int) -> tuple[float, str]:
    """(share of intervals holding truth, the stated level and method) over reps experiments."""
    rng = np.random.default_rng(seed)
    hits, label = 0, ""
    for _ in range(reps):
        lo, hi, label = interval(make(rng, n))
        hits += lo <= truth <= hi
    return hits / reps, label


def _diff(v):
    iv = diff_interval(v)
    return iv.lo, iv.hi, interval_label(iv.method, iv.level)


def _t(v):
    iv = t_interval(v)
    return iv.lo, iv.hi, interval_label(iv.method, iv.level)


def _boot(v):
    _, lo, hi = bootstrap_ci(v, n_boot=2000)
    return lo, hi, "95% percentile bootstrap"


def size(make, n: int, reps: int, seed: int, shift: float = 0.5) -> float:
    """Share of experiments whose two-sided exact sign-flip p ≤ 0.05 when the true mean is 0 (make − shift)."""
    rng = np.random.default_rng(seed)
    return sum(sign_flip_p(make(rng, n) - shift)[0] <= 0.05 for _ in range(reps)) / reps


def asymmetric(reps: int, seed: int) -> None:
    """The sign-flip interval's coverage of the mean, and the test's size for 'mean 0', without symmetry."""
    print("| data (paired differences) | coverage of the mean: " + " | ".join(f"n = {n}" for n in NS)
          + " | rejects 'mean 0' when it is true: " + " | ".join(f"n = {n}" for n in NS) + " |")
    print("|---|" + "---:|" * (2 * len(NS)))
    for name, make in {"normal differences": DIFFS["normal differences"], **ASYMMETRIC}.items():
        cov = [coverage(make, _diff, 0.5, n, reps, seed + n) for n in NS]
        sz = [size(make, n, reps, seed + 100 + n) for n in NS]
        print(f"| {name} | " + " | ".join(f"{c:.1%} (states {lab.split(' ')[0]})" for c, lab in cov) + " | "
              + " | ".join(f"{x:.1%}" for x in sz) + " |")
    print(f"\n{reps} simulated experiments per cell, seed {seed}; the test's nominal size is 5% "
          f"(at n = 3 it cannot reject).")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3000, help="simulated experiments per cell (default 3000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--asymmetric", action="store_true",
                    help="coverage and size when the differences are not symmetric (docs/STATISTICS.md)")
    a = ap.parse_args(argv)
    if a.asymmetric:
        asymmetric(a.reps, a.seed)
        return 0
    print(f"| method | data | " + " | ".join(f"n = {n}" for n in NS) + " |")
    print("|---|---|" + "---:|" * len(NS))
    cases = ([("sign-flip interval", name, make, 0.5, _diff, a.reps) for name, make in DIFFS.items()]
             + [("Student-t", name, make, truth, _t, a.reps) for name, (make, truth) in LEVELS.items()]
             + [("percentile bootstrap", name, make, truth, _boot, max(1, a.reps // 5))
                for name, (make, truth) in list(LEVELS.items())[::3]])
    for method, name, make, truth, fn, reps in cases:
        cells = [coverage(make, fn, truth, n, reps, a.seed + n) for n in NS]
        print(f"| {method} | {name} | " + " | ".join(f"{c:.1%} (states {lab.split(' ')[0]})" for c, lab in cells)
              + " |")
    print(f"\n{a.reps} simulated experiments per cell ({max(1, a.reps // 5)} for the bootstrap), seed {a.seed}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
