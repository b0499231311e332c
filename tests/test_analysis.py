"""Analysis: MLflow → tidy table → stats → figures / Table 1 / report, on runs with known values.

The fixture writes a real MLflow store (sqlite) the way the training loop does: one run per
(arm, seed), dapo.* tags, flattened params + config.yaml, metrics at step = grad_step with
progress/rollout_step and progress/grad_step beside them. Sweep "tiny" is a 3-row ladder:

    grpo   (eps_high 0.2,  seq_mean_token_mean)   seed finals 0.1 0.2 0.3    paper 30
    clip   (eps_high 0.28, seq_mean_token_mean)   seed finals 0.3 0.35 0.4  paper 38
    token  (eps_high 0.28, token_mean)            seed finals 0.5 0.5 0.5   paper None

Grad steps 0..9, two per rollout step (rollout_step = ceil(g / 2)); evaluations at grad
steps 0, 3, 6, 9 (value 0 at step 0, the seed's final at 3, 6, 9, so the mean of the last
3 evaluations is exactly that final); wall clock 60 s per grad step.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

from analysis.arms import infer_sweep_info
from analysis.metric_names import primary_metric
from analysis.runs import (ArmInfo, SweepInfo, TIDY_COLUMNS, load_runs, load_snapshot, normalize_tidy, read_meta,
                           snapshot)
from analysis.stats import bootstrap_ci, run_finals, seed_band, t_interval

REPO = Path(__file__).resolve().parents[1]
SWEEP = "tiny"
FINALS = {"grpo": [0.1, 0.2, 0.3], "clip": [0.3, 0.35, 0.4], "token": [0.5, 0.5, 0.5]}
ARM_CFG = {
    "grpo": {"eps_high": 0.2, "loss_agg": "seq_mean_token_mean"},
    "clip": {"eps_high": 0.28, "loss_agg": "seq_mean_token_mean"},
    "token": {"eps_high": 0.28, "loss_agg": "token_mean"},
}
LABELS = {"grpo": "naive GRPO", "clip": "+ clip-higher", "token": "+ token-level loss"}
PAPER = {"grpo": 30.0, "clip": 38.0, "token": None}
EVAL_STEPS = [0, 3, 6, 9]
T0 = 1_700_000_000_000  # ms


def _config(arm: str, seed: int) -> dict:
    c = ARM_CFG[arm]
    return {"name": f"{arm}-{seed}", "output_dir": f"runs/{arm}/{seed}",
            "algo": {"clip": {"eps_low": 0.2, "eps_high": c["eps_high"]}, "loss_agg": c["loss_agg"],
                     "overlong": {"filter": False, "soft_punish": False},
                     "dynamic_sampling": {"enabled": False}},
            "train": {"seed": seed, "lr": 1e-6}, "logging": {"sweep": SWEEP, "arm": arm}}


def entropy(arm: str, seed: int, g: int) -> float:
    return 1.0 - 0.01 * g + 0.001 * seed + (0.2 if arm != "grpo" else 0.0)


def _flat(d, p=""):
    out = {}
    for k, v in d.items():
        key = f"{p}.{k}" if p else k
        out.update(_flat(v, key) if isinstance(v, dict) else {key: v})
    return out


def _log_run(client, exp_id, arm, seed, *, with_artifact=True, status="finished", shift=0.0,
             start=T0, relog=False):
    import yaml
    from mlflow.entities import Metric, Param
    run = client.create_run(exp_id, start_time=start, tags={
        "dapo.sweep": SWEEP, "dapo.arm": arm, "dapo.seed": str(seed), "dapo.run_id": f"{arm}-{seed}-hash",
        "dapo.git_commit": "abc123", "dapo.status": status})
    rid = run.info.run_id
    cfg = _config(arm, seed)
    client.log_batch(rid, params=[Param(k, str(v)) for k, v in _flat(cfg).items()])
    if with_artifact:
        client.log_text(rid, yaml.safe_dump(cfg), "config.yaml")
    ms = []
    for g in range(10):
        ts = start + g * 60_000
        pt = {"progress/grad_step": g, "progress/rollout_step": (g + 1) // 2}
        if g >= 1:
            pt.update({"train/entropy": entropy(arm, seed, g) + shift,
                       "train/up_clipped_prob_mean": 0.1 + (0.1 if arm != "grpo" else 0.0),
                       "train/token_prob_mean": 0.8, "rollout/response_len_mean": 100.0 + 10 * g,
                       "rollout/reward_mean": -0.5 + 0.05 * g, "sampling/all_correct_frac": 0.01 * g,
                       "train/grad_norm": float("nan") if g == 5 else 0.5})
        if g in EVAL_STEPS:
            f = 0.0 if g == 0 else FINALS[arm][seed] + shift
            pt.update({"eval/arith/avg_at_8": f, "eval/arith/pass_at_8": min(1.0, 2 * f),
                       "eval/arith/cons_at_8": f * 1.1})
        ms += [Metric(k, float(v), ts, g) for k, v in pt.items()]
    if relog:  # a resumed run re-logs step 9's entropy later: the last value wins
        ms.append(Metric("train/entropy", 123.0, start + 5_000, 9))
        ms.append(Metric("train/entropy", entropy(arm, seed, 9), start + 10 * 60_000, 9))
    for i in range(0, len(ms), 200):
        client.log_batch(rid, metrics=ms[i:i + 200])
    client.set_terminated(rid, "FINISHED" if status == "finished" else "RUNNING")
    return rid


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sqlite MLflow store with the 'tiny' sweep: 9 kept runs + 1 superseded restart."""
    from mlflow.tracking import MlflowClient
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(SWEEP, artifact_location=str(root / "artifacts"))
    # An earlier, crashed attempt of grpo/seed 0 (same dapo.run_id): must be dropped.
    _log_run(client, exp, "grpo", 0, status="running", shift=5.0, start=T0 - 3_600_000)
    ids = {}
    for arm in ARM_CFG:
        for seed in range(3):
            ids[arm, seed] = _log_run(client, exp, arm, seed, with_artifact=(arm, seed) != ("clip", 2),
                                      relog=(arm, seed) == ("token", 1))
    return uri, ids


