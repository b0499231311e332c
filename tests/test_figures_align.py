"""Figures: curves of an arm whose seeds log a metric at different gradient steps for the same
rollout step are aligned by rollout step (analysis.figures.aligned_band), and no single seed's
value is drawn on a "mean over seeds" line of an arm with several seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

from analysis import figures as F
from analysis.runs import ArmInfo, SweepInfo, load_snapshot, normalize_tidy
from analysis.stats import BAND_METHOD, seed_band, t_interval

REPO = Path(__file__).resolve().parents[1]
EVAL = "eval/arith/avg_at_8"


def _tidy(points: dict[tuple[str, int], list[tuple[int, int, float]]], metric: str = EVAL) -> pd.DataFrame:
    """(arm, seed) → [(rollout_step, grad_step, value), ...] of one metric."""
    rows = [dict(run=f"{arm}-{seed}", run_id=f"{arm}-{seed}", sweep="s", arm=arm, seed=seed, rollout_step=r,
                 grad_step=g, time=60.0 * g, metric=metric, value=v)
            for (arm, seed), pts in points.items() for r, g, v in pts]
    return normalize_tidy(pd.DataFrame(rows))


def test_seeds_at_different_grad_steps_are_aligned_by_rollout_step():
    t = _tidy({("a", 0): [(0, 0, 0.1), (5, 80, 0.4), (10, 160, 0.6)],
               ("a", 1): [(0, 0, 0.2), (5, 81, 0.5), (10, 158, 0.9)]})
    assert (seed_band(t, EVAL)["n"] == 1).sum() == 4                      # unaligned: a zigzag of single seeds
    b = F.aligned_band(t, EVAL)
    assert list(b.columns) == ["arm", "grad_step", "mean", "lo", "hi", "n"]
    assert len(b) == 3 and (b["n"] == 2).all() and (b["arm"] == "a").all()
    np.testing.assert_allclose(b["grad_step"], [0, 80.5, 159])
    np.testing.assert_allclose(b["mean"], [0.15, 0.45, 0.75])
    for row, vals in zip(b.itertuples(), [[0.1, 0.2], [0.4, 0.5], [0.6, 0.9]]):
        iv = t_interval(vals)
        np.testing.assert_allclose([row.lo, row.hi], [iv.lo, iv.hi], rtol=1e-12)
    # x = rollout_step: already aligned, seed_band itself
    pdt.assert_frame_equal(F.aligned_band(t, EVAL, "rollout_step"), seed_band(t, EVAL, "rollout_step"))


def test_only_the_arm_that_needs_it_is_aligned():
    t = _tidy({("a", 0): [(0, 0, 0.1), (5, 80, 0.4)], ("a", 1): [(0, 0, 0.2), (5, 81, 0.5)],
               ("b", 0): [(0, 0, 0.3), (5, 80, 0.3)], ("b", 1): [(0, 0, 0.5), (5, 80, 0.7)]})
    b = F.aligned_band(t, EVAL)
    assert list(pd.unique(b["arm"])) == ["a", "b"]
    sb = seed_band(t, EVAL)
    pdt.assert_frame_equal(b[b["arm"] == "b"].reset_index(drop=True),
                           sb[sb["arm"] == "b"].reset_index(drop=True).astype({"grad_step": float}))
    np.testing.assert_allclose(b.loc[b["arm"] == "a", "grad_step"], [0, 80.5])


def test_seeds_that_agree_on_x_give_seed_band_exactly():
    t = _tidy({("a", s): [(r, 16 * r, 0.1 * s + 0.01 * r) for r in (0, 5, 10)] for s in range(3)})
    pdt.assert_frame_equal(F.aligned_band(t, EVAL), seed_band(t, EVAL))
    # a shorter run on the same grid (it stopped early) is not a reason to align either
    t2 = t[~((t["seed"] == 2) & (t["rollout_step"] == 10))]
    pdt.assert_frame_equal(F.aligned_band(t2, EVAL), seed_band(t2, EVAL))
    assert F.aligned_band(t2, EVAL)["n"].tolist() == [3, 3, 2]


def test_per_grad_step_train_metric_keeps_its_points_when_seeds_agree():
    """train/* is logged per gradient step, several per rollout step: nothing is collapsed."""
    pts = {("a", s): [(g // 4, g, 1.0 - 0.01 * g + 0.001 * s) for g in range(20)] for s in range(3)}
    t = _tidy(pts, "train/entropy")
    b = F.aligned_band(t, "train/entropy")
    assert len(b) == 20 and (b["n"] == 3).all()
    pdt.assert_frame_equal(b, seed_band(t, "train/entropy"))


def test_single_seed_points_are_not_on_the_mean_line():
    """Arm with 3 seeds, one of which ran a rollout step further: its last point is n = 1, a gap in the
    line, drawn as a hollow marker with a note; an arm with one seed draws its run as the line."""
    t = _tidy({("a", 0): [(r, 10 * r, 0.1 * r) for r in range(5)],
               ("a", 1): [(r, 10 * r, 0.1 * r + 0.05) for r in range(4)],
               ("a", 2): [(r, 10 * r, 0.1 * r + 0.02) for r in range(4)]})
    sweep = SweepInfo(name="s", kind="grid", arms=(ArmInfo("a", "arm A"),))
    ctx = F._context(t, sweep, "grad_step", None)
    fig, ax = F._new_figure()
    F._draw(ctx, ax[0], EVAL, sweep.arms[0])
    line, single = ax[0].get_lines()
    np.testing.assert_allclose(line.get_xdata(), [0, 10, 20, 30, 40])
    np.testing.assert_array_equal(np.isnan(line.get_ydata()), [False] * 4 + [True])   # a gap, not the seed
    assert single.get_linestyle() == "None" and single.get_markerfacecolor() == "none"
    np.testing.assert_allclose(single.get_xdata(), [40])
    np.testing.assert_allclose(single.get_ydata(), [40.0])               # 0.4 in %
    assert "hollow markers" in ctx.drawn_note() and "“arm A”" in ctx.drawn_note()
    one = t[t["seed"] == 0]
    ctx1 = F._context(one, sweep, "grad_step", None)
    fig, ax = F._new_figure()
    F._draw(ctx1, ax[0], EVAL, sweep.arms[0])
    (line,) = ax[0].get_lines()
    assert len(line.get_xdata()) == 5 and ctx1.drawn_note() == ""


@pytest.fixture(scope="module")
def smollm2():
    return load_snapshot(REPO / "results" / "smollm2-mini" / "snapshot")


def test_smollm2_mini_dapo_eval_curve_has_no_single_seed_point(smollm2):
    tidy, configs, sweep = smollm2
    m = sweep.metric
    ev = tidy[(tidy["metric"] == m) & (tidy["arm"] == "dapo")]
    assert ev.groupby("run")["grad_step"].max().nunique() > 1             # the seeds do end at different steps
    b = F.aligned_band(tidy, m)
    d = b[b["arm"] == "dapo"]
    assert (d["n"] == tidy.loc[tidy["arm"] == "dapo", "run"].nunique()).all() and not (d["n"] == 1).any()
    last_r = int(ev["rollout_step"].max())
    assert d["grad_step"].iloc[-1] == pytest.approx(
        ev[ev["rollout_step"] == last_r].groupby("run")["grad_step"].mean().mean())
    assert len(d) == ev["rollout_step"].nunique()
    # drawn: Fig. 1 (b) has every DAPO curve at 4 points, no hollow marker, and says how it was aligned
    res = {r.name: r for r in F.render_all(tidy, sweep, configs=configs)}
    ax = res["fig1"].figure.axes[-1]
    assert all(len(ln.get_xdata()) == len(d) for ln in ax.get_lines() if not ln.get_label().startswith("_"))
    assert not any(ln.get_label() == "_nolegend_" for ln in ax.get_lines())
    assert "aligned by rollout step" in res["fig1"].note


def test_figure_text_says_what_the_band_is():
    src = (REPO / "analysis" / "figures.py").read_text()
    assert "bootstrap" not in src and "95% CI" not in src
    assert "t band" in F.BAND_SHORT and F.BAND_METHOD == BAND_METHOD
    t = _tidy({("a", s): [(r, r, 0.1 * r + 0.01 * s) for r in range(3)] for s in range(2)})
    s = SweepInfo(name="s", kind="grid", arms=(ArmInfo("a"),), metric=EVAL)
    fig = F.fig1(t, s)
    assert F.BAND_SHORT in fig._suptitle.get_text()


def test_a_dense_line_marks_a_point_left_between_gaps():
    """Over 40 points a line has no markers; a point whose neighbours are both gaps (n = 1 or no value)
    gets one, or it would not show."""
    vals = [0.5] * 50
    pts = {("a", s): [(r, r, v + 0.01 * s) for r, v in enumerate(vals)] for s in range(2)}
    pts[("a", 1)] = [p for p in pts[("a", 1)] if p[0] not in (20, 22)]   # 20, 22: only seed 0 has a value
    t = _tidy(pts)
    sweep = SweepInfo(name="s", kind="grid", arms=(ArmInfo("a"),))
    ctx = F._context(t, sweep, "grad_step", None)
    fig, ax = F._new_figure()
    F._draw(ctx, ax[0], EVAL, sweep.arms[0])
    line, single = ax[0].get_lines()
    assert line.get_marker() == "o" and list(line.get_markevery()) == [21]
    np.testing.assert_allclose(single.get_xdata(), [20, 22])
    # all seeds everywhere: no marker, as before
    full = _tidy({("a", s): [(r, r, 0.5) for r in range(50)] for s in range(2)})
    fig, ax = F._new_figure()
    F._draw(F._context(full, sweep, "grad_step", None), ax[0], EVAL, sweep.arms[0])
    (line,) = ax[0].get_lines()
    assert line.get_marker() in (None, "None", "") and line.get_markevery() is None


def test_a_fractions_band_stays_in_0_100_and_a_lone_band_point_does_not_size_the_axis():
    """Three seeds near 0%: the t band would reach below 0; drawn in %, it is clipped at 0. A band
    point with no band beside it (the other points have one seed) draws nothing and is dropped."""
    t = _tidy({("a", 0): [(0, 0, 0.0), (1, 10, 0.01), (2, 20, 0.02)],
               ("a", 1): [(0, 0, 0.03), (1, 10, 0.0), (2, 20, 0.04)],
               ("a", 2): [(0, 0, 0.0), (1, 10, 0.05), (2, 20, 0.0)]})
    sweep = SweepInfo(name="s", kind="grid", arms=(ArmInfo("a", "arm A"),))
    assert (seed_band(t, EVAL)["lo"] < 0).all()                          # the raw t band goes below 0
    ctx = F._context(t, sweep, "grad_step", None)
    fig, ax = F._new_figure()
    F._draw(ctx, ax[0], EVAL, sweep.arms[0])
    lo, hi = F._data_range(ax[0])
    assert lo >= 0.0 and hi <= 100.0
    lone = _tidy({("a", 0): [(0, 0, 0.1), (1, 10, 0.5), (2, 20, 0.2)],
                  ("a", 1): [(1, 10, 0.9)]})                          # only step 1 has two seeds
    ctx = F._context(lone, sweep, "grad_step", None)
    fig, ax = F._new_figure()
    F._draw(ctx, ax[0], EVAL, sweep.arms[0])
    assert F._data_range(ax[0])[1] < 100.0 * (0.7 + 0.2)                  # not sized by step 1's wide band
