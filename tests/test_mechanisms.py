"""analysis.mechanisms: windows and steps-to-accuracy by hand; the table on the committed snapshots."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.mechanisms import format_mechanisms, mechanism_table, next_evaluation, steps_to_reach, window_means
from analysis.runs import load_snapshot

REPO = Path(__file__).resolve().parents[1]


def _tidy(points: dict[tuple[str, int], list[float]], metric: str = "train/entropy") -> pd.DataFrame:
    rows = []
    for (arm, seed), values in points.items():
        for i, v in enumerate(values):
            rows.append({"run": f"{arm}-{seed}", "arm": arm, "seed": seed, "rollout_step": i,
                         "grad_step": 16 * i, "metric": metric, "value": v})
    return pd.DataFrame(rows)


def test_window_means_by_hand_and_step_zero_left_out():
    # steps 0..8; step 0 (before training) is dropped -> 8 steps, a quarter = 2
    t = _tidy({("grpo", 0): [99, 1, 2, 3, 4, 5, 6, 7, 8], ("grpo", 1): [99, 2, 2, 2, 2, 2, 2, 2, 2]})
    w = window_means(t, "train/entropy", "grpo").set_index("seed")
    assert w.loc[0, "first"] == 1.5 and w.loc[0, "last"] == 7.5 and w.loc[0, "all"] == 4.5
    assert w.loc[1].tolist() == [2.0, 2.0, 2.0]
    # a short run: at least one step per window
    w3 = window_means(_tidy({("a", 0): [0, 5, 7]}), "train/entropy", "a")
    assert (w3["first"].item(), w3["last"].item()) == (5.0, 7.0)


def test_steps_to_reach_first_crossing_after_training_or_censored():
    # seed 2 starts above the threshold: the evaluation before training does not count
    t = _tidy({("a", 0): [0.1, 0.2, 0.35, 0.3], ("a", 1): [0.1, 0.1, 0.1, 0.1], ("a", 2): [0.4, 0.1, 0.1, 0.3]},
              metric="eval/x/avg_at_8")
    s = steps_to_reach(t, "eval/x/avg_at_8", "a", 0.3)
    assert s[0] == 32.0 and np.isnan(s[1]) and s[2] == 48.0
    assert next_evaluation(t, "eval/x/avg_at_8", ("a",)) == 64.0     # last (48) + the gap (16)


def test_dynamic_sampling_steps_row_on_the_table1_mini_snapshot():
    """By hand from the snapshot's avg@8 (evaluations every 80 gradient steps, last at 480; 10 seeds): the
    pooled threshold is the mean of the 20 runs' last-quarter means (the last 2 of 6 evaluations after
    step 0), 0.19389; token_loss reaches it only with seeds 3, 7, 9 (at 400, 240, 320), dynamic sampling
    at 400, 240, 160, 240, 160, 80, 160, 80, 160, 240 (seeds 0-9). Never = 560, the next evaluation."""
    from analysis.stats import sign_flip_interval
    tidy, configs, sweep = load_snapshot(REPO / "results" / "table1-mini" / "snapshot")
    row = mechanism_table(tidy, sweep, configs).set_index("mechanism").loc["dynamic sampling"]
    on = np.array([400, 240, 160, 240, 160, 80, 160, 80, 160, 240])
    off = np.array([560, 560, 560, 400, 560, 560, 560, 240, 560, 320])
    diffs = on - off
    assert row.n == 10 and row.value == pytest.approx(diffs.mean()) == -296
    assert row.p == pytest.approx(2 / 2 ** 10)     # 10 differences, all negative
    iv = sign_flip_interval(diffs)
    assert (row.lo, row.hi) == (iv.lo, iv.hi) and row.level == pytest.approx(1 - 50 / 1024)
    assert row.verdict == "acts" and row.predicts == "falls"
    assert "≥ 19.4% (pooled" in row.evidence and "resolution 80 steps" in row.evidence
    assert "7 runs never reach it and count as 560" in row.evidence


def test_steps_to_reach_row_is_unchanged_when_the_arms_swap():
    """The pooled threshold is symmetric in the two arms: swapping which arm has dynamic sampling
    negates the difference and keeps p (the sign-flip test is exact)."""
    tidy, configs, sweep = load_snapshot(REPO / "results" / "table1-mini" / "snapshot")
    row = mechanism_table(tidy, sweep, configs).set_index("mechanism").loc["dynamic sampling"]
    swap = {"token_loss": "dynamic_sampling", "dynamic_sampling": "token_loss"}
    t2 = tidy.assign(arm=tidy["arm"].map(lambda a: swap.get(a, a)))
    c2 = {r: dict(c) for r, c in configs.items()}
    runs = tidy[["run", "arm"]].drop_duplicates().set_index("run")["arm"]
    for r, arm in runs.items():                     # swap the configs with the arms' names
        if arm in swap:
            other = runs[runs == swap[arm]].index[0]
            c2[r] = configs[other]
    back = mechanism_table(t2, sweep, c2).set_index("mechanism").loc["dynamic sampling"]
    assert back.evidence.split(" (pooled")[0] == row.evidence.split(" (pooled")[0]   # the same threshold
    assert back.value == pytest.approx(-row.value) and back.p == pytest.approx(row.p)


@pytest.fixture(scope="module")
def v1():
    snap = REPO / "results" / "table1-mini-v1" / "snapshot"
    tidy, configs, sweep = load_snapshot(snap)
    return mechanism_table(tidy, sweep, configs)


def test_v1_snapshot_reads_as_its_reading_says(v1):
    rows = {(r.mechanism, r.evidence.split(",")[0]): r for r in v1.itertuples()}
    binds = rows[("Clip-Higher binds", "up-clipped tokens at ε_high 0.2")]
    assert binds.value == 0 and binds.verdict == "not shown" and binds.arms == "overlong_filter"
    same = rows[("Clip-Higher → entropy", "train/entropy")]
    assert same.value == 0 and same.p == 1.0 and same.verdict == "too few seeds (3; the test needs 6)"  # 3 seeds
    cost = rows[("dynamic sampling: cost", "generated tokens per rollout step")]
    assert 2.0 < cost.value < 3.0 and cost.verdict == "acts"  # ≈ 2.5x the generation, as the v1 reading says
    spread = rows[("length spread", "longest / mean response length in a batch (acts: > 2)")]
    assert 1.2 < spread.value < 1.6 and spread.verdict == "not shown"  # 20-40 token responses: no spread
    assert set(v1["figure"]) <= {f"fig{i}" for i in range(1, 9)}
    shown = format_mechanisms(v1)
    assert list(shown.columns) == ["mechanism", "evidence", "arm(s)", "value [interval]", "predicts", "p (test)",
                                   "q (BH)", "seeds", "verdict (exploratory)", "figure"]


def test_a_pair_that_changes_several_techniques_says_so():
    """Only the first and the last arm of the v1 ladder (GRPO vs DAPO, as in a two-arm sweep): every
    technique's row compares the same two arms, and its arm(s) cell names what else differs."""
    import dataclasses
    tidy, configs, sweep = load_snapshot(REPO / "results" / "table1-mini-v1" / "snapshot")
    first, last = sweep.arms[0].name, sweep.arms[-1].name
    two = dataclasses.replace(sweep, arms=(sweep.arms[0], sweep.arms[-1]))
    df = mechanism_table(tidy[tidy["arm"].isin([first, last])], two, configs)
    soft = df[df["mechanism"] == "soft punishment"].iloc[0]
    assert soft.arms.startswith(f"{first} → {last} (also differ: ") and "dynamic_sampling" in soft.arms
    assert "soft_punish" not in soft.arms.split("(")[1]          # the row's own technique is not "also"
    exact = mechanism_table(tidy, sweep, configs)                  # the full ladder: one toggle per pair
    assert not exact["arms"].str.contains("also differ").any()
    assert (df.loc[df["arms"].str.contains("also differ") & df["p"].notna()
                   & ~df["mechanism"].str.contains("cost"), "verdict"] == "not isolated").all()
    assert not (exact["verdict"] == "not isolated").any()


