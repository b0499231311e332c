"""Table 1's paired columns, compare.md's paired line and the cost ledger, on a tidy table with known values.

Ladder a → b → c, seeds 0–2 (b also has seed 3, unpaired). Eval avg@8 at grad steps 0, 2, 4:
0.30 at step 0 for every run, then the seed's final twice (final_k = 2 → exactly that final):

    a  0.40 0.50 0.60          paper 30
    b  0.41 0.52 0.63 (+0.90)  paper 36    b − a per seed: +1, +2, +3 pp
    c  = b                     paper 38    c − b: 0, 0, 0 (SD 0)

Per rollout step (1–4, one grad step each): sampling/gen_tokens 100, perf/train_tokens_per_s 50 and
time/train_s 2 (100 trained tokens), time/step_s 10; time/eval_s 5 at step 0; train.threads 2.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.runs import ArmInfo, SweepInfo, normalize_tidy

METRIC = "eval/arith/avg_at_8"
FINALS = {"a": {0: 0.40, 1: 0.50, 2: 0.60}, "b": {0: 0.41, 1: 0.52, 2: 0.63, 3: 0.90},
          "c": {0: 0.41, 1: 0.52, 2: 0.63}}
PAPER = {"a": 30.0, "b": 36.0, "c": 38.0}
EPS = {"a": 0.2, "b": 0.2, "c": 0.28}
LOSS = {"a": "seq_mean_token_mean", "b": "token_mean", "c": "token_mean"}


def _tidy() -> pd.DataFrame:
    rows = []
    for arm, finals in FINALS.items():
        for seed, f in finals.items():
            run = f"{arm}{seed}"
            base = dict(run=run, run_id=run, sweep="s", arm=arm, seed=seed)
            for g, v in ((0, 0.30), (2, f), (4, f)):
                rows.append({**base, "rollout_step": g, "grad_step": g, "time": 10.0 * g, "metric": METRIC, "value": v})
            rows.append({**base, "rollout_step": 0, "grad_step": 0, "time": 0.0, "metric": "time/eval_s", "value": 5.0})
            for g in range(1, 5):
                for m, v in (("sampling/gen_tokens", 100.0), ("perf/train_tokens_per_s", 50.0),
                             ("time/train_s", 2.0), ("time/step_s", 10.0), ("train/entropy", 0.5 + 0.1 * seed)):
                    rows.append({**base, "rollout_step": g, "grad_step": g, "time": 10.0 * g, "metric": m, "value": v})
    return normalize_tidy(pd.DataFrame(rows))


def _sweep(kind: str = "ladder") -> SweepInfo:
    return SweepInfo(name="s", kind=kind, metric=METRIC, final_k=2, arms=tuple(
        ArmInfo(a, f"arm {a}", {"algo.clip.eps_high": EPS[a], "algo.clip.eps_low": 0.2, "algo.loss_agg": LOSS[a]},
                PAPER[a]) for a in FINALS))


def _configs(threads=2) -> dict:
    return {f"{a}{s}": {"train": {"threads": threads, "seed": s}} for a, f in FINALS.items() for s in f}


def test_table1_paired_columns_by_hand():
    from analysis.tables import table1
    t = table1(_tidy(), _sweep(), final_k=2).set_index("arm")
    assert math.isnan(t.loc["a", "d_prev"]) and t.loc["a", "n_pairs"] == 0          # first row: nothing before it
    b = t.loc["b"]
    assert b["n_pairs"] == 3                                                        # seed 3 (b only) dropped
    assert b["d_prev"] == pytest.approx(2.0) and b["p_prev"] == pytest.approx(0.25)   # d = [1, 2, 3] pp
    # 3 pairs: the exact sign-flip interval is [min, max] and its level is 1 − 2/8 = 75%, said so
    assert (b["d_lo"], b["d_hi"], b["d_level"], b["d_method"]) == (1.0, 3.0, 0.75, "sign-flip")
    assert b["sd_prev"] == pytest.approx(1.0) and b["paper_delta"] == 6.0
    # the family: a→b (p 1/4), b→c (p 1), a→c (c − a = b − a: p 1/4); Holm: 3·1/4, max(3·1/4, 2·1/4), 1
    assert b["p_holm"] == pytest.approx(0.75) and t.loc["c", "p_holm"] == pytest.approx(1.0)
    assert b["verdict"] == "inconclusive"
    # α/m = 0.05/3: the exact test needs 2/2^n ≤ 0.0167 → n ≥ 7, and Δ/SD = 6 has power ≈ 1 there
    assert b["seeds_needed"] == 7 and b["seeds_needed_lo"] == 7 and b["seeds_needed_hi"] > 7
    assert b["ours"] == pytest.approx(np.mean([41, 52, 63, 90]))                    # the arm's own mean keeps seed 3
    assert b["ci_lo"] < b["ours"] < b["ci_hi"]                                      # 95% t over the arm's 4 seeds
    from scipy.stats import t as student
    v = np.array([41, 52, 63, 90.0])
    assert b["ci_hi"] - b["ours"] == pytest.approx(student.ppf(0.975, 3) * v.std(ddof=1) / 2)
    c = t.loc["c"]
    assert c["d_prev"] == 0.0 and c["p_prev"] == 1.0 and c["sd_prev"] == 0.0
    assert math.isnan(c["seeds_needed"])                                            # SD 0: "–", not a crash
    assert t.loc["a", "wall_min"] == pytest.approx(45 / 60)                         # loop: 4 steps × 10 s + eval 5 s


def test_table1_paired_columns_only_for_ladders():
    from analysis.tables import format_table1, table1, table1_footnote
    t = table1(_tidy(), _sweep("grid"), final_k=2)
    assert t["d_prev"].isna().all() and t["seeds_needed"].isna().all()
    assert "ladders only" in table1_footnote(t)
    assert not any(c.startswith("p (") for c in format_table1(t).columns)


def test_format_table1_shows_the_paired_columns_and_the_footnote_names_the_test():
    from analysis.tables import format_table1, table1, table1_footnote, to_markdown
    t = table1(_tidy(), _sweep(), final_k=2)
    shown = format_table1(t)
    col = "Δ vs previous arm (pp) [75% sign-flip]"                  # one level in every cell: it goes in the header
    assert shown[col].tolist()[0] == "–"
    assert shown[col].tolist()[1] == "+2.0 [+1.0, +3.0]"
    assert shown["p (sign-flip)"].tolist() == ["–", "0.250", "1.000"]
    assert shown["p Holm (family of 3)"].tolist() == ["–", "0.750", "1.000"]
    assert shown["verdict"].tolist() == ["–", "inconclusive", "inconclusive"]
    assert shown["seeds for paper's Δ (80% power, Holm)"].tolist()[1].startswith("7 (7–")
    md = to_markdown(shown)
    assert md.count("\n") == 2 + 3 and "grad steps" in md and "ours [95% t]" in md
    note = table1_footnote(t)
    for words in ("sign-flip", "Hartigan", "Holm", "80% power", "2/2^n", "Student-t"):
        assert words in note


def test_family_table_declares_its_comparisons_and_decides_from_holm():
    from analysis.tables import decision_rule, family_table, format_family
    f = family_table(_tidy(), _sweep(), final_k=2)
    assert [(r.off, r.on) for r in f.itertuples()] == [("a", "b"), ("b", "c"), ("a", "c")]
    assert f.attrs["m"] == 3
    np.testing.assert_allclose(f["p_holm"], [0.75, 1.0, 0.75])
    assert (f["verdict"] == "inconclusive").all()
    shown = format_family(f)
    assert shown.loc[0, "Δ (pp) [interval, level]"] == "+2.0 [+1.0, +3.0] 75% sign-flip"
    assert "3 comparisons" in decision_rule(3) and "Holm" in decision_rule(3)


def test_compare_table_paired_columns():
    from analysis.tables import compare_table
    c = compare_table(_tidy(), "a", "b", final_k=2).set_index("metric")
    r = c.loc[METRIC]
    assert r["n_a"] == 3 and r["n_b"] == 4 and r["n_pairs"] == 3
    assert r["paired_diff"] == pytest.approx(2.0) and r["p"] == pytest.approx(0.25)
    assert r["diff"] == pytest.approx(np.mean([41, 52, 63, 90]) - 50.0)          # unpaired means keep seed 3
    assert c.loc["train/entropy", "paired_diff"] == pytest.approx(0.0) and c.loc["train/entropy", "p"] == 1.0


def test_paired_line_states_the_numbers_and_the_test():
    from analysis.tables import paired_line
    s = _sweep()
    line = paired_line(_tidy(), s.arms[0], s.arms[1], METRIC, final_k=2)
    assert "n = 3 pairs" in line and "Δ = +2.0 pp" in line and "p = 0.250" in line
    assert "[+1.0, +3.0; 75% sign-flip]" in line and "unadjusted" in line
    assert "exact sign-flip, 2^3 = 8 flips" in line and "for +6" in line and "TOST against ±1.0 pp" in line
    back = paired_line(_tidy(), s.arms[1], s.arms[0], METRIC, final_k=2)
    assert "Δ = −2.0 pp" in back and "p = 0.250" in back                             # swapped: negated, same p


def test_cost_ledger_by_hand():
    from analysis.tables import cost_ledger, format_cost
    c = cost_ledger(_tidy(), _sweep(), _configs(2), final_k=2).set_index("arm")
    a = c.loc["a"]
    assert a["gen_tokens"] == 400 and a["trained_tokens"] == 400                  # 4 steps × 100
    assert a["loop_s"] == 45 and a["threads"] == 2 and a["thread_s"] == 90         # (4 × 10 + 5) × 2
    assert a["first"] == pytest.approx(30.0) and a["final"] == pytest.approx(50.0) and a["gain"] == pytest.approx(20.0)
    # 3 seeds (+10, +20, +30): the sign-flip p cannot go below 2/2³ = 0.25, so the gain is not shown to exist
    # and no cost per point is printed
    assert a["gain_p"] == pytest.approx(0.25) and math.isnan(a["thread_s_per_point"])
    shown = format_cost(c.reset_index())
    assert shown.loc[0, "thread-s/run (loop × threads)"] == "90" and shown.loc[0, "gain (pp)"] == "+20.0 (p 0.250)"
    assert shown.loc[0, "thread-s per point gained"] == "–"
    assert shown.loc[0, "generated tokens/run"] == "400" and shown.loc[0, "avg@8 first → final (pp)"] == "30.0 → 50.0"
    # threads left to all cores: no thread-s (the run does not record the core count)
    u = cost_ledger(_tidy(), _sweep(), _configs(None), final_k=2).set_index("arm")
    assert math.isnan(u.loc["a", "thread_s"]) and math.isnan(u.loc["a", "thread_s_per_point"])
    assert u.loc["a", "loop_s"] == 45


def test_cost_per_point_only_where_the_gain_is_shown(monkeypatch):
    """6 seeds, each gaining: p = 2/2⁶ = 0.031 ≤ 0.05, so thread-s per point = thread-s / gain."""
    from analysis.tables import cost_ledger, format_cost
    monkeypatch.setitem(FINALS, "a", {s: 0.40 + 0.02 * s for s in range(6)})        # gains +10 … +20 points
    c = cost_ledger(_tidy(), _sweep(), _configs(2), final_k=2).set_index("arm")
    a = c.loc["a"]
    assert a["gain"] == pytest.approx(15.0) and a["gain_p"] == pytest.approx(1 / 32)
    assert a["thread_s_per_point"] == pytest.approx(90 / 15)
    shown = format_cost(c.reset_index())
    assert shown.loc[0, "gain (pp)"] == "+15.0 (p 0.031)" and shown.loc[0, "thread-s per point gained"] == "6"


def test_cost_per_point_is_undefined_without_a_gain():
    from analysis.tables import cost_ledger
    tidy = _tidy()
    tidy.loc[(tidy["metric"] == METRIC) & (tidy["grad_step"] == 0), "value"] = 0.70   # every final is below 0.70
    c = cost_ledger(tidy, _sweep(), _configs(2), final_k=2).set_index("arm")
    assert (c["gain"] < 0).all() and c["thread_s_per_point"].isna().all()


def test_compare_md_has_the_paired_line_and_the_cost_of_both_arms():
    from analysis.report import _compare_md
    md = _compare_md(_tidy(), {}, _sweep(), 2)
    assert "## Clip-Higher: arm b → arm c" in md
    assert "**Paired over seeds** on `eval/arith/avg_at_8` (n = 3 pairs" in md
    assert "generated tokens/run" in md and "| arm b " in md and "paired_diff" in md


def test_a_two_by_two_grid_declares_its_four_simple_effects_and_the_corner():
    """Soft punishment × dynamic sampling: the family is the four pairs that differ in one technique
    (by technique, then arm order) and the full arm vs the baseline (both techniques)."""
    from analysis.tables import primary_pairs
    cells = {"nn": (False, False), "nd": (False, True), "sn": (True, False), "sd": (True, True)}
    rows = []
    for arm, (sp, ds) in cells.items():
        for seed in range(3):
            base = dict(run=f"{arm}{seed}", run_id=f"{arm}{seed}", sweep="g", arm=arm, seed=seed)
            for g, v in ((0, 0.3), (2, 0.4 + 0.01 * seed), (4, 0.4 + 0.01 * seed)):
                rows.append({**base, "rollout_step": g, "grad_step": g, "time": 0.0, "metric": METRIC, "value": v})
    sweep = SweepInfo(name="g", kind="grid", metric=METRIC, final_k=2, arms=tuple(
        ArmInfo(a, a, {"algo.overlong.soft_punish": sp, "algo.dynamic_sampling.enabled": ds,
                       "algo.overlong.filter": True, "algo.clip.eps_high": 0.28, "algo.clip.eps_low": 0.2,
                       "algo.loss_agg": "token_mean"}) for a, (sp, ds) in cells.items()))
    pairs = [(o.name, n.name) for o, n in primary_pairs(normalize_tidy(pd.DataFrame(rows)), sweep)]
    assert pairs == [("nn", "sn"), ("nd", "sd"), ("nn", "nd"), ("sn", "sd"), ("nn", "sd")]


def test_a_grid_pair_is_labelled_by_what_differs():
    from analysis.runs import ArmInfo
    from analysis.tables import comparison_label
    f32 = ArmInfo("f", "rollout_dtype=float32, mode=none")
    on = ArmInfo("t", "rollout_dtype=float32, mode=tis")
    both = ArmInfo("bt", "rollout_dtype=bfloat16, mode=tis")
    assert comparison_label(on, f32) == "mode none → tis (rollout_dtype=float32)"
    assert comparison_label(both, f32) == "rollout_dtype float32 → bfloat16, mode none → tis"
    assert comparison_label(ArmInfo("dapo", "DAPO"), ArmInfo("grpo", "naive GRPO")) == "DAPO vs naive GRPO"
    assert comparison_label(ArmInfo("h", "eps_high=0.28"), ArmInfo("l", "eps_high=0.2")) == "eps_high 0.2 → 0.28"
    assert comparison_label(ArmInfo("a", "lr=1"), ArmInfo("b", "x=2, y=3")) == "lr=1 vs x=2, y=3"  # other keys
