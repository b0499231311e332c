"""The report's pass@k curves and shown samples (analysis/samples.py): the numbers by hand, the
fixed rule that picks the problems, the records read back from run dirs, the snapshot round trip."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.runs import PROBLEM_COLUMNS, normalize_problems
from analysis.samples import (load_samples, passk_curves, passk_section, pick_problems, samples_from_runs,
                              samples_section)
from dapo.eval_records import make_record, records_path, write_records

METRIC = "eval/arith-eval/avg_at_4"


def _problems():
    """Two arms x two seeds, steps 0 and 5, three problems, k = 4 (n_correct chosen by hand)."""
    rows = []
    n_correct = {  # (arm, step) -> per problem 0, 1, 2 (both seeds alike, seed 1 with problem 2 one more)
        ("a", 0): [0, 0, 2], ("a", 5): [4, 0, 1],
        ("b", 0): [0, 0, 1], ("b", 5): [2, 0, 0],
    }
    for (arm, step), counts in n_correct.items():
        for seed in (0, 1):
            for p, c in enumerate(counts):
                c = c + (1 if seed == 1 and p == 2 and c < 4 else 0)
                rows.append((f"{arm}-s{seed}", f"id{arm}{seed}", arm, seed, step, step * 2, "arith-eval",
                             f"arith-eval:{p}", c, 4))
    return normalize_problems(pd.DataFrame(rows, columns=PROBLEM_COLUMNS))


def test_passk_curves_by_hand():
    c = passk_curves(_problems(), METRIC, ["a", "b"]).set_index(["arm", "k"])
    assert list(c.loc["a"].index) == [1, 2, 4]
    # arm a, last step, seed 0: counts 4, 0, 1 of 4 -> pass@1 = (1 + 0 + .25)/3; seed 1: 4, 0, 2 -> (1 + 0 + .5)/3
    assert c.loc[("a", 1), "mean"] == pytest.approx(((1.25 / 3) + (1.5 / 3)) / 2)
    # pass@4 = share of problems solved: 2/3 for both seeds; pass@2 of a 1-of-4 problem = 1 - C(3,2)/C(4,2) = 0.5
    assert c.loc[("a", 4), "mean"] == pytest.approx(2 / 3) and c.loc[("a", 4), "seeds"] == 2
    assert c.loc[("a", 2), "mean"] == pytest.approx(((1 + 0 + 0.5) / 3 + (1 + 0 + 1 - 1 / 6) / 3) / 2)
    assert (c["lo"] <= c["mean"] + 1e-12).all() and (c["mean"] <= c["hi"] + 1e-12).all()
    text = "\n".join(passk_section(passk_curves(_problems(), METRIC, ["a", "b"]), {"a": "arm A"}))
    assert "| arm A | 45.8 [0.0, " in text and "pass@4 (%)" in text
    assert "no pass@k curve" in "\n".join(passk_section(passk_curves(None, METRIC, ["a"]), {}))


def test_the_problems_are_picked_by_the_fixed_rule():
    # last step: problem 0 solved by both arms, 1 by none; problem 2 unsolved at step 0? no: a has 2 there
    assert pick_problems(_problems(), METRIC, 0) == {"solved by all": "arith-eval:0", "solved by none": "arith-eval:1",
                                                     "flipped": "arith-eval:0"}


def test_samples_come_from_the_record_files_and_survive_the_snapshot(tmp_path):
    from analysis.runs import snapshot
    probs = _problems()
    tidy = pd.DataFrame({"run": ["a-s0", "b-s0"], "run_id": ["ida0", "idb0"], "arm": ["a", "b"], "seed": [0, 0]})
    for arm in ("a", "b"):
        for step in (0, 5):
            recs = [make_record(set="arith-eval", problem=f"arith-eval:{p}", sample=j, seed=1, prompt_hash="0" * 16,
                                answer=str(p), correct=j == 0, length=7 + p, finished=True,
                                response=f"{arm} {step} |{p}|" + "x" * (500 if p == 1 else 0), step=step,
                                grad_step=2 * step) for p in range(3) for j in range(4)]
            write_records(records_path(tmp_path / "runs" / f"id{arm}0", step), recs)
    s = samples_from_runs(tmp_path, tidy, probs, METRIC)
    assert len(s) == 2 * 2 * 3                                     # arms x (first, last) x kinds
    assert set(s["kind"]) == {"solved by all", "solved by none", "flipped"} and (s["sample"] == 0).all()
    none = s[s["kind"] == "solved by none"]
    assert none["response"].str.len().max() == 401 and none["response"].str.startswith("…").all()
    text = "\n".join(samples_section(s, {"a": "arm A"}, ["a", "b"]))
    assert "### solved by none: `arith-eval:1`" in text and "| arm A | 5 | yes | 7 | `a 5 \\|0\\|` |" in text
    snap = snapshot(pd.DataFrame(columns=["run", "run_id", "arm", "seed", "metric", "step", "rollout_step", "value",
                                          "sweep"]), {}, None, tmp_path / "snap", samples=s)
    assert load_samples(snap).equals(s)
    snapshot(pd.DataFrame(columns=["run", "run_id", "arm", "seed", "metric", "step", "rollout_step", "value",
                                   "sweep"]), {}, None, tmp_path / "snap")
    assert load_samples(snap) is None                               # a later snapshot without samples drops the file
    assert samples_from_runs(tmp_path / "elsewhere", tidy, probs, METRIC) is None
    assert "No per-sample records" in "\n".join(samples_section(None, {}, []))