@pytest.fixture(scope="module")
def loaded(store):
    uri, _ = store
    return load_runs(uri, SWEEP)


@pytest.fixture(scope="module")
def sweep():
    return SweepInfo(name=SWEEP, kind="ladder", metric="eval/arith/avg_at_8", final_k=3, arms=tuple(
        ArmInfo(name=a, label=LABELS[a], overrides={"algo.clip.eps_high": ARM_CFG[a]["eps_high"]},
                paper=PAPER[a]) for a in ARM_CFG))


# --------------------------------------------------------------------------- runs
def test_load_runs_tidy_table(store, loaded):
    _, ids = store
    tidy, configs = loaded
    assert list(tidy.columns) == TIDY_COLUMNS
    assert tidy["run"].nunique() == 9 and set(configs) == set(ids.values())  # the crashed attempt is gone
    assert tidy.dtypes["seed"] == np.int64 and tidy.dtypes["grad_step"] == np.int64
    assert str(tidy.dtypes["rollout_step"]) == "Int64" and tidy.dtypes["value"] == np.float64
    assert not tidy["metric"].str.startswith("progress/").any()
    assert sorted(tidy["metric"].unique()) == sorted([
        "eval/arith/avg_at_8", "eval/arith/cons_at_8", "eval/arith/pass_at_8", "rollout/response_len_mean",
        "rollout/reward_mean", "sampling/all_correct_frac", "train/entropy", "train/grad_norm",
        "train/token_prob_mean", "train/up_clipped_prob_mean"])
    r = tidy[(tidy["run"] == ids["clip", 1])]
    assert set(r[["run_id", "sweep", "arm", "seed"]].itertuples(index=False, name=None)) == {
        ("clip-1-hash", SWEEP, "clip", 1)}
    ev = r[r["metric"] == "eval/arith/avg_at_8"].sort_values("grad_step")
    assert ev["grad_step"].tolist() == EVAL_STEPS
    assert ev["rollout_step"].tolist() == [0, 2, 3, 5]            # ceil(g / 2)
    assert ev["value"].tolist() == [0.0, 0.35, 0.35, 0.35]
    assert ev["time"].tolist() == [0.0, 180.0, 360.0, 540.0]      # seconds since run start
    ent = r[r["metric"] == "train/entropy"].sort_values("grad_step")
    assert ent["grad_step"].tolist() == list(range(1, 10))
    np.testing.assert_array_equal(ent["value"], [entropy("clip", 1, g) for g in range(1, 10)])
    # grad_norm NaN at step 5 comes back as NaN
    gn = r[r["metric"] == "train/grad_norm"].set_index("grad_step")["value"]
    assert math.isnan(gn[5]) and gn[4] == 0.5
    # re-logged point: the later value wins, once
    t = tidy[(tidy["run"] == ids["token", 1]) & (tidy["metric"] == "train/entropy") & (tidy["grad_step"] == 9)]
    assert t["value"].tolist() == [entropy("token", 1, 9)]


def test_configs_from_artifact_and_params(store, loaded):
    _, ids = store
    _, configs = loaded
    assert configs[ids["clip", 1]] == _config("clip", 1)                # config.yaml artifact
    c = configs[ids["clip", 2]]                                          # no artifact: params, typed
    assert c["algo"]["clip"]["eps_high"] == 0.28 and c["algo"]["overlong"]["filter"] is False
    assert c["algo"]["loss_agg"] == "seq_mean_token_mean" and c["train"]["seed"] == 2


def test_bulk_sql_path_equals_client_path(store, loaded, monkeypatch):
    import analysis.runs as runs
    uri, _ = store
    monkeypatch.setattr(runs, "_bulk_sql_metrics", lambda *a, **k: None)
    slow, slow_cfg = runs.load_runs(uri, SWEEP)
    pdt.assert_frame_equal(slow, loaded[0])
    assert slow_cfg == loaded[1]


def test_infer_sweep_info_from_tags(loaded):
    tidy, configs = loaded
    s = infer_sweep_info(tidy, configs, SWEEP)
    assert [a.name for a in s.arms] == ["grpo", "clip", "token"]
    assert s.kind == "ladder" and s.metric == "eval/arith/avg_at_8" == primary_metric(tidy)
    assert s.arms[1].overrides == {"algo.clip.eps_high": 0.28, "algo.loss_agg": "seq_mean_token_mean"}
    assert all(a.paper is None for a in s.arms)


def test_snapshot_round_trip(loaded, sweep, tmp_path):
    tidy, configs = loaded
    d = snapshot(tidy, configs, sweep, tmp_path / "results" / SWEEP / "snapshot",
                 command="dapo figures --sweep tiny", commit="deadbeef", tracking_uri="sqlite:///x.db")
    assert sorted(p.name for p in d.iterdir()) == ["configs.json", "meta.json", "runs.parquet", "sweep.json"]
    tidy2, configs2, sweep2 = load_snapshot(d)
    pdt.assert_frame_equal(tidy2, tidy, check_dtype=True, check_exact=True)
    assert configs2 == configs and sweep2 == sweep
    meta = read_meta(d)
    assert meta["command"] == "dapo figures --sweep tiny" and meta["commit"] == "deadbeef"
    assert meta["mlflow_uri"] == "sqlite:///x.db" and meta["created"] and meta["n_runs"] == 9


# --------------------------------------------------------------------------- stats
def test_bootstrap_ci_by_hand():
    mean, lo, hi = bootstrap_ci([0.1, 0.2, 0.3], n_boot=10000, seed=0)
    assert mean == pytest.approx(0.2, abs=1e-15)
    assert 0.1 - 1e-12 <= lo <= mean <= hi <= 0.3 + 1e-12
    # Direct recomputation: resample 3 of 3 with replacement, 10 000 times, percentiles 2.5 / 97.5.
    v = np.array([0.1, 0.2, 0.3])
    boots = v[np.random.default_rng(0).integers(0, 3, size=(10000, 3))].mean(axis=1)
    assert (lo, hi) == tuple(np.percentile(boots, [2.5, 97.5]))
    # a tighter alpha widens nothing, a looser one narrows: 50% interval strictly inside
    _, lo50, hi50 = bootstrap_ci(v, alpha=0.5)
    assert lo <= lo50 < 0.2 < hi50 <= hi
    assert bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)
    assert all(math.isnan(x) for x in bootstrap_ci([]))
    assert bootstrap_ci([0.1, np.nan, 0.3])[0] == pytest.approx(0.2)      # NaN dropped


