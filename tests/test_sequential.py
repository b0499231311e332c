"""The stopping rule (analysis.sequential): exact size over looks, valid repeated p-values, Holm on top."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.sequential import (LEVEL_GRID, _signs, boundaries, look_pvalues, repeated_p, sequential_family,
                                 sequential_test, simulate_size, spent)
from analysis.stats import sign_flip_p


def _conditional_size(sizes, looks, spending, u=0.05, naive=False):
    """Exact P_H0(reject at some look) given the sizes: every sign vector, the rule as the report runs it."""
    n = looks[-1]
    fr = tuple(x / n for x in looks)
    P, _ = look_pvalues(np.abs(sizes), looks)
    c = np.full(len(looks), u) if naive else boundaries(P, fr, u, spending)
    return float((P <= c + 1e-12).any(axis=1).mean())


@pytest.mark.parametrize("spending", ["pocock", "obrien_fleming"])
def test_the_rule_keeps_its_level_exactly_given_the_sizes(spending):
    rng = np.random.default_rng(0)
    for _ in range(3):
        sizes = rng.standard_normal(10)
        assert _conditional_size(sizes, (6, 10), spending) <= 0.05 + 1e-12
        assert _conditional_size(sizes, (4, 7, 10), spending) <= 0.05 + 1e-12


def test_testing_every_look_at_the_nominal_level_does_not():
    """What the rule prevents: two looks each at 0.05 reject more than 5% of the time under H0."""
    sizes = np.random.default_rng(0).standard_normal(12)
    assert _conditional_size(sizes, (6, 9, 12), "pocock", naive=True) > 0.08   # 0.088: "add seeds while inconclusive"


def test_spending_functions_spend_alpha_by_the_last_look():
    for s in ("pocock", "obrien_fleming"):
        assert spent(1.0, 0.05, s) == pytest.approx(0.05)
        assert spent(0.5, 0.05, s) < 0.05
    assert spent(0.5, 0.05, "obrien_fleming") < spent(0.5, 0.05, "pocock")   # O'Brien–Fleming keeps α for the end
    assert spent(0.5, 0.05, "obrien_fleming") == pytest.approx(2 - 2 * 0.99721, abs=2e-5)   # z = 1.96/√0.5 = 2.772


def test_one_look_gives_the_fixed_test_p_rounded_up_to_the_level_grid():
    d = np.array([0.4, 1.2, -0.3, 0.8, 0.9, 1.1, 0.2, 0.7])
    exact, _ = sign_flip_p(d)
    r = sequential_test(d, (8,), "pocock")
    above = LEVEL_GRID[LEVEL_GRID >= exact - 1e-12]
    assert exact <= r.p <= above[0] + 1e-12
    assert r.look == 1 and not r.unplanned


def test_repeated_p_is_a_valid_p_value_over_every_sign_vector():
    """P(p_rep ≤ u) ≤ u for u = 0.05 and 0.0167 (Holm's levels), exactly, given the sizes."""
    sizes = np.abs(np.random.default_rng(3).standard_normal(8))
    looks, fr = (5, 8), (5 / 8, 1.0)
    P, _ = look_pvalues(sizes, looks)
    ps = []
    for s in _signs(8):
        _, obs = look_pvalues(s * sizes, looks)
        ps.append(repeated_p(P, obs, fr, "pocock")[0])
    ps = np.array(ps)
    for u in (0.05, 0.05 / 3):
        assert (ps <= u + 1e-12).mean() <= u + 1e-12


def test_family_error_under_the_global_null_by_simulation():
    """Three comparisons, Holm over repeated p, both looks always taken: FWER ≤ α (+ 3 simulation SEs)."""
    size = simulate_size((5, 8), "pocock", m=3, n_sim=300, seed=1)
    assert size <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 300)


def test_a_clear_effect_is_decided_at_the_first_look_and_an_unplanned_look_is_flagged():
    d = np.full(12, 1.0) + np.linspace(0, 0.1, 12)
    fam = sequential_family([d[:10], np.r_[d[:5], -d[5:10]]], (8, 10), "pocock", margin=0.5)
    assert fam[0]["look"] == 1 and fam[0]["decided"] and fam[0]["p_seq_holm"] <= 0.05
    assert not fam[1]["decided"]
    r = sequential_test(d, (6, 10), "pocock")
    assert r.unplanned and r.looks_done == (6, 10, 12)
    # pairs between looks: only the completed look is used
    r = sequential_test(d[:8], (6, 10), "pocock")
    assert r.looks_done == (6,) and not r.unplanned


def test_a_missing_seed_ends_the_usable_prefix():
    d = np.array([1.0, 1.1, 0.9, np.nan, 1.2, 1.0, 1.1])
    assert sequential_test(d, (3, 6), "pocock").n == 3
