"""analysis.stats, the methods behind every verdict: coverage by simulation, the exact sign-flip
interval, Holm and TOST against the libraries and by hand, seeds-needed confirmed by simulating the
test it is for, and the property that no verdict disagrees with its own test."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.stats import (bootstrap_ci, diff_interval, effect_verdict, holm, level_verdict, min_pairs_sign_flip,
                            paired_diff, sd_interval, seeds_needed_sign_flip, sign_flip_interval, sign_flip_p,
                            sign_flip_power, t_interval, tost_p)

REPS = 3000


def _coverage(make, interval, centre, seed: int) -> tuple[float, float]:
    """(share of REPS intervals holding ``centre``, the level they state), data from ``make(rng)``."""
    rng = np.random.default_rng(seed)
    hits, level = 0, np.nan
    for _ in range(REPS):
        iv = interval(make(rng))
        hits += iv.lo <= centre <= iv.hi
        level = iv.level
    return hits / REPS, level


@pytest.mark.parametrize("n", [3, 6, 10])
@pytest.mark.parametrize("noise", ["normal", "exponential", "lognormal"])
def test_the_difference_interval_covers_at_its_stated_level(n, noise):
    """Paired differences b − a with the same skewed noise in both arms are symmetric about Δ: the exact
    sign-flip interval covers at its stated level (75% at 3 pairs, 96.9% at 6, 95.1% at 10), skew or not."""
    draw = {"normal": lambda r, k: r.normal(0, 1, k), "exponential": lambda r, k: r.exponential(1, k),
            "lognormal": lambda r, k: r.lognormal(0, 1, k)}[noise]
    cov, level = _coverage(lambda r: 0.5 + draw(r, n) - draw(r, n), diff_interval, 0.5, seed=n)
    assert level == pytest.approx({3: 0.75, 6: 62 / 64, 10: 1 - 50 / 1024}[n])
    assert abs(cov - level) <= 0.02, (cov, level)


@pytest.mark.parametrize("n", [3, 6, 10])
@pytest.mark.parametrize("noise", ["normal", "gamma10"])
def test_the_t_interval_of_a_level_covers_95(n, noise):
    """A level over seeds (an arm's mean): the Student-t interval, exact for normal values and within
    2 points for mildly skewed ones (gamma, shape 10: skewness 0.63). Strong skew is a known limit
    (docs/STATISTICS.md: lognormal σ = 1 covers ≈ 84%)."""
    make = {"normal": lambda r: r.normal(0.5, 1, n), "gamma10": lambda r: r.gamma(10.0, 1.0, n)}[noise]
    cov, level = _coverage(make, t_interval, {"normal": 0.5, "gamma10": 10.0}[noise], seed=10 + n)
    assert level == 0.95 and abs(cov - 0.95) <= 0.02, cov


def test_the_percentile_bootstrap_over_three_seeds_is_their_range_and_covers_75():
    """Why the tables no longer use it: over 3 seeds the percentile bootstrap is [min, max] (its
    resamples' means cannot leave the range, and the 2.5/97.5 percentiles of 10,000 reach it), which
    covers 75%, not the 95% it was labelled with."""
    v = np.array([8.02, 12.50, 11.38])
    _, lo, hi = bootstrap_ci(v)
    assert (lo, hi) == (8.02, 12.50)              # a resample of three equal values has chance 1/27 > 2.5%
    rng = np.random.default_rng(3)
    hits = sum(lo <= 0 <= hi for lo, hi in (bootstrap_ci(rng.normal(0, 1, 3), n_boot=2000, seed=i)[1:]
                                            for i in range(600)))
    assert 0.70 <= hits / 600 <= 0.82


def test_the_sign_flip_interval_by_hand():
    d = [8.02, 12.50, 11.38]                      # smollm2-mini's DAPO − GRPO, seeds 0-2
    iv = sign_flip_interval(d)
    assert (iv.lo, iv.hi, iv.level, iv.method) == (8.02, 12.50, 0.75, "sign-flip")   # [min, max], 75%
    six = sign_flip_interval([3.0, -1.0, 2.0, 5.0, 0.5, 4.0])
    assert (six.lo, six.hi) == (-1.0, 5.0) and six.level == pytest.approx(1 - 2 / 64)    # n = 6: [min, max], 96.9%
    # n = 4: the 15 subset means of {0, 1, 2, 4}; k = max(1, ⌊0.05·16/2⌋) = 1 → [min, max] at 87.5%
    assert sign_flip_interval([0, 1, 2, 4]).level == 0.875
    # n = 10: k = ⌊0.05·1024/2⌋ = 25, level 1 − 50/1024; the interval lies strictly inside [min, max]
    ten = sign_flip_interval(np.arange(10.0))
    assert ten.level == pytest.approx(1 - 50 / 1024) and 0 < ten.lo < 4.5 < ten.hi < 9
    # its test and its interval agree: 0 outside the interval ⟺ p ≤ 1 − level (n = 6, both from all 64 flips)
    for d6 in ([1, 2, 3, 4, 5, 6.0], [-1, 2, 3, 4, 5, 6.0]):
        iv6, (p, _) = sign_flip_interval(d6), sign_flip_p(d6)
        assert (iv6.lo > 0) == (p <= 0.05)
    t = t_interval([8.02, 12.50, 11.38])
    assert (round(t.lo, 1), round(t.hi, 1)) == (4.8, 16.4)                  # the t-interval
    assert diff_interval(np.arange(20.0)).method == "t"                     # above 16 pairs: Student-t
    assert np.isnan(sign_flip_interval([1.0]).lo) and sign_flip_interval([1.0]).method == "none"


def test_sign_flip_p_equals_scipy_permutation_test():
    from scipy.stats import permutation_test
    rng = np.random.default_rng(0)
    for n in (3, 6, 9):
        d = rng.normal(0.4, 1, n)
        for alt in ("two-sided", "greater", "less"):
            ref = permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                                   alternative=alt, n_resamples=np.inf).pvalue
            assert sign_flip_p(d, alternative=alt)[0] == pytest.approx(ref), (n, alt)


def test_holm_by_hand_and_equals_statsmodels():
    from statsmodels.stats.multitest import multipletests
    # the five ladder steps at 6 seeds: raw 0.188, 0.281, 0.031, 0.094, 0.031
    raw = [0.1875, 0.28125, 0.03125, 0.09375, 0.03125]
    np.testing.assert_allclose(holm(raw), [0.375, 0.375, 0.15625, 0.28125, 0.15625])
    rng = np.random.default_rng(1)
    for _ in range(20):
        p = rng.uniform(0, 0.2, rng.integers(1, 9))
        np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1])
    assert np.isnan(holm([0.01, np.nan])[1]) and holm([0.01, np.nan])[0] == 0.01    # NaN does not count
    # with 6 pairs the exact test cannot survive Holm over 5 (5 · 2/64 > 0.05); with 8 it can (5 · 2/256)
    assert holm([2 / 64] * 5).min() > 0.05 and holm([2 / 256] + [0.5] * 4).min() <= 0.05
    assert min_pairs_sign_flip(0.05 / 5) == 8 and min_pairs_sign_flip(0.05) == 6


def test_tost_by_hand_and_equals_two_scipy_one_sided_tests():
    from scipy.stats import permutation_test
    d = np.array([0.1, -0.1, 0.05, 0.0, 0.02, -0.03])
    # every d + 0.5 > 0 and every d − 0.5 < 0: each one-sided p is 1/64, so p = 1/64
    assert tost_p(d, 0.5) == pytest.approx(1 / 64)
    assert tost_p(d, 0.05) > 0.05                                          # a margin inside the spread: no bound
    assert np.isnan(tost_p(d, None)) and np.isnan(tost_p([], 1.0))
    mean = lambda x, axis: np.mean(x, axis=axis)                         # noqa: E731
    for m in (0.08, 0.12, 0.3):
        lo = permutation_test((d + m,), mean, permutation_type="samples", alternative="greater",
                              n_resamples=np.inf).pvalue
        hi = permutation_test((d - m,), mean, permutation_type="samples", alternative="less",
                              n_resamples=np.inf).pvalue
        assert tost_p(d, m) == pytest.approx(max(lo, hi))
    r = paired_diff({i: 0.0 for i in range(6)}, dict(enumerate(d)), margin=0.5)
    assert r.p_tost == pytest.approx(1 / 64) and effect_verdict(r.mean, r.p, r.p_tost, predicted=1) == "bounded null"


def test_seeds_needed_is_confirmed_by_simulating_the_test():
    """seeds_needed_sign_flip(sd 1, Δ 1) = n: an independent simulation of the exact sign-flip test (other
    draws, every flip enumerated per experiment) has ≥ 80% power at n (within its 1-point error) and less at n − 1."""
    n = seeds_needed_sign_flip(1.0, 1.0)
    assert n == 10
    rng = np.random.default_rng(12345)

    def power(k: int, reps: int = 1500) -> float:
        return float(np.mean([sign_flip_p(rng.normal(1.0, 1.0, k))[0] <= 0.05 for _ in range(reps)]))
    assert power(n) >= 0.78 and power(n - 1) < 0.80
    # the power function: scale-free, rising in the effect, at most the test's floor below 6 pairs
    assert sign_flip_power(5, 10.0) == 0.0                                 # 2/32 > 0.05: can never reject
    assert sign_flip_power(8, 0.5) < sign_flip_power(8, 1.0) < sign_flip_power(8, 2.0)
    assert seeds_needed_sign_flip(2.0, 2.0) == n and seeds_needed_sign_flip(1.0, -1.0) == n
    # at Holm's first step for a family of 5 (α/5) the floor is 8 pairs
    assert seeds_needed_sign_flip(1.0, 10.0, alpha=0.01) == 8
    assert seeds_needed_sign_flip(0.0, 1.0) is None and seeds_needed_sign_flip(1.0, 0.0) is None
    lo, hi = sd_interval(1.0, 6)                                          # χ² with 5 degrees of freedom
    assert (round(lo, 3), round(hi, 3)) == (0.624, 2.453)


_p = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(mean=st.floats(-10, 10, allow_nan=False), p=_p, p_tost=st.one_of(_p, st.just(float("nan"))),
       predicted=st.sampled_from([-1, 1]))
def test_no_verdict_disagrees_with_its_test(mean, p, p_tost, predicted):
    v = effect_verdict(mean, p, p_tost, predicted=predicted, yes="reproduces", no="harms here")
    if p <= 0.05:                                   # rejected: a direction, and the one the data show
        assert v == ("reproduces" if np.sign(mean) == predicted else "harms here")
    elif p_tost <= 0.05:
        assert v == "bounded null"
    else:
        assert v == "inconclusive"
    assert level_verdict(p) == ("acts" if p <= 0.05 else "not shown")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False, allow_infinity=False), min_size=2, max_size=8))
def test_paired_rows_decide_from_their_own_p(d):
    """A paired row's verdict is the verdict of its printed p: never one read off the interval."""
    r = paired_diff({i: 0.0 for i in range(len(d))}, dict(enumerate(d)), margin=1.0)
    v = effect_verdict(r.mean, r.p, r.p_tost, predicted=1)
    assert (v in ("acts", "opposite")) == (r.p <= 0.05)
    assert (v == "bounded null") == (r.p > 0.05 and r.p_tost <= 0.05)


def test_a_sweep_declares_its_own_margins(tmp_path):
    """`margins:` in a sweep spec overrides the default equivalence margin of a metric (the report's
    TOST uses it); a margin that is not positive is one error naming the key."""
    from analysis.metric_names import equivalence_margin
    from analysis.runs import SweepInfo
    from dapo.config import ConfigError
    from dapo.sweep.spec import load_spec, sweep_info
    src = (Path(__file__).resolve().parents[1] / "sweeps" / "clip-higher-stress-mini.yaml").read_text()
    base = str(Path(__file__).resolve().parents[1] / "experiments" / "mini-dapo.yaml")
    spec = tmp_path / "s.yaml"
    spec.write_text(src.replace("base: experiments/mini-dapo.yaml", f"base: {base}")
                    + "margins: {train/entropy: 0.02, eval/arith-eval/avg_at_8: 0.5}\n")
    info = SweepInfo.from_dict(sweep_info(load_spec(spec)))
    assert info.margins == {"train/entropy": 0.02, "eval/arith-eval/avg_at_8": 0.5}
    assert equivalence_margin("train/entropy", info.margins) == 0.02
    assert equivalence_margin("rollout/response_len_mean", info.margins) == 2.0      # the default stays
    assert equivalence_margin("eval/x/avg_at_4") == 1.0 and equivalence_margin("nope") is None
    from analysis.runs import load_snapshot
    from analysis.tables import family_table
    tidy, configs, _ = load_snapshot(Path(__file__).resolve().parents[1] / "results" / "clip-higher-stress-mini"
                                     / "snapshot")
    f = family_table(tidy, info, configs, 2)
    assert f["margin"].tolist() == [0.5]
    spec.write_text(spec.read_text().replace("train/entropy: 0.02", "train/entropy: 0"))
    with pytest.raises(ConfigError, match="margins.train/entropy = 0: an equivalence margin must be > 0"):
        load_spec(spec)


@pytest.mark.parametrize("m, pairs", [(1, 5), (1, 6), (5, 7), (5, 8), (6, 7), (6, 8), (6, 1), (6, 0)])
def test_the_report_says_when_its_seeds_cannot_decide_the_family(m, pairs):
    """"Nothing yet" exactly when even all-positive differences (the most extreme data) cannot reach
    Holm's first-step level α/m with the exact test: the note is about the design, not the data."""
    from analysis.stats import sign_flip_p
    from analysis.tables import decidable_note
    best = sign_flip_p([1.0 + i / 10 for i in range(pairs)])[0] if pairs else float("nan")
    can = np.isfinite(best) and best <= 0.05 / m
    note = decidable_note(m, pairs)
    assert (note == "") == bool(can), (m, pairs, best, note)
    if note:
        assert "nothing yet" in note and "directions, not findings" in note
        assert f"{ {1: 6, 5: 8, 6: 8}[m]} pairs per comparison are the fewest" in note


def test_a_p_below_one_in_a_thousand_is_printed_as_such_never_as_zero():
    """A t-test's p can be 1e-5; "0.000" would claim certainty. Every report table prints p through
    one formatter: 3 decimals, "< 0.001" below, "–" when undefined."""
    import pandas as pd

    from analysis.mechanisms import _level, format_mechanisms
    from analysis.stats import format_p
    assert [format_p(p) for p in (0.0, 4e-4, 0.001, 0.03125, 1.0, float("nan"), None)] == \
        ["< 0.001", "< 0.001", "0.001", "0.031", "1.000", "–", "–"]
    row = _level("off-policy updates", "clipped tokens, %", "grpo", pd.Series([0.48, 0.46, 0.50, 0.47, 0.49, 0.51]),
                 "fig3", above=0.1)
    assert row["p"] < 1e-6
    shown = format_mechanisms(pd.DataFrame([row]))["p (test)"].iloc[0]
    assert shown.startswith("< 0.001 (") and "0.000" not in shown