def test_seed_band_matches_t_interval(loaded):
    tidy, _ = loaded
    band = seed_band(tidy, "train/entropy")
    assert list(band.columns) == ["arm", "grad_step", "mean", "lo", "hi", "n"]
    assert len(band) == 3 * 9 and (band["n"] == 3).all()
    for arm in ARM_CFG:
        for g in (1, 5, 9):
            vals = [entropy(arm, s, g) for s in range(3)]
            row = band[(band["arm"] == arm) & (band["grad_step"] == g)].iloc[0]
            iv = t_interval(vals)
            np.testing.assert_allclose([row["mean"], row["lo"], row["hi"]], [iv.mean, iv.lo, iv.hi], rtol=1e-12,
                                       atol=1e-15)
    # one seed: no band (a single run's value is not an interval)
    one = seed_band(tidy[tidy["seed"] == 0], "train/entropy")
    assert one["lo"].isna().all() and one["hi"].isna().all() and one["mean"].notna().all()
    # rollout steps: two grad steps per rollout step are averaged per run first
    rb = seed_band(tidy, "train/entropy", x="rollout_step")
    r = rb[(rb["arm"] == "grpo") & (rb["rollout_step"] == 2)].iloc[0]
    assert r["mean"] == pytest.approx(np.mean([entropy("grpo", s, g) for s in range(3) for g in (3, 4)]))


def test_seed_band_with_missing_seeds_matches_t_interval():
    rows = []
    for seed, vals in enumerate([[1.0, 2.0, 3.0], [2.0, np.nan, 5.0], [4.0, 4.5, np.nan]]):
        for x, v in enumerate(vals):
            if not np.isnan(v):
                rows.append(dict(run=f"r{seed}", run_id="h", sweep="s", arm="a", seed=seed,
                                 rollout_step=x, grad_step=x, time=0.0, metric="m", value=v))
    band = seed_band(normalize_tidy(pd.DataFrame(rows)), "m").set_index("grad_step")
    for x, vals in enumerate([[1, 2, 4], [2, 4.5], [3, 5]]):
        iv = t_interval(vals)
        np.testing.assert_allclose(band.loc[x, ["mean", "lo", "hi"]].to_numpy(float), [iv.mean, iv.lo, iv.hi],
                                   rtol=1e-12)
        assert band.loc[x, "n"] == len(vals)


# --------------------------------------------------------------------------- tables
def test_table1(loaded, sweep):
    from analysis.tables import table1, format_table1, to_markdown, to_latex
    tidy, _ = loaded
    t = table1(tidy, sweep, final_k=3)
    assert t["arm"].tolist() == ["grpo", "clip", "token"]
    assert t["label"].tolist() == [LABELS[a] for a in ARM_CFG]
    g = t.set_index("arm").loc["grpo"]
    iv = t_interval([0.1, 0.2, 0.3])
    lo, hi = iv.lo, iv.hi
    assert g["ours"] == pytest.approx(20.0) and g["ci_lo"] == pytest.approx(100 * lo)
    assert g["ci_hi"] == pytest.approx(100 * hi) and g["n_seeds"] == 3
    # arith avg@8 is not the paper's AIME avg@32: the paper's value is kept, no difference computed
    assert g["paper"] == 30.0 and math.isnan(g["diff"]) and t.attrs["vs_paper"] is False
    # these runs log no time/step_s: no loop time, and never the wall span between first and last point
    assert g["grad_steps"] == 9 and g["rollout_steps"] == 5 and math.isnan(g["wall_min"])
    c = t.set_index("arm").loc["clip"]
    assert c["ours"] == pytest.approx(35.0) and math.isnan(c["diff"])
    k = t.set_index("arm").loc["token"]
    assert k["ours"] == pytest.approx(50.0) and k["ci_lo"] == pytest.approx(50.0) and k["ci_hi"] == pytest.approx(50.0)
    assert math.isnan(k["paper"]) and math.isnan(k["diff"])
    # final_k=1: the last evaluation only (same here by construction); per-run finals
    f = run_finals(tidy, "eval/arith/avg_at_8", 3)
    assert sorted(f[f["arm"] == "clip"]["final"].round(12)) == [0.3, 0.35, 0.4]
    # an arm of the sweep without runs yet keeps its row (paper value, no numbers)
    more = SweepInfo(name=SWEEP, kind="ladder", arms=sweep.arms + (ArmInfo("ds", "+ dynamic sampling", {}, 50.0),))
    m = table1(tidy, more).set_index("arm").loc["ds"]
    assert m["n_seeds"] == 0 and m["paper"] == 50.0 and math.isnan(m["ours"]) and math.isnan(m["diff"])
    md = to_markdown(format_table1(t))
    assert "| naive GRPO" in md and "20.0 [" in md and "ours − paper" not in md and "-10.0" not in md
    assert "paper's value (Qwen2.5-32B, AIME 2024 avg@32)" in md and "| 30 " in md
    assert md.count("\n") == 2 + 3
    tex = to_latex(format_table1(t), caption="x_y")
    assert r"\toprule" in tex and r"naive GRPO" in tex and r"x\_y" in tex and r"\%" in tex


