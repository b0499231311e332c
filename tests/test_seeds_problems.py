"""Seeds × problems (analysis/seeds_problems.py): the crossed ANOVA by hand and against statsmodels, the cells
and their binomial noise by hand, the generalising interval's coverage by simulation, the n × k planner by
hand, the report section on the committed staleness-mini snapshot."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as t_dist

from analysis.runs import PROBLEM_COLUMNS, normalize_problems, normalize_tidy
from analysis.seeds_problems import (PLAN_KS, cell_matrix, coverage_simulation, crossed_anova, plan_nk,
                                     problem_effects, run_costs)
from analysis.stats import seeds_needed

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the crossed ANOVA
def test_crossed_anova_by_hand():
    # S = 3 seeds × P = 2 problems. Grand mean 2; seed means 1, 1, 4; problem means 2, 2.
    # MS_seed = 2·(1 + 1 + 4)/2 = 6; MS_problem = 0; residuals ±1, ±1, 0, 0 → MS_resid = 4/2 = 2.
    D = np.array([[0.0, 2.0], [2.0, 0.0], [4.0, 4.0]])
    f = crossed_anova(D, np.full((3, 2), 0.5))
    assert (f.S, f.P) == (3, 2) and f.mean == pytest.approx(2.0)
    assert (f.ms_seed, f.ms_problem, f.ms_resid) == pytest.approx((6.0, 0.0, 2.0))
    assert f.var_seed == pytest.approx((6 - 2) / 2) and f.var_problem == 0.0      # (0 − 2)/3 truncated
    # σ²_problem truncated: S·P·Var(μ̂) = MS_seed alone = 6, Var = 1, Satterthwaite df = 6²/(6²/2) = 2
    assert f.se == pytest.approx(1.0) and f.df == pytest.approx(2.0)
    q = t_dist.ppf(0.975, 2)                                                      # 4.303
    assert (f.lo, f.hi) == pytest.approx((2 - q, 2 + q))
    assert (f.lo_fixed, f.hi_fixed) == pytest.approx((2 - q, 2 + q))              # √(6/6) on S − 1 = 2 df
    assert f.f_problem_p == pytest.approx(1.0)
    # eval share: v̄ / MS_seed = 0.5/6; training variance of a per-seed difference (6 − 0.5)/2
    assert f.eval_share == pytest.approx(0.5 / 6) and f.var_train == pytest.approx(2.75)


def test_crossed_anova_both_components_and_satterthwaite():
    # seed means 0, 2 and problem means 0, 1, 5 with residual ±1 on the corners:
    D = np.array([[0, 0, 4], [2, 2, 6]], dtype=float) + np.array([[1, -1, 0], [-1, 1, 0]], dtype=float)
    f = crossed_anova(D)
    # grand 2.333; MS_seed = 3·2·1²/1 = 6; MS_problem = 2·((−1.333)² + (−1.333)² + 2.667²)/2 = 10.667;
    # residuals ±1 (4 cells), 0 (2) → MS_resid = 4/2 = 2
    assert (f.ms_seed, f.ms_problem, f.ms_resid) == pytest.approx((6.0, 32 / 3, 2.0))
    total = 6 + 32 / 3 - 2                                                       # S·P·Var(μ̂)
    assert f.se == pytest.approx(math.sqrt(total / 6))
    assert f.df == pytest.approx(total ** 2 / (6 ** 2 / 1 + (32 / 3) ** 2 / 2 + 2 ** 2 / 2))
    assert math.isnan(f.eval_share)                                               # no V given


def test_mean_squares_equal_statsmodels_anova_lm():
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm
    rng = np.random.default_rng(3)
    D = rng.normal(size=(5, 7)) + rng.normal(size=(5, 1)) + rng.normal(size=(1, 7))
    f = crossed_anova(D)
    long = pd.DataFrame([(s, p, D[s, p]) for s in range(5) for p in range(7)], columns=["seed", "problem", "d"])
    a = anova_lm(smf.ols("d ~ C(seed) + C(problem)", long).fit())
    assert f.ms_seed == pytest.approx(a.loc["C(seed)", "mean_sq"])
    assert f.ms_problem == pytest.approx(a.loc["C(problem)", "mean_sq"])
    assert f.ms_resid == pytest.approx(a.loc["Residual", "mean_sq"])
    assert f.f_problem_p == pytest.approx(a.loc["C(problem)", "PR(>F)"])


def test_too_small_a_matrix_has_no_fit():
    assert crossed_anova(np.ones((1, 5))) is None and crossed_anova(np.ones((4, 1))) is None


# --------------------------------------------------------------------------- cells, by hand
def _rows(spec):
    """spec: {(arm, seed, problem): [n_correct per final evaluation]}, k = 4, evaluations at steps 25, 30."""
    rows = []
    for (arm, seed, prob), ns in spec.items():
        for step, n in zip((25, 30), ns):
            rows.append((f"{arm}-{seed}", f"{arm}-{seed}", arm, seed, step, step * 16, "x", prob, n, 4))
    return normalize_problems(pd.DataFrame(rows, columns=PROBLEM_COLUMNS))


def test_cell_matrix_by_hand():
    spec = {("a", 0, "p1"): [1, 3], ("b", 0, "p1"): [4, 4], ("a", 0, "p2"): [0, 0], ("b", 0, "p2"): [2, 2],
            ("a", 1, "p1"): [2, 2], ("b", 1, "p1"): [2, 4], ("a", 1, "p2"): [4, 4], ("b", 1, "p2"): [0, 4],
            ("b", 2, "p1"): [4, 4]}                                      # seed 2 has one arm: dropped
    D, V, seeds, probs = cell_matrix(_rows(spec), "a", "b")
    assert seeds == [0, 1] and probs == ["p1", "p2"]
    # seed 0: p1 b 1.0 − a (0.25 + 0.75)/2 = 0.5; p2 0.5 − 0 = 0.5. seed 1: p1 0.75 − 0.5; p2 0.5 − 1.0
    assert D.ravel().tolist() == pytest.approx([0.5, 0.5, 0.25, -0.5])
    # V: per evaluation p̂(1 − p̂)/3, summed over the 2 evaluations / 2², both arms summed.
    # seed 0 p1: a (0.1875/3 + 0.1875/3)/4 = 0.03125, b 0 → 0.03125; p2: a 0, b (0.25/3·2)/4 = 0.041667
    # seed 1 p1: a (0.25/3·2)/4, b (0.25/3 + 0)/4 → 0.041667 + 0.020833; p2: a 0, b (0 + 0)/4 = 0
    assert V.ravel().tolist() == pytest.approx([0.03125, 0.25 / 6, 0.25 / 6 + 0.25 / 12, 0.0])


def test_problem_effects_flag_only_with_evidence():
    rng = np.random.default_rng(0)
    D = rng.normal(0, 0.1, size=(10, 40))
    D[:, :3] += 1.0                                                  # three problems carry a large effect
    eff = problem_effects(D, [f"p{j}" for j in range(40)], crossed_anova(D))
    leads = set(eff.loc[eff["lead"], "problem"])
    assert leads == {"p0", "p1", "p2"}
    assert eff.loc[eff["problem"] == "p0", "p"].iloc[0] == pytest.approx(2 / 1024)   # all 10 seeds agree
    assert eff["mean"].is_monotonic_increasing


# --------------------------------------------------------------------------- coverage, by simulation
def test_generalising_interval_covers_at_its_level():
    """6 seeds × 200 problems, k = 8, 2 final evaluations, σ_seed 2, σ_problem 5, σ_interaction 5 points:
    2,000 simulated experiments; 95% stated, within 2 points (Monte Carlo SE 0.5)."""
    r = coverage_simulation(2000, 6, 200, seed=11)
    assert abs(r["generalising"] - 0.95) <= 0.02, r


def test_problems_fixed_interval_undercovers_when_problems_vary():
    """10 seeds × 100 problems with σ_problem 10 points and σ_seed 1: the problem set is one draw, so the
    seed-level interval (problems fixed) misses the population's μ; the generalising one does not."""
    r = coverage_simulation(1000, 10, 100, sd_seed=0.01, sd_problem=0.10, seed=12)
    assert abs(r["generalising"] - 0.95) <= 0.025, r
    assert r["fixed"] < 0.85, r


