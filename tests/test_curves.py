"""Compute curves (analysis/curves.py): the curve by hand, known A, B and C_mid recovered from synthetic runs
within stated tolerances, the refusals, the compute axis cumulated by hand, paired verdicts, the
extrapolation check and the report section on a synthetic sweep."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.curves import (NOT_SATURATED, compare_curves, compute_points, curves_section, extrapolation_table,
                             fit_curve, fit_runs, saturating)
from analysis.runs import ArmInfo, SweepInfo, normalize_tidy

METRIC = "eval/x/avg_at_8"


# --------------------------------------------------------------------------- the curve, by hand
def test_saturating_by_hand():
    # R0 0.2, A 0.6: at C = 0 the start, at C_mid halfway (0.4), at 2·C_mid with B = 1: 0.2 + 0.4 · 2/3
    R = saturating([0.0, 10.0, 20.0, 1e12], 0.2, 0.6, 1.0, 10.0)
    assert R[0] == pytest.approx(0.2)
    assert R[1] == pytest.approx(0.4)
    assert R[2] == pytest.approx(0.2 + 0.4 * 2 / 3)
    assert R[3] == pytest.approx(0.6, abs=1e-9)
    # B = 2 at C = C_mid / 2: (C_mid/C)^B = 4, so a fifth of the rise
    assert saturating([5.0], 0.2, 0.6, 2.0, 10.0)[0] == pytest.approx(0.2 + 0.4 / 5)


# --------------------------------------------------------------------------- recovery
C_GRID = np.r_[0.0, np.linspace(2e4, 3e5, 12)]
TRUE = dict(R0=0.2, A=0.6, B=1.5, C_mid=3e4)


@pytest.mark.parametrize("seed", range(10))
def test_fit_recovers_known_A_B_and_C_mid(seed):
    """13 evaluations (step 0 and 12 to 10×C_mid), noise SD 0.005 (half a point): over 30 seeds the errors'
    SDs are 0.005 (A), 0.017 (log10 C_mid), 6% (B); the tolerances are about 4 SDs."""
    rng = np.random.default_rng(seed)
    R = saturating(C_GRID, **TRUE) + np.r_[0.0, rng.normal(0, 0.005, C_GRID.size - 1)]
    f = fit_curve(C_GRID, R)
    assert f.status == "saturated" and f.reason == ""
    assert f.R0 == pytest.approx(0.2)                        # fixed at the step-0 value
    assert abs(f.A - TRUE["A"]) <= 0.02
    assert abs(math.log10(f.C_mid / TRUE["C_mid"])) <= 0.1
    assert abs(f.B / TRUE["B"] - 1) <= 0.35
    assert f.n_points == 12 and f.c_max == pytest.approx(3e5)
    assert f.frac_end == pytest.approx(1 / (1 + (f.C_mid / 3e5) ** f.B))


def test_a_fit_does_not_depend_on_the_last_digits_of_its_points():
    """Points changed by 1e-13 (what another CPU's float kernels do to a fit) give the same parameters, kept
    to FIT_DIGITS significant digits, so a committed curve table regenerates byte for byte elsewhere."""
    from analysis.curves import FIT_DIGITS
    rng = np.random.default_rng(3)
    R = saturating(C_GRID, **TRUE) + np.r_[0.0, rng.normal(0, 0.005, C_GRID.size - 1)]
    f, g = fit_curve(C_GRID, R), fit_curve(C_GRID, R * (1 + 1e-13))
    assert (f.A, f.B, f.C_mid, f.rmse) == (g.A, g.B, g.C_mid, g.rmse)
    for v in (f.A, f.B, f.rmse):
        assert float(f"{v:.{FIT_DIGITS - 1}e}") == v


def test_fit_recovers_a_falling_curve():
    """A below R0 (a technique that harms) is a curve too: exact points give the parameters back."""
    R = saturating(C_GRID, 0.3, 0.1, 2.0, 5e4)
    f = fit_curve(C_GRID, R)
    assert f.status == "saturated"
    assert f.A == pytest.approx(0.1, abs=1e-4) and f.B == pytest.approx(2.0, rel=1e-3)
    assert f.C_mid == pytest.approx(5e4, rel=1e-3)


# --------------------------------------------------------------------------- refusals
def test_a_curve_that_has_not_bent_is_not_saturated():
    # the same curve seen only up to C_mid / 2: a fifth... of the rise (B 2: 1/(1+4)); the fit cannot know A
    C = np.r_[0.0, np.linspace(2e3, 1.5e4, 8)]
    R = saturating(C, 0.2, 0.6, 2.0, 3e4)
    f = fit_curve(C, R)
    assert f.status == "not saturated"
    assert f.frac_end < 0.8 and "needs 80%" in f.reason


def test_a_straight_line_is_not_saturated():
    C = np.linspace(0, 1e5, 9)
    f = fit_curve(C, 0.2 + 0.3 * C / 1e5)
    assert f.status == "not saturated"


def test_too_few_points_and_flat():
    f = fit_curve([0, 10, 20], [0.2, 0.3, 0.35])
    assert f.status == "too few points" and "2 evaluation(s) after step 0, 3 needed" in f.reason
    assert fit_curve([10, 20, 30], [0.2, 0.3, 0.35]).status == "too few points"   # no step 0: R0 unknown
    flat = fit_curve(C_GRID, np.full(C_GRID.size, 0.2) + np.r_[0, 0.001 * (-1) ** np.arange(C_GRID.size - 1)],
                     flat_rise=0.01, scale=100)
    assert flat.status == "flat" and "below 1" in flat.reason


# --------------------------------------------------------------------------- compute axis
def _tidy(curves: dict[tuple[str, int], tuple[float, float, float, float]], n_steps: int = 30, every: int = 5,
          tokens_per_step: float = 1000.0, noise: float = 0.0) -> pd.DataFrame:
    """Runs (arm, seed) → (R0, A, B, C_mid in generated tokens): each rollout step 1..n_steps logs
    ``tokens_per_step`` generated tokens (16 gradient steps each); the metric is evaluated at rollout 0
    and every ``every`` steps, exactly on the curve (+ normal noise of SD ``noise``)."""
    rows = []
    rng = np.random.default_rng(0)
    for (arm, seed), (R0, A, B, Cm) in curves.items():
        run = f"{arm}-{seed}"
        for r in range(0, n_steps + 1):
            base = {"run": run, "run_id": run, "sweep": "t", "arm": arm, "seed": seed, "rollout_step": r,
                    "grad_step": 16 * r, "time": float(r)}
            if r > 0:
                rows.append({**base, "metric": "sampling/gen_tokens", "value": tokens_per_step})
            if r % every == 0:
                v = float(saturating([r * tokens_per_step], R0, A, B, Cm)[0]) + (rng.normal(0, noise) if r else 0)
                rows.append({**base, "metric": METRIC, "value": v})
    return normalize_tidy(pd.DataFrame(rows))


def test_compute_points_cumulates_generated_tokens_by_hand():
    tidy = _tidy({("a", 0): (0.2, 0.6, 1.0, 5000.0)}, n_steps=10, every=5, tokens_per_step=1000.0)
    p = compute_points(tidy, METRIC, "gen_tokens")
    # evaluations at rollout 0, 5, 10: compute 0, 5 × 1000, 10 × 1000
    assert p["rollout_step"].tolist() == [0, 5, 10]
    assert p["compute"].tolist() == [0.0, 5000.0, 10000.0]
    assert p["value"].tolist() == pytest.approx([0.2, 0.4, 0.2 + 0.4 * 2 / 3])
    g = compute_points(tidy, METRIC, "grad_step")
    assert g["compute"].tolist() == [0.0, 80.0, 160.0]
    with pytest.raises(ValueError, match="axis"):
        compute_points(tidy, METRIC, "flops")


# --------------------------------------------------------------------------- paired verdicts
def _fits(A_off, A_on, C_off, C_on, status_on=None) -> pd.DataFrame:
    rows = []
    for arm, As, Cs in (("a", A_off, C_off), ("b", A_on, C_on)):
        for s, (A, C) in enumerate(zip(As, Cs)):
            st = (status_on or {}).get(s, "saturated") if arm == "b" else "saturated"
            rows.append({"arm": arm, "seed": s, "status": st, "A": A, "B": 2.0, "log10_C_mid": math.log10(C)})
    return pd.DataFrame(rows)


def test_compare_raises_the_ceiling_and_reaches_it_sooner():
    # six seeds, b's A higher by 2–7 points in every one, C_mid half of a's: p = 2/64 both
    A_off = [20.0, 21, 19, 20, 22, 18]
    A_on = [a + d for a, d in zip(A_off, [2, 3, 4, 5, 6, 7])]
    out = compare_curves(_fits(A_off, A_on, [1e4] * 6, [5e3, 4e3, 6e3, 5e3, 5e3, 5e3]), [("b vs a", "a", "b")])
    r = out.iloc[0]
    assert r["pairs"] == 6 and r["saturated_pairs"] == 6
    assert r["dA"] == pytest.approx(4.5) and r["dA_lo"] == pytest.approx(2) and r["dA_hi"] == pytest.approx(7)
    assert r["dA_p"] == pytest.approx(2 / 64) and r["A_verdict"] == "raises the ceiling"
    assert r["dlogC_p"] == pytest.approx(2 / 64) and r["C_verdict"] == "reaches it sooner"
    assert r["dA_q"] == pytest.approx(r["dA_p"])                  # one row: q = p
    # two rows, the second comparing an arm with itself (p = 1): BH q of 2/64 is 2 · 2/64 / 1
    two = compare_curves(_fits(A_off, A_on, [1e4] * 6, [5e3] * 6), [("b vs a", "a", "b"), ("a vs a", "a", "a")])
    assert two["dA_p"].tolist() == pytest.approx([2 / 64, 1.0]) and two["dA_q"].tolist() == pytest.approx([4 / 64, 1.0])
    # swapped: lowers the ceiling, reaches it later
    back = compare_curves(_fits(A_on, A_off, [5e3, 4e3, 6e3, 5e3, 5e3, 5e3], [1e4] * 6), [("a vs b", "a", "b")])
    assert back.iloc[0]["A_verdict"] == "lowers the ceiling" and back.iloc[0]["C_verdict"] == "reaches it later"


def test_compare_bounded_null_and_not_saturated():
    # differences ±0.1 point, margin 1: TOST p = 1/64 each side → bounded null on A and on log C_mid
    A_off = [20.0] * 6
    A_on = [20.1, 19.9, 20.1, 19.9, 20.1, 19.9]
    out = compare_curves(_fits(A_off, A_on, [1e4] * 6, [1e4, 1.01e4, 0.99e4, 1e4, 1.01e4, 0.99e4]),
                         [("b vs a", "a", "b")], margin=1.0)
    assert out.iloc[0]["dA_p_tost"] == pytest.approx(1 / 64)
    assert out.iloc[0]["A_verdict"] == "bounded null" and out.iloc[0]["C_verdict"] == "bounded null"
    # one seed's run not saturated: no verdict, the estimate over the five others only
    out = compare_curves(_fits(A_off, A_on, [1e4] * 6, [1e4] * 6, status_on={2: "not saturated"}),
                         [("b vs a", "a", "b")])
    r = out.iloc[0]
    assert r["saturated_pairs"] == 5 and r["A_verdict"] == NOT_SATURATED and r["C_verdict"] == NOT_SATURATED
    assert r["dA"] == pytest.approx(np.mean([0.1, -0.1, 0.1, -0.1, 0.1 - 0.2]), abs=0.05)


# --------------------------------------------------------------------------- extrapolation and the section
def test_extrapolation_of_exact_curves_has_no_error():
    curves = {("a", s): (0.2, 0.5 + 0.01 * s, 2.0, 6000.0) for s in range(3)}
    tidy = _tidy(curves, n_steps=30, every=3)
    p = compute_points(tidy, METRIC, "gen_tokens")
    ex = extrapolation_table(p, "gen_tokens", 100.0)
    r = ex.iloc[0]
    # first half: rollout 3..15 (5 points; 15k ≤ 30k/2), predicted at 18..30 (5 points) per run
    assert r["runs"] == 3 and r["fitted"] == 3 and r["points"] == 15
    assert abs(r["bias"]) < 0.05 and r["rmse"] < 0.05          # points of %: exact data, exact prediction


def test_curves_section_on_a_synthetic_sweep(tmp_path):
    curves = {("a", s): (0.2, 0.40 + 0.01 * s, 2.0, 6000.0) for s in range(6)}
    curves.update({("b", s): (0.2, 0.45 + 0.01 * s, 2.0, 3000.0) for s in range(6)})
    tidy = _tidy(curves, n_steps=30, every=3, noise=0.002)
    sweep = SweepInfo(name="t", kind="ladder", arms=(ArmInfo("a"), ArmInfo("b")), metric=METRIC, final_k=2)
    lines = curves_section(tidy, sweep, {}, tmp_path)
    text = "\n".join(lines)
    assert "6 of 6" in text and "raises the ceiling" in text and "reaches it sooner" in text
    for f in ("curves.csv", "curve_compare.csv", "curve_extrapolation.csv", "figures/fig_curves.png"):
        assert (tmp_path / f).exists(), f
    fits = pd.read_csv(tmp_path / "curves.csv")
    assert (fits["status"] == "saturated").all()
    b = fits[fits["arm"] == "b"].sort_values("seed")
    assert np.abs(b["A"].to_numpy() - (45 + np.arange(6))).max() < 1.0       # points of %
    assert np.abs(b["log10_C_mid"].to_numpy() - math.log10(3000)).max() < 0.1


def test_fit_runs_units():
    tidy = _tidy({("a", 0): (0.2, 0.6, 2.0, 6000.0)}, n_steps=30, every=3)
    f = fit_runs(compute_points(tidy, METRIC, "gen_tokens"), "gen_tokens", 100.0).iloc[0]
    assert f["R0"] == pytest.approx(20.0) and f["A"] == pytest.approx(60.0, abs=0.01)
    assert f["log10_C_mid"] == pytest.approx(math.log10(6000), abs=1e-3)