def test_table1_vs_paper_only_on_the_papers_metric(loaded, sweep):
    """Scored on AIME 2024 avg@32 (the paper's task and metric), "ours − paper" is computed and shown."""
    from analysis.tables import format_table1, table1, to_markdown
    tidy, _ = loaded
    aime = tidy.assign(metric=tidy["metric"].str.replace("eval/arith/", "eval/aime24/").str.replace("_at_8", "_at_32"))
    s = SweepInfo(name=SWEEP, kind="ladder", metric="eval/aime24/avg_at_32", arms=sweep.arms)
    t = table1(aime, s, final_k=3).set_index("arm")
    assert t.attrs["vs_paper"] is True
    assert t.loc["grpo", "diff"] == pytest.approx(20.0 - 30.0) and t.loc["clip", "diff"] == pytest.approx(35.0 - 38.0)
    assert math.isnan(t.loc["token", "diff"])                        # no paper value for this arm
    md = to_markdown(format_table1(table1(aime, s, final_k=3)))
    assert "| paper " in md and "ours − paper" in md and "-10.0" in md and "-3.0" in md
    assert "AIME 2024 avg@32 (%), ours" in md
    # Fig. 1 on the paper's metric: the paper's reference line (R1-Zero-Qwen-32B, 47) beside our two arms
    from analysis import figures as F
    f1 = F.fig1(aime, s)
    assert _legend(f1.axes[0]) == ["naive GRPO", "+ token-level loss", "DeepSeek-R1-Zero-Qwen-32B (paper): 47"]
    assert f1._suptitle.get_text().startswith("Fig. 1: AIME 2024")            # no "(mini)" tag on the paper's task


def test_compare_table(loaded):
    from analysis.tables import compare_table
    tidy, _ = loaded
    c = compare_table(tidy, "grpo", "clip", final_k=3).set_index("metric")
    assert set(c.index) == set(tidy["metric"].unique())
    assert c.loc["eval/arith/avg_at_8", "grpo"] == pytest.approx(20.0)
    assert c.loc["eval/arith/avg_at_8", "clip"] == pytest.approx(35.0)
    assert c.loc["eval/arith/avg_at_8", "diff"] == pytest.approx(15.0)
    assert c.loc["eval/arith/avg_at_8", "unit"] == "%"
    want = np.mean([np.mean([entropy("clip", s, g) for g in (7, 8, 9)]) for s in range(3)])
    assert c.loc["train/entropy", "clip"] == pytest.approx(want) and c.loc["train/entropy", "unit"] == ""


# --------------------------------------------------------------------------- figures
def _labels(ax):
    return [ln.get_label() for ln in ax.get_lines()]


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_figures_lines_and_axes(loaded, sweep):
    from analysis import figures as F
    tidy, configs = loaded
    f1 = F.fig1(tidy, sweep, configs=configs)
    base, ax = f1.axes                                             # (a) baseline beside DAPO, (b) DAPO's avg/pass/cons
    assert _labels(base) == ["naive GRPO", "+ token-level loss"] == _legend(base)   # ladder: first and last rows
    np.testing.assert_allclose(base.get_lines()[0].get_ydata(), [0.0, 20.0, 20.0, 20.0])
    assert _labels(ax) == ["avg@8", "pass@8", "cons@8"] == _legend(ax)
    assert ax.get_xlabel() == "gradient step" and ax.get_ylabel() == "accuracy (%)"
    assert "token-level loss" in ax.get_title("left")                # ladder: the last row is the DAPO arm
    assert f1._suptitle.get_text().startswith("Fig. 1 (mini):")
    ys = ax.get_lines()[0].get_ydata()
    assert ys[-1] == pytest.approx(50.0)                          # plotted in %
    assert not any("R1-Zero" in t for t in _legend(base))          # the paper's reference only on its metric
    # y axes fit the data: (a) spans 0..50 % (step 0 to the token arm's 50; the t bands a little beyond)
    # plus a 5 % margin, not 0..100
    lo, hi = base.get_ylim()
    assert -5 < lo <= -2.5 and 52.5 <= hi < 55

    f2 = F.fig2(tidy, sweep, configs=configs)
    a, b = f2.axes
    assert _labels(a) == _labels(b) == ["naive GRPO", "+ clip-higher"] == _legend(a)
    assert a.get_ylabel() == "avg@8 (%)" and b.get_ylabel() == "entropy (nats/token)"
    assert a.get_xlabel() == b.get_xlabel() == "gradient step"
    assert f2._suptitle.get_text().startswith("Fig. 2 (mini):") and "Clip-Higher" in f2._suptitle.get_text()
    np.testing.assert_allclose(b.get_lines()[0].get_ydata(), [np.mean([entropy("grpo", s, g) for s in range(3)])
                                                            for g in range(1, 10)])
    f3 = F.fig3(tidy, sweep, configs=configs)
    assert [_labels(ax) for ax in f3.axes] == [["naive GRPO", "+ clip-higher"]] * 2
    assert f3.axes[1].get_ylabel() == "prompts with accuracy 1 (%)"
    f4 = F.fig4(tidy, sweep, configs=configs)
    assert [_labels(ax) for ax in f4.axes] == [["+ clip-higher", "+ token-level loss"]] * 2
    assert [ax.get_ylabel() for ax in f4.axes] == ["entropy (nats/token)", "response length (tokens)"]
    assert F.fig5(tidy, sweep, configs=configs) is None              # no arm toggles overlong filtering
    assert F.fig6(tidy, sweep, configs=configs) is None              # nor dynamic sampling
    f7 = F.fig7(tidy, sweep, configs=configs)
    assert [ax.get_ylabel() for ax in f7.axes if ax.get_visible()] == [
        "response length (tokens)", "mean reward", "entropy (nats/token)", "mean token probability"]
    assert all(_labels(ax) == ["+ token-level loss"] for ax in f7.axes)
    # one colour per arm, everywhere
    col = lambda fig, ax_i, label: next(ln.get_color() for ln in fig.axes[ax_i].get_lines() if ln.get_label() == label)
    assert col(f2, 0, "+ clip-higher") == col(f3, 0, "+ clip-higher") == col(f4, 1, "+ clip-higher")
    assert col(f4, 0, "+ token-level loss") == col(f7, 2, "+ token-level loss")
    assert col(f2, 0, "naive GRPO") != col(f2, 0, "+ clip-higher")
    # rollout steps on x
    f2r = F.fig2(tidy, sweep, x="rollout_step", configs=configs)
    assert f2r.axes[1].get_xlabel() == "rollout step"
    assert list(f2r.axes[1].get_lines()[0].get_xdata()) == [1, 2, 3, 4, 5]


