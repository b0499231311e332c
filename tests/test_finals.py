"""A final value never includes step 0 (issue #41, item 2): the untrained model's evaluation is the
start of a run, not one of its last evaluations; a final_k the runs cannot supply after step 0 is refused."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.eval_noise import _last_steps
from analysis.stats import FinalKError, final_points, run_finals

M = "eval/arith-eval/avg_at_8"


def _tidy(points: dict[str, list[tuple[int, float]]]) -> pd.DataFrame:
    rows = [{"arm": run.split("-")[0], "run": run, "seed": 0, "grad_step": s, "rollout_step": s, "metric": M,
             "value": v} for run, pts in points.items() for s, v in pts]
    return pd.DataFrame(rows)


def test_a_run_with_fewer_evaluations_than_final_k_never_averages_its_step_0():
    """Run b (still running) has one evaluation after step 0: its final is that one, not (step 0 + it) / 2."""
    tidy = _tidy({"a-0": [(0, 0.10), (3, 0.30), (6, 0.50)], "b-0": [(0, 0.10), (3, 0.40)]})
    f = run_finals(tidy, M, final_k=2).set_index("run")["final"]
    assert f["a-0"] == pytest.approx(0.40) and f["b-0"] == pytest.approx(0.40)   # was 0.25 for b-0


def test_a_final_k_the_runs_cannot_supply_without_step_0_is_refused():
    """The issue's probe: runs evaluated at 0 and 3, final_k 2: it averaged step 0 in and halved the gain."""
    tidy = _tidy({"grpo-0": [(0, 0.10), (3, 0.30)], "dapo-0": [(0, 0.10), (3, 0.50)]})
    with pytest.raises(FinalKError, match=r"final_k 2: the runs have at most 1 evaluation of .* after step 0.*"
                                          r"use final_k <= 1"):
        run_finals(tidy, M, final_k=2)
    assert run_finals(tidy, M, final_k=1).set_index("run")["final"].to_dict() == {"grpo-0": 0.30, "dapo-0": 0.50}
    with pytest.raises(FinalKError, match="final_k 0"):
        run_finals(tidy, M, final_k=0)


def test_only_step_0_is_refused_and_no_points_is_an_empty_table():
    with pytest.raises(FinalKError, match="at most 0 evaluations"):
        run_finals(_tidy({"a-0": [(0, 0.1)]}), M, final_k=1)
    assert run_finals(_tidy({"a-0": [(0, 0.1)]}), "other/metric", final_k=1).empty


def test_the_records_of_final_evaluations_skip_step_0_too():
    per_eval = pd.DataFrame({"run": ["r"] * 3, "step": [0, 3, 6], "sd": [1.0, 2.0, 3.0]})
    assert sorted(_last_steps(per_eval, 3)["step"]) == [3, 6]
    assert list(final_points(_tidy({"r-0": [(0, 1.0), (3, 2.0)]}), 1)["grad_step"]) == [3]