# --------------------------------------------------------------------------- the n × k planner
def test_plan_nk_by_hand():
    # var_train 0.5 and eval 0.5 at k0 = 8: at k = 8 the SD is 1, and the sign-flip test needs 10 pairs for
    # Δ = 1 SD (docs/STATISTICS.md: seeds_needed_sign_flip(1, 1) = 10); a run costs 100 + 20·k/8
    plan = plan_nk(0.5, 0.5, 8, 1.0, 100.0, 20.0, ks=(1, 8, 16, 64)).set_index("k")
    assert list(plan.index) == [1, 8, 16, 64] and PLAN_KS == (1, 2, 4, 8, 16, 32, 64)
    assert plan.loc[8, "sd"] == pytest.approx(1.0) and plan.loc[8, "seeds"] == 10
    assert plan.loc[8, "cost_per_run"] == pytest.approx(120.0) and plan.loc[8, "cost"] == pytest.approx(2 * 10 * 120)
    assert plan.loc[16, "sd"] == pytest.approx(math.sqrt(0.75)) and plan.loc[16, "cost_per_run"] == pytest.approx(140)
    assert plan.loc[64, "cost_per_run"] == pytest.approx(260.0)
    # k = 1: SD √4.5 = 2.12; the t-test needs > 35 pairs, so the count is the t-test's
    n1 = seeds_needed(math.sqrt(4.5), 1.0)
    assert n1 > 35 and plan.loc[1, "seeds"] == n1 and plan.loc[1, "cost"] == pytest.approx(2 * n1 * 102.5)
    assert plan["cheapest"].sum() == 1 and plan.loc[plan["cost"].idxmin(), "cheapest"]
    # SD never falls below the training part: at k → ∞ it would be √0.5
    assert (plan["sd"] > math.sqrt(0.5)).all()