def _curve_tidy(values: dict[str, list[float]], arm="a", run="r0") -> pd.DataFrame:
    """A one-run tidy table: metric → values at grad steps 1, 2, ..."""
    rows = [dict(run=run, run_id=run, sweep="s", arm=arm, seed=0, rollout_step=g, grad_step=g, time=60.0 * g,
                 metric=m, value=v) for m, vs in values.items() for g, v in enumerate(vs, start=1)]
    return normalize_tidy(pd.DataFrame(rows))


def test_mask_undefined_up_clipped_prob():
    """train/up_clipped_prob_mean is logged as 0.0 in a step with no up-clipped token
    (train/clip_frac_high = 0): that point is undefined (NaN), the others are kept."""
    from analysis.metric_names import mask_undefined
    tidy = _curve_tidy({"train/up_clipped_prob_mean": [0.0, 0.3, 0.0, 0.25],
                        "train/clip_frac_high": [0.0, 0.01, 0.0, 0.002], "train/entropy": [0.0, 1.0, 0.0, 1.0]})
    out = mask_undefined(tidy)
    up = out[out["metric"] == "train/up_clipped_prob_mean"]["value"].to_numpy()
    np.testing.assert_array_equal(np.isnan(up), [True, False, True, False])
    assert up[1] == 0.3 and up[3] == 0.25
    assert (out[out["metric"] != "train/up_clipped_prob_mean"]["value"].to_numpy() ==
            tidy[tidy["metric"] != "train/up_clipped_prob_mean"]["value"].to_numpy()).all()   # other metrics as logged
    assert tidy["value"].notna().all()                                                        # input untouched
    # without the witness metric: a value of exactly 0 is the undefined one
    only = mask_undefined(_curve_tidy({"train/up_clipped_prob_mean": [0.0, 0.4]}))
    assert np.isnan(only["value"].iloc[0]) and only["value"].iloc[1] == 0.4
    # the comparison table averages the defined points only: (0.3 + 0.25) / 2, not (0 + 0.3 + 0 + 0.25) / 4
    from analysis.tables import compare_table
    two = pd.concat([tidy, _curve_tidy({"train/up_clipped_prob_mean": [0.5] * 4, "train/clip_frac_high": [0.1] * 4},
                                       arm="b", run="r1")], ignore_index=True)
    c = compare_table(two, "a", "b", final_k=4).set_index("metric")
    assert c.loc["train/up_clipped_prob_mean", "a"] == pytest.approx(0.275)
    assert c.loc["train/up_clipped_prob_mean", "diff"] == pytest.approx(0.5 - 0.275)


def test_fig3_steps_without_up_clipped_tokens_are_missing():
    from analysis import figures as F
    s = SweepInfo(name="s", kind="grid", arms=(ArmInfo("a"),))
    tidy = _curve_tidy({"train/up_clipped_prob_mean": [0.0, 0.3, 0.0, 0.25],
                        "train/clip_frac_high": [0.0, 0.01, 0.0, 0.002],
                        "sampling/all_correct_frac": [0.1, 0.2, 0.3, 0.4]})
    ctx = F._context(tidy, s, "grad_step", None)
    fig, note = F._fig3(ctx)
    ys = fig.axes[0].get_lines()[0].get_ydata()
    np.testing.assert_array_equal(np.isnan(ys), [True, False, True, False])   # gaps, not zeros
    assert ys[1] == pytest.approx(0.3) and "2 of 4 points have no up-clipped token" in note
    # no up-clipped token anywhere: the panel draws nothing and says so
    none = _curve_tidy({"train/up_clipped_prob_mean": [0.0, 0.0], "train/clip_frac_high": [0.0, 0.0],
                        "sampling/all_correct_frac": [0.1, 0.2]})
    fig, note = F._fig3(F._context(none, s, "grad_step", None))
    assert not fig.axes[0].get_lines() and "no token was clipped" in fig.axes[0].texts[0].get_text()
    assert "no up-clipped token in any step" in note


def test_percent_axis_fits_the_data():
    """A 2-point difference around 35 % is drawn on a few-point axis, not squeezed into 0–37 %."""
    from analysis import figures as F
    fig, (ax,) = F._new_figure()
    ax.plot([0, 1, 2], [35.0, 36.0, 37.0])
    ax.fill_between([0, 1, 2], [33.0, 35.0, 36.5], [35.5, 37.0, 37.5])
    ax._dapo_percent = True
    F._percent_axis(ax)
    assert ax.get_ylim() == pytest.approx((33.0 - 0.225, 37.5 + 0.225))          # band 33..37.5, 5 % margin
    fig, (ax,) = F._new_figure()
    ax.plot([0, 1], [50.0, 50.0])                                                 # flat: at least MIN_SPAN_PCT
    ax._dapo_percent = True
    F._percent_axis(ax)
    assert ax.get_ylim() == pytest.approx((48.0 - 0.2, 52.0 + 0.2))
    fig, (ax,) = F._new_figure()
    ax.plot([0, 1], [0.0, 99.0])
    ax.fill_between([0, 1], [-3.0, 97.0], [2.0, 103.0])                        # a band past 0 and 100: clipped
    ax._dapo_percent = True
    F._percent_axis(ax)
    assert ax.get_ylim() == pytest.approx((-5.3, 105.3))                         # span 106 → margin 5.3


def test_save_figure_same_bytes_every_time(loaded, sweep, tmp_path):
    """PNG, PDF and SVG of one figure, drawn and saved twice (a second apart): identical bytes, no date inside."""
    import time
    from analysis import figures as F
    tidy, configs = loaded
    a = F.save_figure(F.fig2(tidy, sweep, configs=configs), tmp_path / "a" / "fig2", ("png", "pdf", "svg"))
    time.sleep(1.1)
    b = F.save_figure(F.fig2(tidy, sweep, configs=configs), tmp_path / "b" / "fig2", ("png", "pdf", "svg"))
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes(), x.name
    assert b"CreationDate" not in a[1].read_bytes() and b"<dc:date>" not in a[2].read_bytes()


