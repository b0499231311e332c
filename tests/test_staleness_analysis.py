"""A declared primary family (`family:` in a sweep spec), DAPO's gain in each setting and the off-policyness
rows of the mechanisms table: by hand on a small made-up sweep (GRPO and DAPO at staleness 0 and 1)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.runs import ArmInfo, SweepInfo

REPO = Path(__file__).resolve().parents[1]
METRIC = "eval/x/avg_at_8"
GRPO = {"algo.clip.eps_high": 0.2, "algo.loss_agg": "seq_mean_token_mean", "algo.overlong.filter": False,
        "algo.overlong.soft_punish": False, "algo.dynamic_sampling.enabled": False}
DAPO = {"algo.clip.eps_high": 0.28, "algo.loss_agg": "token_mean", "algo.overlong.filter": False,
        "algo.overlong.soft_punish": True, "algo.dynamic_sampling.enabled": True}
BASE = {"algo.clip.eps_low": 0.2, "algo.old_logprobs": "trainer", "train.staleness": 0}
GRPO_0 = [0.10, 0.12, 0.11, 0.13, 0.10, 0.12]          # final avg@8 per seed 0..5
GAIN_0 = [0.02, 0.03, 0.01, 0.02, 0.04, 0.02]          # DAPO − GRPO at staleness 0
GAIN_1 = [0.01, 0.01, 0.01, 0.02, 0.01, 0.01]          # ... at staleness 1
K3 = {"grpo": 1.0, "dapo": 1.0, "grpo_s1": 3.0, "dapo_s1": 2.0, "dapo_s1_bypass": 2.0, "dapo_s1_tis": 2.0}   # × 1e-5 + seed/1e6


def _arm(name: str, algo: dict, **extra) -> ArmInfo:
    return ArmInfo(name=name, label=name, overrides={**BASE, **algo, **extra})


def _sweep(family=()) -> SweepInfo:
    return SweepInfo(name="s", kind="one_at_a_time", metric=METRIC, final_k=1, family=family, arms=(
        _arm("dapo", DAPO), _arm("grpo", GRPO), _arm("dapo_s1", DAPO, **{"train.staleness": 1}),
        _arm("grpo_s1", GRPO, **{"train.staleness": 1}),
        _arm("dapo_s1_bypass", DAPO, **{"train.staleness": 1, "algo.old_logprobs": "rollout"}),
        _arm("dapo_s1_tis", DAPO, **{"train.staleness": 1, "algo.rollout_correction.mode": "tis"})))


def _tidy() -> pd.DataFrame:
    finals = {"grpo": GRPO_0, "dapo": [g + d for g, d in zip(GRPO_0, GAIN_0)], "grpo_s1": GRPO_0,
              "dapo_s1": [g + d for g, d in zip(GRPO_0, GAIN_1)], "dapo_s1_bypass": GRPO_0, "dapo_s1_tis": GRPO_0}
    rows = []
    for arm, values in finals.items():
        for seed, v in enumerate(values):
            run = f"{arm}-{seed}"
            for step in range(5):      # evaluations at rollout steps 0..4; the final one is the run's value
                rows.append((run, arm, seed, step, METRIC, 0.05 if step < 4 else v))
                if step:
                    rows.append((run, arm, seed, step, "mismatch/k3", K3[arm] * 1e-5 + seed * 1e-6))
                    clip = 0.02 if arm == "dapo_s1_bypass" else 0.01   # % = 2 vs 1 per step
                    rows.append((run, arm, seed, step, "train/clip_frac_low", clip / 2 + seed * 1e-4))
                    rows.append((run, arm, seed, step, "train/clip_frac_high", clip / 2))
    d = pd.DataFrame(rows, columns=["run", "arm", "seed", "rollout_step", "metric", "value"])
    d["grad_step"] = 16 * d["rollout_step"]
    d["run_id"], d["sweep"], d["time"] = d["run"], "s", 0.0
    return d


def _spec(tmp_path, extra: str) -> Path:
    src = (REPO / "sweeps" / "staleness-mini.yaml").read_text()
    src = src.replace("base: experiments/mini-dapo.yaml", f"base: {REPO / 'experiments' / 'mini-dapo.yaml'}")
    src = "\n".join(line for line in src.splitlines() if not line.startswith("family:"))
    p = tmp_path / "s.yaml"
    p.write_text(src + "\n" + extra)
    return p


def test_a_spec_declares_its_family_and_bad_families_are_one_error_naming_the_key(tmp_path):
    from dapo.config import ConfigError
    from dapo.sweep.spec import load_spec, sweep_info
    info = sweep_info(load_spec(_spec(tmp_path, "family: [[grpo, dapo], [grpo_s2, dapo_s2]]\n")))
    assert info["family"] == [["grpo", "dapo"], ["grpo_s2", "dapo_s2"]]
    assert SweepInfo.from_dict(info).family == (("grpo", "dapo"), ("grpo_s2", "dapo_s2"))
    assert "family" not in sweep_info(load_spec(_spec(tmp_path, "")))   # undeclared: sweep.json as before
    assert sweep_info(REPO / "sweeps" / "staleness-mini.yaml")["family"] == [["grpo_s2", "dapo_s2"]]
    for bad, msg in (("family: [[grpo, nope]]", "family: 'nope': no such arm"),
                     ("family: [[grpo, grpo]]", r"family\[0\] = \[grpo, grpo\]: an arm compared with itself"),
                     ("family: [[grpo, dapo], [dapo, grpo]]", r"family\[1\] .* already in the family"),
                     ("family: [grpo, dapo]", r"family\[0\] = 'grpo': expected \[off arm, on arm\]"),
                     ("family: []", "expected a non-empty list"),
                     ("family: {a: b}", "expected a non-empty list")):
        with pytest.raises(ConfigError, match=msg):
            load_spec(_spec(tmp_path, bad + "\n"))


def test_a_declared_family_is_the_primary_family_and_the_rule_says_so():
    from analysis.tables import decision_rule, family_table, primary_pairs
    tidy = _tidy()
    default = [(a.name, b.name) for a, b in primary_pairs(tidy, _sweep())]
    # every pair that isolates one technique (correction: 1, staleness: 2, bypass: 1), then GRPO → DAPO
    assert default == [("dapo_s1", "dapo_s1_tis"), ("dapo", "dapo_s1"), ("grpo", "grpo_s1"),
                       ("dapo_s1", "dapo_s1_bypass"), ("grpo", "dapo")]
    sweep = _sweep(family=(("grpo_s1", "dapo_s1"),))
    assert [(a.name, b.name) for a, b in primary_pairs(tidy, sweep)] == [("grpo_s1", "dapo_s1")]
    fam = family_table(tidy, sweep, final_k=1)
    assert fam.attrs["m"] == 1 and fam["mean"].item() == pytest.approx(100 * np.mean(GAIN_1))
    assert fam["p_holm"].item() == pytest.approx(2 / 64)             # six positive differences, m = 1
    assert "the sweep spec lists under `family`" in decision_rule(1, declared=True)
    assert "each step of the ladder" in decision_rule(4)


def test_dapo_gain_in_each_setting_and_its_change_by_hand():
    from analysis.gain import format_gain, gain_table
    g = gain_table(_tidy(), _sweep())
    assert g["setting"].tolist() == ["train.staleness=0", "train.staleness=1"]
    assert g["off"].tolist() == ["grpo", "grpo_s1"] and g["on"].tolist() == ["dapo", "dapo_s1"]
    assert g["gain"].tolist() == pytest.approx([100 * np.mean(GAIN_0), 100 * np.mean(GAIN_1)])
    assert g["gain_p"].tolist() == pytest.approx([2 / 64, 2 / 64])
    # per seed 1 − 2, 1 − 3, 1 − 1, 2 − 2, 1 − 4, 1 − 2 = −1, −2, 0, 0, −3, −1: two zeros, four negatives;
    # flipping a zero changes nothing, so the all-negative sum comes up 4 times in 64 and so does its mirror
    change = [100 * (b - a) for a, b in zip(GAIN_0, GAIN_1)]
    assert g.loc[1, "change"] == pytest.approx(np.mean(change)) == pytest.approx(-7 / 6)
    assert g.loc[1, "change_p"] == pytest.approx(8 / 64) and g.loc[1, "change_verdict"] == "inconclusive"
    assert np.isnan(g.loc[0, "change"]) and g["n"].tolist() == [6, 6]
    shown = format_gain(g)
    assert shown.iloc[0, 1] == "grpo → dapo" and shown["p"].tolist() == ["0.031", "0.031"]
    one = _sweep()
    one = SweepInfo(name="s", kind="one_at_a_time", metric=METRIC, final_k=1, arms=one.arms[:2])
    assert gain_table(_tidy().query("arm in ['grpo', 'dapo']"), one).empty      # one setting: no table
    from analysis.gain import gain_figure
    fig = gain_figure(g, _tidy(), _sweep())
    assert [len(ax.get_xticklabels()) for ax in fig.axes[:2]] == [2, 2]
    two = _tidy().query("arm in ['grpo', 'dapo']")
    assert gain_figure(gain_table(two, one), two, one) is None


def test_staleness_and_bypass_rows_of_the_mechanisms_table():
    from analysis.mechanisms import mechanism_table
    m = mechanism_table(_tidy(), _sweep())
    st = m[m["mechanism"] == "staleness → mismatch"]
    assert st["arms"].tolist() == ["dapo → dapo_s1", "grpo → grpo_s1"]
    # seed terms cancel in the pairs: +1e-5 and +2e-5 at every seed, so p = 2/64 and the verdict "acts"
    assert st["value"].tolist() == pytest.approx([1e-5, 2e-5]) and st["p"].tolist() == pytest.approx([2 / 64] * 2)
    assert st["verdict"].tolist() == ["acts", "acts"] and (st["predicts"] == "rises").all()
    by = m.set_index("mechanism").loc["bypass → clipping"]
    assert by.arms == "dapo_s1 → dapo_s1_bypass" and by.value == pytest.approx(1.0)   # 2% − 1% of tokens
    assert by.verdict == "acts"
    # efficiency: steps to the pooled threshold, mean of both arms' finals (12 runs): 1.57 / 12 = 0.1308.
    # dapo reaches it at its last evaluation (64) with seeds 1, 3, 4, 5, dapo_s1 only with seed 3; the
    # others never do and count as 80 (the next evaluation): on − off = 0, 16, 0, 0, 16, 16
    steps = m[(m["mechanism"] == "staleness → steps to reach") & (m["arms"] == "dapo → dapo_s1")].iloc[0]
    assert steps.value == pytest.approx(8.0) and steps.p == pytest.approx(16 / 64) and "≥ 13.1%" in steps.evidence