def test_run_costs_by_hand():
    rows = []
    for run, arm, step_s, ev in (("r1", "a", [10.0, 12.0], [5.0, 0.0, 6.0]), ("r2", "b", [20.0, 20.0], [5.0, 0.0, 5.0])):
        for r in range(3):
            base = {"run": run, "run_id": run, "sweep": "t", "arm": arm, "seed": 0, "rollout_step": r, "grad_step": r,
                    "time": float(r)}
            rows.append({**base, "metric": "time/eval_s", "value": ev[r]})
            if r:
                rows.append({**base, "metric": "time/step_s", "value": step_s[r - 1]})
    tidy = normalize_tidy(pd.DataFrame(rows))
    cfg = {"r1": {"train": {"threads": 2}}, "r2": {"train": {"threads": 1}}}
    # r1: loop 10 + 12 + 5 (step-0 evaluation) = 27 s × 2 threads = 54, of which evaluation (5 + 6) × 2 = 22
    # r2: loop 45 × 1, evaluation 10 → training 35
    train, ev = run_costs(tidy, cfg, ["a", "b"])
    assert train == pytest.approx((54 - 22 + 35) / 2) and ev == pytest.approx((22 + 10) / 2)


# --------------------------------------------------------------------------- the section on a committed sweep
@pytest.mark.slow
def test_section_on_staleness_mini(tmp_path):
    """The committed staleness-mini snapshot (6 seeds × 200 problems of records): ~25 s on 2 busy cores,
    most of it the planner's sign-flip power simulations."""
    from analysis.runs import load_problems, load_snapshot
    from analysis.seeds_problems import seeds_problems_section
    snap = REPO / "results" / "staleness-mini" / "snapshot"
    tidy, cfg, sweep = load_snapshot(snap)
    lines = seeds_problems_section(tidy, sweep, cfg, load_problems(snap), tmp_path)
    text = "\n".join(lines)
    assert "6 × 200" in text and "Seeds × samples per problem for 80% power" in text
    for f in ("seeds_problems.csv", "problem_effects.csv", "plan_nk.csv", "figures/fig_problems.png"):
        assert (tmp_path / f).exists(), f
    t = pd.read_csv(tmp_path / "seeds_problems.csv").iloc[0]
    assert t["seeds"] == 6 and t["problems"] == 200 and t["lo"] < t["mean"] < t["hi"]
    assert 0 < t["eval_share"] < 1 and t["eval_share_lo"] < t["eval_share"] < t["eval_share_hi"]
    plan = pd.read_csv(tmp_path / "plan_nk.csv")
    assert sorted(plan["delta"].unique()) == [1.0, 2.0, 5.0] and plan.groupby("delta")["cheapest"].sum().eq(1).all()
