"""Evaluation noise (analysis/eval_noise.py): the step-0 SD and what follows from it, by hand; the
records-based SD by hand; the hierarchical bootstrap; problems.parquet through snapshot/load_problems;
the committed table1-mini snapshot against an independent pandas computation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.eval_noise import (hierarchical_diff_ci, k_needed, noise_section, noise_table, problems_from_runs,
                                 records_noise, records_summary, step0_noise)
from analysis.runs import (PROBLEM_COLUMNS, ArmInfo, SweepInfo, load_problems, load_snapshot, normalize_tidy,
                           snapshot)

REPO = Path(__file__).resolve().parent.parent
SNAP = REPO / "results" / "table1-mini" / "snapshot"
METRIC = "eval/x/avg_at_8"


def _tidy(step0: dict[int, float], finals: dict[str, dict[int, float]], arms=("a", "b")) -> pd.DataFrame:
    """Two arms, seeds of ``step0``: the step-0 value (the same for every arm of a seed), then the
    values at rollout steps 5 and 10 (both = the arm's final for that seed)."""
    rows = []
    for arm in arms:
        for seed, v0 in step0.items():
            run = f"{arm}-{seed}"
            for step, v in ((0, v0), (5, finals[arm][seed]), (10, finals[arm][seed])):
                rows.append({"run": run, "run_id": run, "sweep": "t", "arm": arm, "seed": seed,
                             "rollout_step": step, "grad_step": step * 10, "time": float(step),
                             "metric": METRIC, "value": v})
    return normalize_tidy(pd.DataFrame(rows))


SWEEP = SweepInfo(name="t", kind="ladder", arms=(ArmInfo("a"), ArmInfo("b")), metric=METRIC, final_k=2)


# --------------------------------------------------------------------------- step 0, by hand
def test_step0_sd_noise_ratio_and_k_by_hand():
    # step-0 values 10, 12, 14 % → SD 2; diffs of finals (b − a) 0, 4, 8 points → SD 4
    tidy = _tidy({0: 0.10, 1: 0.12, 2: 0.14},
                 {"a": {0: 0.20, 1: 0.20, 2: 0.20}, "b": {0: 0.20, 1: 0.24, 2: 0.28}})
    s0 = step0_noise(tidy, METRIC)
    assert s0.shared and s0.n == 3 and s0.k == 8 and s0.scale == 100 and s0.note == ""
    assert s0.values.tolist() == pytest.approx([10.0, 12.0, 14.0])
    assert s0.mean == pytest.approx(12.0) and s0.sd == pytest.approx(2.0)
    # χ² with 2 df is exponential with mean 2: its q-quantile is −2·ln(1 − q)
    assert s0.lo == pytest.approx(2.0 * math.sqrt(2 / (-2 * math.log(0.025))))
    assert s0.hi == pytest.approx(2.0 * math.sqrt(2 / (-2 * math.log(0.975))))

    t = noise_table(tidy, SWEEP, {}, 2)
    assert len(t) == 1
    r = t.iloc[0]
    assert r["comparison"] == "b vs a" and r["n_pairs"] == 3
    assert r["noise_final"] == pytest.approx(2.0 / math.sqrt(2))          # SD₀/√final_k
    assert r["noise_diff"] == pytest.approx(2.0)                          # √2 × that
    assert r["sd_diff"] == pytest.approx(4.0)
    assert r["ratio"] == pytest.approx(0.5) and r["noise_var_frac"] == pytest.approx(0.25)
    assert r["ratio_lo"] == pytest.approx(s0.lo / 4) and r["ratio_hi"] == pytest.approx(s0.hi / 4)
    # k' = 8·(3·0.5)² = 18, rounded up: 18; as a power of two: 32
    assert r["k_needed_exact"] == pytest.approx(18.0) and r["k_needed"] == 18 and r["k_needed_pow2"] == 32
    assert r["records_n_evals"] == 0 and np.isnan(r["boot_mean"])
    text = "\n".join(noise_section(t))
    assert "## Evaluation noise" in text and "SD₀ 2.00" in text and "k' = 18" in text
    assert "No per-problem records" in text


def test_step0_arms_that_differ_count_separately_and_missing_step0_says_why():
    tidy = _tidy({0: 0.10, 1: 0.12}, {"a": {0: 0.2, 1: 0.2}, "b": {0: 0.2, 1: 0.2}})
    tidy.loc[(tidy["arm"] == "b") & (tidy["seed"] == 1) & (tidy["rollout_step"] == 0), "value"] = 0.16
    s0 = step0_noise(tidy, METRIC)
    assert not s0.shared and "differ" in s0.note
    assert sorted(s0.values.tolist()) == pytest.approx([10.0, 12.0, 16.0])   # seed 0 once, seed 1 twice
    assert s0.sd == pytest.approx(float(np.std([10, 12, 16], ddof=1)))

    later = tidy[tidy["rollout_step"] > 0]
    s1 = step0_noise(later, METRIC)
    assert s1.n == 0 and "no step-0" in s1.note
    assert "no `eval/y/avg_at_4`" in step0_noise(tidy, "eval/y/avg_at_4").note
    t = noise_table(later, SWEEP, {}, 2)
    assert "Not measured from step 0: no step-0 evaluation" in "\n".join(noise_section(t))


def test_k_needed():
    assert k_needed(8, 1.0, 3.0) == (8.0, 8.0, 8.0)
    assert k_needed(8, 1.0, 6.0)[:2] == (2.0, 2.0)
    assert k_needed(32, 0.5, 1.0) == (72.0, 72.0, 128.0)     # 32·1.5² = 72; power of two above: 128
    assert k_needed(8, 0.1, 1.0)[1:] == (1.0, 1.0)            # 0.72 → at least one sample
    assert all(np.isnan(v) for v in k_needed(None, 1.0, 1.0))


# --------------------------------------------------------------------------- records, by hand
def _problems(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=PROBLEM_COLUMNS)


def test_records_sd_by_hand():
    # one evaluation, k = 4: problem 1 has 1 correct, problem 2 has 2 correct
    pr = _problems([("r", "r", "a", 0, 0, 0, "x", "x:0", 1, 4), ("r", "r", "a", 0, 0, 0, "x", "x:1", 2, 4)])
    per = records_noise(pr, 100.0, metric=METRIC)
    assert len(per) == 1
    var = (0.25 * 0.75 / 3 + 0.5 * 0.5 / 3) / 2 ** 2        # Σ p̂(1 − p̂)/(k − 1) / P²
    assert per["sd"].iloc[0] == pytest.approx(100 * math.sqrt(var))   # 19.094...
    assert per["value"].iloc[0] == pytest.approx(37.5) and per["P"].iloc[0] == 2 and per["k"].iloc[0] == 4
    # another eval set is not the metric's
    assert records_noise(pr.assign(set="other"), 100.0, metric=METRIC).empty
    s = records_summary(pd.DataFrame({"run": ["r", "r"], "step": [0, 5], "sd": [3.0, 4.0]}), final_k=1)
    assert s["records_sd"] == pytest.approx(math.sqrt((9 + 16) / 2))
    assert s["records_sd_step0"] == pytest.approx(3.0) and s["records_sd_final"] == pytest.approx(4.0)


def _simulated_problems(n_seeds: int, P: int = 200, k: int = 8, arms=("a",), steps=(0,), effect=0.0,
                        seed: int = 0) -> pd.DataFrame:
    """Problems with fixed success rates p_p ~ Beta(1, 4); every (arm, seed, step) evaluation draws n_correct
    ~ Binomial(k, p_p) (arm "b" gets p_p + effect)."""
    rng = np.random.default_rng(seed)
    p = rng.beta(1, 4, size=P)
    rows = []
    for arm in arms:
        pa = np.clip(p + (effect if arm == "b" else 0.0), 0, 1)
        for s in range(n_seeds):
            for st in steps:
                n = rng.binomial(k, pa)
                rows += [(f"{arm}-{s}", f"{arm}-{s}", arm, s, st, st, "x", f"x:{i}", int(n[i]), k) for i in range(P)]
    return _problems(rows)


def test_records_sd_agrees_with_the_spread_over_seeds_synthetic():
    """The within-evaluation binomial SD estimates the SD of avg@k over evaluation draws, which is what
    the step-0 spread over seeds measures."""
    pr = _simulated_problems(400)
    per = records_noise(pr, 100.0, metric=METRIC)
    over_seeds = per["value"].std(ddof=1)                  # 400 independent step-0 evaluations
    within = records_summary(per, 1)["records_sd_step0"]
    assert within == pytest.approx(over_seeds, rel=0.1)


def test_records_sd_agrees_with_step0_sd_on_real_records():
    """The committed table1-mini snapshot carries the per-problem outcomes of its runs with records
    (seeds 6–9): their step-0 within-evaluation SD lies inside SD₀'s 95% χ² interval (10 seeds), and
    every recorded evaluation's mean correctness is the avg@8 the run logged."""
    tidy, _, sweep = load_snapshot(SNAP)
    s0 = step0_noise(tidy, sweep.metric)
    pr = load_problems(SNAP)
    assert pr is not None and set(pr["seed"]) <= {6, 7, 8, 9} and (pr["k"] == 8).all()
    at0 = pr[pr["step"] == 0]
    within = records_noise(at0, 100.0, metric=sweep.metric)["sd"]
    rms = float(np.sqrt(np.mean(np.square(within))))
    assert s0.lo <= rms <= s0.hi, (rms, s0.sd, s0.lo, s0.hi)
    acc = pr.groupby(["run", "step"]).apply(lambda g: g["n_correct"].sum() / g["k"].sum(), include_groups=False)
    logged = tidy[tidy["metric"] == sweep.metric].set_index(["run", "rollout_step"])["value"]
    joined = acc.rename("rec").to_frame().join(logged.rename_axis(["run", "step"]).rename("log"), how="inner")
    assert len(joined) == len(acc) and np.allclose(joined["rec"], joined["log"], atol=1e-12)


# --------------------------------------------------------------------------- hierarchical bootstrap
def test_hierarchical_bootstrap_reproducible_and_contains_the_paired_mean():
    pr = _simulated_problems(5, P=60, arms=("a", "b"), steps=(0, 5, 10), effect=0.05, seed=3)
    args = (pr, "a", "b", [5, 10])
    m1, lo1, hi1 = hierarchical_diff_ci(*args, n_boot=500, seed=1, metric=METRIC)
    assert (m1, lo1, hi1) == hierarchical_diff_ci(*args, n_boot=500, seed=1, metric=METRIC)
    assert (lo1, hi1) != hierarchical_diff_ci(*args, n_boot=500, seed=2, metric=METRIC)[1:]
    # the plain paired mean of finals: per run, avg@k of each final evaluation, their mean; b − a per seed
    fin = pr[pr["step"].isin([5, 10])].groupby(["arm", "seed", "step"])[["n_correct", "k"]].sum()
    final = (fin["n_correct"] / fin["k"]).groupby(["arm", "seed"]).mean()
    plain = 100 * (final.loc["b"] - final.loc["a"]).mean()
    assert m1 == pytest.approx(plain)
    assert lo1 < plain < hi1
    # the last 2 recorded steps of each run are the same evaluations; a single seed gives no interval
    assert hierarchical_diff_ci(pr, "a", "b", 2, n_boot=500, seed=1, metric=METRIC)[0] == pytest.approx(plain)
    assert all(np.isnan(hierarchical_diff_ci(pr[pr["seed"] == 0], "a", "b", 2, n_boot=50)))


def test_noise_table_with_problems_fills_records_and_bootstrap_columns():
    pr = _simulated_problems(4, P=50, arms=("a", "b"), steps=(0, 5, 10), effect=0.05, seed=4)
    acc = (pr.groupby(["run", "arm", "seed", "step"])["n_correct"].sum() / (50 * 8)).reset_index(name="value")
    tidy = normalize_tidy(acc.assign(run_id=acc["run"], sweep="t", rollout_step=acc["step"], grad_step=acc["step"],
                                     time=0.0, metric=METRIC))
    t = noise_table(tidy, SWEEP, {}, 2, problems=pr, n_boot=300)
    r = t.iloc[0]
    assert r["records_n_evals"] == 24 and r["records_n_step0"] == 8 and r["records_n_final"] == 16
    assert r["boot_n_seeds"] == 4 and r["boot_lo"] <= r["boot_mean"] <= r["boot_hi"]
    fam_mean = 100 * (tidy[(tidy["arm"] == "b") & (tidy["rollout_step"] > 0)].groupby("seed")["value"].mean()
                      - tidy[(tidy["arm"] == "a") & (tidy["rollout_step"] > 0)].groupby("seed")["value"].mean()).mean()
    assert r["boot_mean"] == pytest.approx(fam_mean)
    assert r["noise_diff_records"] == pytest.approx(r["records_sd_final"])          # √(2/2)
    assert "hierarchical bootstrap" in "\n".join(noise_section(t))


# --------------------------------------------------------------------------- problems.parquet
def test_problems_round_trip_through_snapshot_and_records_on_disk(tmp_path):
    from dapo.eval_records import make_record, records_path, write_records
    tidy = _tidy({0: 0.5, 1: 0.25}, {"a": {0: 0.5, 1: 0.5}, "b": {0: 0.5, 1: 0.5}})
    runs_dir = tmp_path / "out"
    for run_id, n_ok in (("a-0", (2, 1)), ("b-1", (0, 2))):      # two runs of four have records
        recs = [make_record(set="x", problem=f"x:{p}", sample=s, step=0, grad_step=0, seed=7, prompt_hash="0",
                            answer="1", correct=s < n_ok[p], length=3, finished=True, response="r")
                for p in range(2) for s in range(2)]
        write_records(records_path(runs_dir / "runs" / run_id, 0), recs)
    pr = problems_from_runs(runs_dir, tidy)
    assert list(pr.columns) == PROBLEM_COLUMNS and len(pr) == 4
    got = pr.set_index(["run_id", "problem"])[["n_correct", "k"]]
    assert got.loc[("a-0", "x:0")].tolist() == [2, 2] and got.loc[("b-1", "x:0")].tolist() == [0, 2]
    assert set(pr["arm"]) == {"a", "b"} and sorted(pr["seed"].unique()) == [0, 1]
    assert problems_from_runs(tmp_path / "empty", tidy) is None

    snap = snapshot(tidy, {}, SWEEP, tmp_path / "snap", problems=pr)
    back = load_problems(snap)
    pd.testing.assert_frame_equal(back, pr)
    assert len(load_snapshot(snap)) == 3                          # the 3-tuple is unchanged
    # a snapshot without records has none, and re-snapshotting without them removes a stale file
    snapshot(tidy, {}, SWEEP, snap)
    assert load_problems(snap) is None
    assert load_problems(REPO / "results" / "table1-mini-v1" / "snapshot") is None   # runs that predate records


# --------------------------------------------------------------------------- the committed snapshot
def test_table1_mini_step0_sd_matches_pandas():
    tidy, _, sweep = load_snapshot(SNAP)
    s0 = step0_noise(tidy, sweep.metric)
    raw = pd.read_parquet(SNAP / "runs.parquet")
    z = raw[(raw["metric"] == sweep.metric) & (raw["rollout_step"] == 0)]
    assert z.groupby("seed")["value"].nunique().eq(1).all()       # every arm of a seed: the same value
    assert z["arm"].nunique() == 6 and z["seed"].nunique() == 10
    by_seed = z.groupby("seed")["value"].first() * 100
    assert s0.shared and s0.n == 10
    assert s0.sd == pytest.approx(by_seed.std(ddof=1), abs=1e-12)
    assert s0.mean == pytest.approx(by_seed.mean(), abs=1e-12)
    assert s0.lo < s0.sd < s0.hi