def test_figures_without_configs_use_overrides(loaded, sweep):
    """Only the sweep file (no resolved configs): toggles come from the arms' overrides."""
    from analysis import figures as F
    tidy, _ = loaded
    s = SweepInfo(name=SWEEP, kind="ladder", arms=tuple(
        ArmInfo(a, LABELS[a], {"algo.clip.eps_high": ARM_CFG[a]["eps_high"], "algo.clip.eps_low": 0.2,
                               "algo.loss_agg": ARM_CFG[a]["loss_agg"]}) for a in ARM_CFG))
    assert _labels(F.fig2(tidy, s).axes[0]) == ["naive GRPO", "+ clip-higher"]
    assert _labels(F.fig4(tidy, s).axes[0]) == ["+ clip-higher", "+ token-level loss"]


def _toy(arms: dict[str, dict]) -> tuple[pd.DataFrame, dict]:
    rows, configs = [], {}
    for i, (arm, flat) in enumerate(arms.items()):
        run = f"run{i}"
        configs[run] = {"algo": {"clip": {"eps_low": 0.2, "eps_high": flat.get("clip", 0.2)},
                                 "loss_agg": "token_mean" if flat.get("token") else "seq_mean_token_mean",
                                 "overlong": {"filter": bool(flat.get("filter")), "soft_punish": bool(flat.get("soft"))},
                                 "dynamic_sampling": {"enabled": bool(flat.get("ds"))}},
                        "train": {"lr": flat.get("lr", 1e-6)}}
        rows.append(dict(run=run, run_id=run, sweep="s", arm=arm, seed=0, rollout_step=0, grad_step=0,
                         time=0.0, metric="train/entropy", value=1.0))
    return normalize_tidy(pd.DataFrame(rows)), configs


@pytest.mark.parametrize("kind,arms,toggle,want", [
    ("leave_one_out",
     {"dapo": dict(clip=0.28, token=1, ds=1, soft=1), "no_clip": dict(token=1, ds=1, soft=1),
      "no_token": dict(clip=0.28, ds=1, soft=1), "no_ds": dict(clip=0.28, token=1, soft=1)},
     "clip_higher", ("no_clip", "dapo")),
    ("leave_one_out",
     {"dapo": dict(clip=0.28, token=1, ds=1, soft=1), "no_clip": dict(token=1, ds=1, soft=1),
      "no_token": dict(clip=0.28, ds=1, soft=1), "no_ds": dict(clip=0.28, token=1, soft=1)},
     "dynamic_sampling", ("no_ds", "dapo")),
    ("one_at_a_time",
     {"grpo": {}, "clip": dict(clip=0.28), "token": dict(token=1), "ds": dict(ds=1)},
     "token_loss", ("grpo", "token")),
    ("ladder",
     {"grpo": {}, "filter": dict(filter=1), "clip": dict(filter=1, clip=0.28),
      "soft": dict(filter=1, clip=0.28, soft=1)},
     "overlong_filter", ("grpo", "filter")),
    ("grid",  # only a pair that also differs in lr: chosen, flagged as not exact
     {"a": dict(lr=1e-6), "b": dict(clip=0.28, lr=2e-6)}, "clip_higher", ("a", "b")),
    ("grid", {"a": {}, "b": dict(token=1)}, "dynamic_sampling", None),
    ("grid",  # an ε_high grid: 0.2 vs the paper's 0.28
     {"e20": {}, "e24": dict(clip=0.24), "e28": dict(clip=0.28), "e32": dict(clip=0.32)},
     "clip_higher", ("e20", "e28")),
])
def test_find_pair(kind, arms, toggle, want):
    from analysis.arms import find_pair
    tidy, configs = _toy(arms)
    s = SweepInfo(name="s", kind=kind, arms=tuple(ArmInfo(a) for a in arms))
    p = find_pair(toggle, tidy, s, configs)
    if want is None:
        assert p is None
        return
    assert (p.off.name, p.on.name) == want
    assert p.exact == (want != ("a", "b"))
    if want == ("a", "b"):
        assert p.other_keys == ("train.lr",) and "train.lr" in p.describe()


# --------------------------------------------------------------------------- report + CLI
def test_write_report(loaded, sweep, tmp_path):
    from analysis.report import write_report
    tidy, configs = loaded
    out = tmp_path / "report"
    paths = write_report(tidy, configs, sweep, out, final_k=3, reading="Clip-Higher keeps entropy up.")
    names = {p.relative_to(out).as_posix() for p in paths}
    drawn = ["fig1", "fig2", "fig3", "fig4", "fig7"]
    assert {f"figures/{f}.{e}" for f in drawn for e in ("png", "pdf")} <= names
    assert {"table1.md", "table1.csv", "table1.tex", "compare.md", "report.md", "reading.md"} <= names
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    report = (out / "report.md").read_text()
    for f in drawn:
        assert f"](figures/{f}.png)" in report and f"(figures/{f}.pdf)" in report
    # figs 5, 6 and 8 need an overlong-filter / dynamic-sampling / soft-punishment pair this sweep lacks
    assert "Fig. 5" in report and "Fig. 6" in report and "Fig. 8" in report and report.count("Not drawn:") == 3
    assert "overlong filtering" in report and "naive GRPO" in report
    assert "## Reading\n\nClip-Higher keeps entropy up." in report
    csv = pd.read_csv(out / "table1.csv")
    assert csv["ours"].round(6).tolist() == [20.0, 35.0, 50.0]
    compare = (out / "compare.md").read_text()
    assert "Clip-Higher" in compare and "token-level loss" in compare
    # regenerated without a reading: reading.md is kept and embedded
    paths = write_report(tidy, configs, sweep, out, formats=("png",))
    assert out / "reading.md" not in paths
    assert "Clip-Higher keeps entropy up." in (out / "report.md").read_text()
    assert (out / "reading.md").read_text().strip() == "Clip-Higher keeps entropy up."


