"""Paired statistics over seeds (analysis.stats): paired_diff, sign_flip_p, seeds_needed — numbers derived by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.stats import bootstrap_ci, paired_diff, seeds_needed, sign_flip_p


def test_sign_flip_p_by_hand():
    # d = [1, 2, 3]: the 8 sign flips give sums ±6, ±4, ±2, ±0 (twice); |sum| ≥ 6 only for the
    # all-plus and all-minus flips → p = 2/8.
    p, exact = sign_flip_p([1.0, 2.0, 3.0])
    assert exact and p == pytest.approx(0.25)
    # d = [1, −1]: flips give sums 0, ±2, 0 → |mean| ≥ 0 for all 4 → p = 1
    assert sign_flip_p([1.0, -1.0])[0] == 1.0
    # all differences zero: nothing to see, p = 1; one pair: both flips tie → p = 1
    assert sign_flip_p([0.0, 0.0, 0.0])[0] == 1.0 and sign_flip_p([5.0])[0] == 1.0
    # d = [1, 1, 1, 1, −1]: |sum| = 3; sums with |sum| ≥ 3 are the ±5 (2 flips) and ±3 (one of the
    # five signs flipped: 5 + 5 flips) → 12/32
    assert sign_flip_p([1, 1, 1, 1, -1])[0] == pytest.approx(12 / 32)
    assert math.isnan(sign_flip_p([])[0])


def test_sign_flip_p_monte_carlo_above_16_pairs_is_reproducible():
    d = np.r_[np.ones(20), -np.ones(0)]          # 20 positive differences: exact p would be 2/2^20
    p1, exact = sign_flip_p(d, n_perm=2000, seed=3)
    p2, _ = sign_flip_p(d, n_perm=2000, seed=3)
    assert not exact and p1 == p2 and p1 == pytest.approx(1 / 2001, abs=2 / 2001)   # (1 + hits) / (1 + n_perm)
    assert sign_flip_p(np.r_[np.ones(10), -np.ones(10)], n_perm=2000)[0] == 1.0      # mean 0: every flip ties or beats


def test_paired_diff_by_hand_and_drops_unpaired_seeds():
    a = {0: 0.10, 1: 0.20, 2: 0.30, 7: 0.9}        # seed 7 only in a
    b = {0: 0.11, 1: 0.22, 2: 0.33, 9: 0.0}        # seed 9 only in b
    r = paired_diff(a, b)
    assert r.n == 3 and r.seeds == (0, 1, 2) and r.exact
    assert r.mean == pytest.approx(0.02)                       # (0.01 + 0.02 + 0.03) / 3
    assert r.p == pytest.approx(0.25)                          # differences ∝ [1, 2, 3]
    assert r.sd == pytest.approx(0.01)                         # SD of [0.01, 0.02, 0.03]
    _, lo, hi = bootstrap_ci([0.01, 0.02, 0.03])               # the CI is the bootstrap over pairs
    assert (r.lo, r.hi) == pytest.approx((lo, hi))
    # a Series indexed by seed works the same; NaN finals are dropped like missing seeds
    s = paired_diff(pd.Series(a), pd.Series({**b, 2: float("nan")}))
    assert s.n == 2 and s.mean == pytest.approx(0.015)


def test_paired_diff_p_is_one_when_the_differences_cancel():
    r = paired_diff({0: 1.0, 1: 2.0}, {0: 2.0, 1: 1.0})       # d = [+1, −1]
    assert r.mean == 0.0 and r.p == 1.0


def test_swapping_the_arms_negates_the_difference_and_keeps_p():
    rng = np.random.default_rng(1)
    a = dict(enumerate(rng.normal(size=6)))
    b = dict(enumerate(rng.normal(size=6) + 1.0))
    ab, ba = paired_diff(a, b), paired_diff(b, a)
    assert ba.mean == pytest.approx(-ab.mean) and ba.p == pytest.approx(ab.p)
    assert ba.lo == pytest.approx(-ab.hi) and ba.hi == pytest.approx(-ab.lo)
    assert ab.p < 1.0                                          # the check can fail: not trivially 1


def test_paired_diff_without_pairs_is_nan_not_a_crash():
    r = paired_diff({0: 1.0}, {1: 2.0})
    assert r.n == 0 and math.isnan(r.mean) and math.isnan(r.p) and math.isnan(r.sd)
    one = paired_diff({0: 1.0}, {0: 3.0})
    assert one.n == 1 and one.mean == 2.0 and math.isnan(one.sd)
    assert seeds_needed(one.sd, 6.0) is None


def test_seeds_needed_by_hand():
    # sd/Δ = 1, α = 0.05, power 0.8: z_.975 + z_.8 = 1.959964 + 0.841621 = 2.801585; squared 7.849 → n₀ = 8.
    assert seeds_needed(1.0, 1.0, t_ppf=None) == 8 + 1                      # no scipy: n₀ + 1
    # t quantiles (tables): n = 9: t_.975,8 + t_.8,8 = 2.306004 + 0.888918 = 3.194922 → 10.21 > 9;
    # n = 10: t_.975,9 + t_.8,9 = 2.262157 + 0.883034 = 3.145191 → 9.89 ≤ 10 → 10
    table = {(0.975, 7): 2.364624, (0.8, 7): 0.896030, (0.975, 8): 2.306004, (0.8, 8): 0.888918,
             (0.975, 9): 2.262157, (0.8, 9): 0.883034}
    assert seeds_needed(1.0, 1.0, t_ppf=lambda q, df: table[round(q, 3), df]) == 10
    pytest.importorskip("scipy")
    assert seeds_needed(1.0, 1.0) == 10 and seeds_needed(1.0, -1.0) == 10   # the sign of Δ does not matter
    # sd 2, Δ 6 (sd/Δ = 1/3): n = 3: (4.302653 + 1.060660)/3 → 3.197 > 3; n = 4: (3.182446 + 0.978472)/3 → 1.92 ≤ 4
    assert seeds_needed(2.0, 6.0) == 4
    assert seeds_needed(2.0, 6.0, power=0.9) >= seeds_needed(2.0, 6.0)      # more power, more seeds
    # in percentage points: seed SD 1.5 pp, the paper's +6 pp (36 − 30) → n₀ = ⌈7.849/16⌉ → 2, t: 3
    assert seeds_needed(1.5, 36.0 - 30.0) == 3


@pytest.mark.parametrize("sd, effect", [(0.0, 6.0), (1.0, 0.0), (float("nan"), 6.0), (1.0, float("nan")), (-1.0, 1.0)])
def test_seeds_needed_undefined_is_none(sd, effect):
    assert seeds_needed(sd, effect) is None
