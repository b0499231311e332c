"""Compute-matched rows (analysis.matched) and the generated 'What this shows' (analysis.findings)."""

import numpy as np
import pandas as pd
import pytest

from analysis.claims import check_text
from analysis.findings import what_this_shows
from analysis.matched import matched_table

METRIC = "eval/arith-eval/avg_at_8"
OFF = {2: 0.20, 4: 0.25, 6: 0.30}          # evaluations after step 0 (step 0: 0.1 in both)
ON = {2: 0.30, 4: 0.50, 6: 0.60}


def _tidy(seeds=(0, 1, 2, 3)):
    rows = []
    for arm, evals, tokens in (("off", OFF, 100.0), ("on", ON, 300.0)):
        for s in seeds:
            run = f"{arm}{s}"
            for step in range(1, 7):
                rows.append((arm, run, s, step, 16 * step, "sampling/gen_tokens", tokens))
            rows.append((arm, run, s, 0, 0, METRIC, 0.1))
            for step, v in evals.items():
                rows.append((arm, run, s, step, 16 * step, METRIC, v + (0.01 * s if arm == "on" else 0.0)))
    return pd.DataFrame(rows, columns=["arm", "run", "seed", "rollout_step", "grad_step", "metric", "value"])


def _family(**kw):
    row = {"comparison": "on vs off", "off": "off", "on": "on", "mean": 25.0, "lo": 20.0, "hi": 30.0,
           "level": 0.875, "method": "sign-flip", "n": 4, "p": 0.125, "p_holm": 0.125, "p_tost": 0.9,
           "p_tost_holm": 0.9, "verdict": "inconclusive"}
    row.update(kw)
    return pd.DataFrame([row])


def test_matched_reads_each_run_within_the_smaller_budget_by_hand():
    """off generates 100 tokens a step, on 300: over 6 steps 600 vs 1,800, so the budget is 600. on's
    evaluations within it: step 2 only (600 tokens) -> 0.30 + 0.01·seed; off's last 2: steps 4, 6 ->
    0.275. Per seed +2.5 + 1·seed points; ratio 3."""
    m = matched_table(_tidy(), _family(), METRIC, None, final_k=2, scale=100.0)
    row = m[m["axis"] == "gen_tokens"].iloc[0]
    assert row["ratio"] == pytest.approx(3.0)
    assert row["n"] == 4 and row["mean"] == pytest.approx(np.mean([2.5 + s for s in range(4)]))
    assert row["p"] == pytest.approx(0.125)          # 4 positive pairs: the exact two-sided floor 2/16
    assert list(m["axis"]) == ["gen_tokens"]          # no time/step_s logged: no thread-seconds row
    assert row["reading"] == "inconclusive" and row["q"] == pytest.approx(0.125)


def test_what_this_shows_states_findings_with_their_price_and_passes_the_claims_check():
    fam = _family(verdict="reproduces", p_holm=0.012)
    m = matched_table(_tidy(), fam, METRIC, None, final_k=2, scale=100.0)
    mech = pd.DataFrame([{"mechanism": "entropy collapse", "evidence": "train/entropy", "arms": "off",
                          "value": -0.03, "lo": -0.04, "hi": -0.02, "level": 0.969, "method": "sign-flip",
                          "p": 0.002, "q": 0.004},
                         {"mechanism": "truncation", "evidence": "overlong", "arms": "off", "value": 0.1,
                          "lo": -0.1, "hi": 0.3, "level": 0.969, "method": "sign-flip", "p": 0.4, "q": 0.4}])
    text = "\n".join(what_this_shows(fam, m, {"mechanisms": mech}, " points"))
    assert "**on vs off: reproduces**" in text and "p_Holm 0.012" in text
    assert "At equal generated tokens (the on arm used 3.00× the off arm's)" in text
    assert "lead (mechanisms): entropy collapse" in text and "truncation" not in text   # q 0.4 is no lead
    assert check_text(text) == []
    undecided = "\n".join(what_this_shows(_family(), m, {}, " points"))
    assert "No finding" in undecided and "Not decided (inconclusive): on vs off" in undecided
    assert check_text(undecided) == []


def test_under_a_stopping_rule_rows_before_look_one_are_not_tested_yet():
    fam = _family(looks_done="", look=0, p_seq_holm=float("nan"), n=3)
    fam.attrs["stopping"] = {"looks": [10, 16], "spending": "pocock", "alpha": 0.05}
    text = "\n".join(what_this_shows(fam, pd.DataFrame(columns=["off", "on"]), {}, " points"))
    assert "Not tested yet (the declared stopping rule's look 1 needs 10 pairs): on vs off, 3 pairs so far" in text
    assert "Not decided" not in text and check_text(text) == []