def test_cli_from_mlflow_without_torch_then_from_snapshot(store, tmp_path):
    """`main` reads MLflow and writes a snapshot + report without importing torch or vllm
    (checked in a fresh interpreter); then regenerates from the snapshot alone."""
    from analysis.report import main
    uri, _ = store
    out = tmp_path / "res"
    code = textwrap.dedent(f"""
        import sys
        from analysis import runs, stats, figures, tables, report
        from bench import bench_analysis
        assert report.main(["--tracking-uri", {uri!r}, "--sweep", {SWEEP!r}, "--to", {str(out)!r}]) == 0
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm"))
        assert not bad, bad
        print("clean")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "clean" in r.stdout, r.stderr[-3000:]
    assert (out / "snapshot" / "runs.parquet").exists() and (out / "report.md").exists()
    meta = json.loads((out / "snapshot" / "meta.json").read_text())
    assert meta["mlflow_uri"] == uri and "--sweep tiny" in meta["command"]
    out2 = tmp_path / "res2"
    assert main(["--from-snapshot", str(out / "snapshot"), "--to", str(out2), "--x", "rollout_step",
                 "--final-k", "2", "--formats", "png"]) == 0
    assert not (out2 / "figures" / "fig2.pdf").exists()
    assert (out2 / "figures" / "fig2.png").exists() and "rollout step" in (out2 / "report.md").read_text()
    assert "report regenerated from that snapshot" not in (out2 / "report.md").read_text()   # same code
    # a snapshot taken by other code: the report names both commits (the data's and the text's)
    from analysis.report import _git_commit
    meta["commit"] = "0" * 40
    (out / "snapshot" / "meta.json").write_text(json.dumps(meta))
    assert main(["--from-snapshot", str(out / "snapshot"), "--to", str(tmp_path / "res3"), "--formats", "png"]) == 0
    assert (f"analysis commit {'0' * 40}; report regenerated from that snapshot at commit {_git_commit()}"
            in (tmp_path / "res3" / "report.md").read_text())
    with pytest.raises(SystemExit):
        main(["--sweep", SWEEP, "--tracking-uri", uri, "--x", "wall"])


def test_regenerate_from_snapshot_twice_gives_identical_bytes(store, tmp_path):
    """`dapo figures --from-snapshot` twice over an unchanged snapshot: every file byte-identical
    (figures carry no timestamps, the report's date is the snapshot's); the default output is the
    folder holding the snapshot; a report from MLflow goes to <runs>/figures/<sweep>/ by default."""
    from analysis.report import main
    uri, _ = store
    runs = tmp_path / "runs"
    runs.mkdir()
    assert main(["--tracking-uri", uri, "--sweep", SWEEP, "--runs", str(runs), "--formats", "png,pdf,svg"]) == 0
    res = runs / "figures" / SWEEP                                   # not results/<sweep>/
    assert (res / "snapshot" / "runs.parquet").exists() and (res / "report.md").exists()
    created = json.loads((res / "snapshot" / "meta.json").read_text())["created"]
    assert f"generated from the runs as snapshotted {created}" in (res / "report.md").read_text()

    def files():
        return {p.relative_to(res).as_posix(): p.read_bytes() for p in sorted(res.rglob("*")) if p.is_file()}

    assert main(["--from-snapshot", str(res / "snapshot"), "--formats", "png,pdf,svg"]) == 0   # in place
    first = files()
    assert main(["--from-snapshot", str(res / "snapshot"), "--formats", "png,pdf,svg"]) == 0
    second = files()
    assert first.keys() == second.keys() and {"figures/fig1.pdf", "figures/fig1.svg", "report.md"} <= first.keys()
    import difflib
    assert [k for k in first if first[k] != second[k]] == [], "".join(difflib.unified_diff(
        first["report.md"].decode().splitlines(True), second["report.md"].decode().splitlines(True), n=0))[:3000]


def test_old_option_names_still_work_with_a_deprecation_line(store, tmp_path, capsys):
    from analysis.report import main
    uri, _ = store
    out = tmp_path / "old"
    assert main(["--tracking-uri", uri, "--sweep", SWEEP, "--out", str(out), "--formats", "png", "--no-snapshot"]) == 0
    err = capsys.readouterr().err
    assert (out / "report.md").exists() and f"[figures] --out is deprecated: use --to {out}" in err
    with pytest.raises(SystemExit):                                 # the old and the new name of one option
        main(["--tracking-uri", uri, "--sweep", SWEEP, "--out", str(out), "--to", str(out)])
    assert "--out is the old name of --to" in capsys.readouterr().err
    assert main(["--sweep", SWEEP, "--output", str(tmp_path / "nowhere")]) == 2   # --output (old --runs), no store
    err = capsys.readouterr().err
    assert "--output is deprecated: use --runs" in err and "point --runs at the sweep's output root" in err


def test_bad_inputs_are_one_line_and_exit_2(store, tmp_path, capsys):
    """A missing spec, a corrupt snapshot, a store that is not there, an unknown sweep: one line
    naming the file/store/sweep, exit code 2, no traceback, and no store created."""
    from analysis.report import main
    uri, _ = store
    bad = tmp_path / "snap"
    bad.mkdir()
    (bad / "runs.parquet").write_text("not parquet")
    missing_db = tmp_path / "none" / "mlruns.db"
    cases = [
        (["sweeps/no-such-sweep.yaml", "--from-snapshot"], "sweeps/no-such-sweep.yaml: no such sweep spec"),
        (["--from-snapshot", str(bad)], f"snapshot {bad} is unreadable: ArrowInvalid"),
        (["--sweep", SWEEP, "--tracking-uri", f"sqlite:///{missing_db}"], f"no tracking store at sqlite:///{missing_db}"),
        (["--sweep", "no-such-sweep", "--tracking-uri", uri], "no MLflow experiment 'no-such-sweep'"),
    ]
    for argv, want in cases:
        assert main(argv + ["--to", str(tmp_path / "out")]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("dapo figures: error: ") and want in err and "\n" not in err, err
    assert not missing_db.exists() and not (tmp_path / "out").exists()


def test_cli_finished_only_leaves_out_runs_still_running(tmp_path):
    """`dapo figures --finished-only` on a sweep in progress: the running run's points are left out."""
    from mlflow.tracking import MlflowClient
    from analysis.report import main
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(SWEEP, artifact_location=str(tmp_path / "artifacts"))
    for seed, status in ((0, "finished"), (1, "finished"), (2, "running")):
        _log_run(client, exp, "grpo", seed, status=status)
    runs_of = lambda out: (out / "snapshot" / "runs.parquet", (out / "report.md").read_text())  # noqa: E731
    for flag, seeds in (([], "0, 1, 2"), (["--finished-only"], "0, 1")):
        out = tmp_path / f"res{len(flag)}"
        assert main(["--tracking-uri", uri, "--sweep", SWEEP, "--to", str(out), "--formats", "png", *flag]) == 0
        parquet, report = runs_of(out)
        assert f"| {seeds} " in report and pd.read_parquet(parquet)["seed"].nunique() == len(seeds.split(", "))


def test_with_snapshot_adds_the_runs_the_store_lacks(tmp_path):
    """A sweep extended with more seeds: the figures take the live store's runs, plus the earlier
    snapshot's runs it does not have (by run id: a run in both comes from the store), and meta.json
    records what was merged."""
    from analysis.runs import merge_snapshot
    def rows(run, run_id, seed, v):
        return [dict(run=run, run_id=run_id, sweep="s", arm="a", seed=seed, rollout_step=1, grad_step=1,
                     time=0.0, metric="m", value=v)]
    old = normalize_tidy(pd.DataFrame(rows("u1", "id0", 0, 1.0) + rows("u2", "id1", 1, 2.0)))
    snap = snapshot(old, {"u1": {"x": 1}, "u2": {"x": 2}}, None, tmp_path / "old", command="c0", commit="abc")
    live = normalize_tidy(pd.DataFrame(rows("u3", "id1", 1, 5.0) + rows("u4", "id2", 2, 3.0)))
    tidy, configs, rec = merge_snapshot(live, {"u3": {"x": 3}, "u4": {"x": 4}}, snap)
    assert sorted(tidy["run_id"]) == ["id0", "id1", "id2"]
    assert tidy.set_index("run_id").loc["id1", "value"] == 5.0              # the store's copy wins
    assert set(configs) == {"u1", "u3", "u4"} and rec["n_runs"] == 1 and rec["commit"] == "abc"
    out = snapshot(tidy, configs, None, tmp_path / "new", extra={"merged": [rec]})
    assert read_meta(out)["merged"][0]["n_runs"] == 1 and read_meta(out)["n_runs"] == 3
    # runs of another sweep with the same resolved config: only the spec's run ids, under its arm names
    only, _, rec2 = merge_snapshot(live, {"u3": {"x": 3}, "u4": {"x": 4}}, snap, arm_of={"id0": "cell"},
                                   sweep_name="g")
    added = only[only["run_id"] == "id0"]
    assert rec2["n_runs"] == 1 and set(added["arm"]) == {"cell"} and set(added["sweep"]) == {"g"}


def test_a_spec_read_from_another_sweeps_store_takes_only_its_runs(store, tmp_path, monkeypatch, capsys):
    """`dapo figures SPEC --sweep OTHER`: the arms two sweeps share ran once, under OTHER; the report of
    SPEC takes from OTHER's store only the runs of SPEC's expansion (by run id), under SPEC's arm and
    sweep names; none of them there: one line, exit 2."""
    import analysis.report as rep
    uri, _ = store
    mine = {f"{arm}-{seed}-hash": name for arm, name in (("grpo", "base"), ("clip", "ch")) for seed in (0, 1)}
    info = SweepInfo(name="pair", kind="one_at_a_time", arms=(ArmInfo("base"), ArmInfo("ch")), final_k=1)
    monkeypatch.setattr(rep, "_spec_sweep_info", lambda path: info)
    monkeypatch.setattr(rep, "_spec_run_arms", lambda path: mine)
    out = tmp_path / "pair"
    assert rep.main(["pair.yaml", "--sweep", SWEEP, "--tracking-uri", uri, "--to", str(out), "--formats", "png"]) == 0
    got = pd.read_parquet(out / "snapshot" / "runs.parquet")
    assert sorted(got["run_id"].unique()) == sorted(mine) and set(got["sweep"]) == {"pair"}
    assert dict(got.drop_duplicates("run_id").set_index("run_id")["arm"]) == mine
    assert f"4 of sweep {SWEEP!r}'s 9 runs are pair.yaml's" in capsys.readouterr().err
    monkeypatch.setattr(rep, "_spec_run_arms", lambda path: {"elsewhere": "base"})
    assert rep.main(["pair.yaml", "--sweep", SWEEP, "--tracking-uri", uri, "--to", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dapo figures: error: none of the 1 runs of pair.yaml are in sweep {SWEEP!r}'s store (9 runs there)"
    assert not (tmp_path / "no").exists()


def test_runs_that_should_start_alike_but_do_not_are_named_at_the_top(loaded, sweep, tmp_path):
    """Runs of one seed with the same model, evaluation and engine settings log one step-0 value;
    one that does not (made on another machine, another build of the model) is named in a warning at
    the report's top; an arm whose engine differs (its rollout dtype) may differ and is not."""
    from analysis.eval_noise import start_mismatches, start_section
    from analysis.report import write_report
    tidy, configs = loaded
    metric = "eval/arith/avg_at_8"
    assert start_mismatches(tidy, configs, metric).empty
    at0 = (tidy["metric"] == metric) & (tidy["rollout_step"] == 0) & (tidy["seed"] == 1)
    moved = tidy.copy()
    moved.loc[at0 & (moved["arm"] == "clip"), "value"] = 0.05
    moved.loc[at0 & (moved["arm"] == "token"), "value"] = 0.07
    run_of = moved[at0].drop_duplicates("arm").set_index("arm")["run"]
    cfg = {r: dict(c) for r, c in configs.items()}
    cfg[run_of["token"]] = {**cfg[run_of["token"]], "model": {"rollout_dtype": "bfloat16"}}   # another engine
    bad = start_mismatches(moved, cfg, metric)
    assert bad.to_dict("list") == {"seed": [1, 1], "arm": ["grpo", "clip"], "value": [0.0, 5.0]}
    text = " ".join(start_section(bad, metric))
    assert "seed 1: grpo 0; clip 5" in text and "token" not in text
    write_report(moved, cfg, sweep, tmp_path / "r", formats=("png",))
    report = (tmp_path / "r" / "report.md").read_text()
    assert report.index("should start alike") < report.index("## The primary family")
    write_report(tidy, configs, sweep, tmp_path / "ok", formats=("png",))
    assert "should start alike" not in (tmp_path / "ok" / "report.md").read_text()
