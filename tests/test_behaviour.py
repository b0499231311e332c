"""analysis.behaviour (the rollout-trainer mismatch in a sweep's runs) and the behaviour-policy mechanism
rows, on a synthetic 2 x 2 (rollout dtype x correction) sweep whose numbers are set by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.behaviour import behaviour_section, bucket_means, format_mismatch, mismatch_figure, mismatch_table
from analysis.mechanisms import mechanism_table
from analysis.runs import ArmInfo, SweepInfo

ARMS = {"fp32": ("float32", "none"), "fp32_tis": ("float32", "tis"), "bf16": ("bfloat16", "none"),
        "bf16_tis": ("bfloat16", "tis")}
SEEDS, STEPS = range(6), range(1, 9)          # 8 rollout steps: quarters are steps 1-2 and 7-8


def _k3(arm: str, seed: int, step: int) -> float:
    """fp32: 1e-6 flat; bf16: 1e-3 · (1 + step/8), + 1e-5 · seed (so seeds differ)."""
    return (1e-3 * (1 + step / 8) if arm.startswith("bf16") else 1e-6) + 1e-5 * seed


def _sweep():
    rows, configs = [], {}
    for arm, (dtype, mode) in ARMS.items():
        for seed in SEEDS:
            run = f"{arm}-{seed}"
            configs[run] = {"model": {"rollout_dtype": dtype}, "algo": {"rollout_correction": {"mode": mode}}}
            for step in STEPS:
                vals = {"mismatch/k3": _k3(arm, seed, step), "mismatch/abs_diff_mean": 0.01 if "bf16" in arm else 1e-4,
                        "mismatch/k3_len_le16": 2 * _k3(arm, seed, step), "mismatch/k3_len_le64": _k3(arm, seed, step),
                        "train/entropy": 0.5 + (0.01 * (seed + 1) if mode == "tis" else 0.0)}
                rows += [{"run": run, "arm": arm, "seed": seed, "rollout_step": step, "grad_step": 16 * step,
                          "metric": m, "value": v} for m, v in vals.items()]
    sweep = SweepInfo(name="mismatch-test", kind="grid", arms=tuple(ArmInfo(a) for a in ARMS))
    return pd.DataFrame(rows), configs, sweep


def test_mismatch_levels_and_growth_by_hand():
    tidy, _, sweep = _sweep()
    t = mismatch_table(tidy, sweep).set_index("arm")
    assert list(t.index) == list(ARMS)
    bf = t.loc["bf16"]
    # first quarter (steps 1-2): 1e-3 · (1 + 1.5/8) + 1e-5 · 2.5 (mean seed); last (7-8): 1e-3 · (1 + 7.5/8) + ...
    assert bf["first"] == pytest.approx(1e-3 * (1 + 1.5 / 8) + 2.5e-5)
    assert bf["last"] == pytest.approx(1e-3 * (1 + 7.5 / 8) + 2.5e-5)
    assert bf["grows"] == pytest.approx(1e-3 * 6 / 8) and bf["p"] == pytest.approx(2 / 2 ** 6)
    assert bf["verdict"] == "grows" and bf["abs_diff_mean"] == pytest.approx(0.01)
    flat = t.loc["fp32"]                          # no change within a run: all 6 differences 0
    assert flat["grows"] == pytest.approx(0.0, abs=1e-15) and flat["verdict"] == "inconclusive"
    shown = format_mismatch(t.reset_index())
    assert list(shown.columns)[:3] == ["arm", "seeds", "k3, first quarter"] and (shown["seeds"] == 6).all()


def test_k3_by_length_bucket_is_the_mean_of_each_runs_mean():
    tidy, _, sweep = _sweep()
    b = bucket_means(tidy, sweep).set_index(["arm", "bucket"])
    mean_k3 = np.mean([_k3("bf16", s, st) for s in SEEDS for st in STEPS])
    assert b.loc[("bf16", "le16"), "k3"] == pytest.approx(2 * mean_k3)
    assert b.loc[("bf16", "le64"), "k3"] == pytest.approx(mean_k3) and b.loc[("bf16", "le64"), "n"] == 6
    assert ("bf16", "le256") not in b.index        # no response that long: no bar


def test_behaviour_mechanism_rows_pair_the_toggles():
    """bf16 vs fp32 (correction off in both: the pair that isolates the dtype): k3 rises in all 6 seeds,
    "acts". TIS vs none (fp32 in both): entropy +0.01·(seed + 1) in every seed, two-sided "differs"."""
    tidy, configs, sweep = _sweep()
    rows = mechanism_table(tidy, sweep, configs)
    dtype = rows[rows["mechanism"] == "bf16 rollout → mismatch"].iloc[0]
    assert dtype.arms in ("fp32 → bf16", "fp32_tis → bf16_tis") and dtype.verdict == "acts"
    assert dtype.p == pytest.approx(2 / 2 ** 6) and dtype.predicts == "rises"
    ent = rows[(rows["mechanism"] == "rollout correction") & rows["evidence"].str.startswith("train/entropy")].iloc[0]
    assert ent.value == pytest.approx(0.035) and ent.verdict == "differs" and ent.predicts == "either way"


def test_the_figure_and_the_report_section():
    tidy, configs, sweep = _sweep()
    fig = mismatch_figure(tidy, sweep, configs)
    assert fig is not None and len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["≤ 16", "17–64"]
    text = "\n".join(behaviour_section(mismatch_table(tidy, sweep), {}, True))
    assert text.startswith("## The behaviour policy") and "fig_mismatch.png" in text
    none = tidy[~tidy["metric"].str.startswith("mismatch/")]
    assert mismatch_figure(none, sweep, configs) is None and behaviour_section(mismatch_table(none, sweep), {}, False) == []


def test_the_figure_is_linear_and_no_band_reaches_below_zero():
    """k3 ≥ 0 by construction: a t band over seeds that would reach below 0 (one seed 100× the others)
    is clipped at 0, and both panels are linear (bars start at 0; a log axis hid such bands)."""
    tidy, configs, sweep = _sweep()
    wild = (tidy["arm"] == "fp32") & (tidy["seed"] == 5) & (tidy["metric"] == "mismatch/k3")
    tidy.loc[wild, "value"] *= 100
    fig = mismatch_figure(tidy, sweep, configs)
    assert [ax.get_yscale() for ax in fig.axes] == ["linear", "linear"]
    lows = [c.get_paths()[0].vertices[:, 1].min() for c in fig.axes[0].collections if c.get_paths()]
    assert lows and min(lows) == 0.0
    assert fig.axes[1].get_ylim()[0] == 0.0
