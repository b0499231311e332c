"""analysis.learning: the change over training per arm, by hand, and in the report."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.learning import format_learning, learning_table
from analysis.runs import ArmInfo, SweepInfo


def _tidy(points: dict[tuple[str, int, str], list[float]]) -> pd.DataFrame:
    """{(arm, seed, metric): values at rollout steps 0, 1, ...} → a tidy frame (8 grad steps per rollout step)."""
    rows = [{"run": f"{arm}-{seed}", "arm": arm, "seed": seed, "rollout_step": i, "grad_step": 8 * i,
             "metric": metric, "value": v}
            for (arm, seed, metric), values in points.items() for i, v in enumerate(values)]
    return pd.DataFrame(rows)


EV = "eval/x/avg_at_4"


def test_learning_by_hand():
    # evaluations at rollout steps 0 (before training), 1, 2
    t = _tidy({("grpo", 0, EV): [0.20, 0.30, 0.40], ("grpo", 1, EV): [0.20, 0.25, 0.30],
               ("dapo", 0, EV): [0.20, 0.10, 0.10], ("dapo", 1, EV): [0.20, 0.20, 0.15],
               # reward at rollout steps 1..8 (step 0 has none): quarters = steps 1-2 and 7-8
               ("grpo", 0, "rollout/reward_mean"): [float("nan"), -1, -1, 0, 0, 0, 0, 1, 1],
               ("grpo", 1, "rollout/reward_mean"): [float("nan"), -1, 0, 0, 0, 0, 0, 0, 1]})
    t = t.dropna()
    sweep = SweepInfo(name="s", kind="ladder", arms=[ArmInfo("grpo", "naive GRPO"), ArmInfo("dapo", "DAPO")])
    df = learning_table(t, sweep, final_k=2)
    g = df[(df["arm"] == "grpo") & df["evidence"].str.startswith(EV)].iloc[0]
    # seed 0: mean(0.30, 0.40) - 0.20 = 0.15; seed 1: mean(0.25, 0.30) - 0.20 = 0.075 -> points
    assert g["start"] == pytest.approx(20.0) and g["end"] == pytest.approx(31.25)
    assert g["value"] == pytest.approx(11.25) and g["n"] == 2
    # 2 seeds: the sign-flip interval is [min, max] at level 1 − 2/4 = 50%, and p cannot go below 0.5
    assert g["lo"] == pytest.approx(7.5) and g["hi"] == pytest.approx(15.0) and g["p"] == pytest.approx(0.5)
    assert g["level"] == 0.5 and g["method"] == "sign-flip" and g["verdict"] == "too few seeds (2; the test needs 6)"
    d = df[(df["arm"] == "dapo") & df["evidence"].str.startswith(EV)].iloc[0]
    # seed 0: mean(0.10, 0.10) - 0.20 = -0.10; seed 1: mean(0.20, 0.15) - 0.20 = -0.025
    assert d["value"] == pytest.approx(-6.25) and d["hi"] < 0 and d["verdict"].startswith("too few seeds")
    r = df[(df["arm"] == "grpo") & (df["evidence"].str.startswith("rollout/reward_mean"))].iloc[0]
    # seed 0: last (1+1)/2 - first (-1-1)/2 = 2; seed 1: (0+1)/2 - (-1+0)/2 = 1 -> raw reward units
    assert (r["start"], r["end"], r["value"]) == pytest.approx((-0.75, 0.75, 1.5))
    assert list(df["arm"]) == ["grpo", "grpo", "dapo"]                  # no reward logged for dapo: no row
    shown = format_learning(df)
    assert shown["arm"].tolist()[0] == "naive GRPO"
    assert shown["verdict (exploratory)"].tolist() == ["too few seeds (2; the test needs 6)"] * 3   # 2 seeds decide nothing
    assert shown["start → end"].tolist()[0] == "20.0 → 31.2"   # 31.25, rounded half to even
