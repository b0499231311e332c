"""The mini reproduction's pipeline end to end, small: base model → sweep (local executor,
real vLLM, real MLflow) → figures, Table 1 and report. Keeps `make demo` from rotting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_step_mini_sweep_from_base_model_to_report(tmp_path):
    from dapo.base_model import resolve_policy_path
    base = resolve_policy_path("mini-base:150")  # the cached quick base model of test_train
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    sets = [f"model.path={base}", "train.rollout_steps=2", "eval.every=1",
            "eval.datasets=[{name: arith-eval, limit: 8}]", "eval.k=8", "rollout.n=4",
            "train.batch_prompts=4", "train.mini_batch_prompts=2", "train.micro_batch_seqs=8",
            "algo.dynamic_sampling.on_exhausted=proceed", "logging.progress=false"]
    cmd = [sys.executable, "-m", "dapo.cli", "sweep", "submit", "sweeps/demo.yaml", "--cluster", "local",
           "--output", str(tmp_path / "runs")]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count(": done") == 2, p.stdout
    out = tmp_path / "results"
    p = subprocess.run([sys.executable, "-m", "dapo.cli", "figures", "sweeps/demo.yaml", "--output",
                        str(tmp_path / "runs"), "--out", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = pd.read_csv(out / "table1.csv")
    assert table["arm"].tolist() == ["grpo", "dapo"] and table["label"].tolist() == ["naive GRPO", "DAPO"]
    assert table["ours"].between(0, 100).all() and (table["grad_steps"] == 4).all()
    report = (out / "report.md").read_text()
    assert "Table 1" in report and "figures/fig1.png" in report
    assert (out / "figures" / "fig1.png").stat().st_size > 10_000
    assert (out / "snapshot" / "runs.parquet").exists()