def test_successor_rows_read_the_variant_metric_and_its_entropy_change():
    """A one-at-a-time sweep of the table1-mini grpo arm and a copy of it made Clip-Cov (config
    algo.policy_loss = clip_cov): entropy +0.05 at every step of every seed, cov_selected_frac 0.4% +
    0.01% × seed. By hand: "Clip-Cov binds" 0.445 ("acts"), "Clip-Cov → entropy" +0.05
    with all 10 pairs positive, p = 2/2^10, predicted to rise: "acts". As CISPO (no prediction) the
    same change "differs"."""
    import dataclasses

    from analysis.runs import ArmInfo
    tidy, configs, sweep = load_snapshot(REPO / "results" / "table1-mini" / "snapshot")
    base = tidy[tidy["arm"] == "grpo"]
    for kind, verdict in (("clip_cov", "acts"), ("cispo", "differs")):
        copy = base.assign(arm=kind, run=base["run"] + "-" + kind)
        copy.loc[copy["metric"] == "train/entropy", "value"] += 0.05
        own = copy[copy["metric"] == "train/entropy"].assign(
            metric="train/cov_selected_frac" if kind == "clip_cov" else "train/weight_clip_frac")
        own["value"] = 0.004 + 0.0001 * own["seed"]                       # seeds 0-9: mean 0.445%
        t = pd.concat([base, copy, own], ignore_index=True)
        c = {**{r: configs[r] for r in base["run"].unique()},
             **{r + "-" + kind: {**configs[r], "algo": {**configs[r]["algo"], "policy_loss": kind}}
                for r in base["run"].unique()}}
        sw = dataclasses.replace(sweep, kind="one_at_a_time", arms=(sweep.arm("grpo"), ArmInfo(kind)))
        rows = mechanism_table(t, sw, c).set_index("mechanism")
        title = {"clip_cov": "Clip-Cov", "cispo": "CISPO"}[kind]
        ent = rows.loc[f"{title} → entropy"]
        assert ent.value == pytest.approx(0.05) and ent.n == 10 and ent.p == pytest.approx(2 / 2 ** 10)
        assert ent.verdict == verdict and ent.arms == f"grpo → {kind}"
        assert ent.predicts == ("rises" if kind == "clip_cov" else "either way")
        binds = rows.loc[f"{title} binds"]
        assert binds.value == pytest.approx(0.445) and binds.arms == kind
        assert binds.verdict == "acts"                                      # far above 0 and 0.01%, t-test
        assert "GSPO → entropy" not in rows.index                          # no such arm: no row


def test_a_row_with_too_few_seeds_says_so_instead_of_acting():
    """Issue 41: a level 'acted' from 2 seeds. Below 3 seeds a level is not tested, below 6 pairs the exact
    two-sided sign-flip test cannot reach 0.05; the row says which."""
    import pandas as pd

    from analysis.mechanisms import _diff, _level
    two = pd.Series([0.5, 0.6], index=[0, 1])
    assert _level("clip binds", "x", "a", two, "fig3", above=0.1)["verdict"] == "too few seeds (2; the test needs 3)"
    assert _level("clip binds", "x", "a", pd.Series([0.5, 0.6, 0.55]), "fig3", above=0.1)["verdict"] == "acts"
    five = pd.Series([1.0, 2.0, 3.0, 4.0, 5.0])
    assert _diff("e", "x", "a", five * 0, five, "fig2", predicted=1)["verdict"] == "too few seeds (5; the test needs 6)"
    six = pd.Series([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert _diff("e", "x", "a", six * 0, six, "fig2", predicted=1)["verdict"] == "acts"
