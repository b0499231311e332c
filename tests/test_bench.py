"""Every benchmark runs a tiny smoke here, so none of them can rot. Timings are printed by the
benchmarks themselves (`make bench`); nothing below asserts a speed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _bench(module: str, *args: str, timeout: int = 900) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_WAIT_POLICY": "PASSIVE"}
    p = subprocess.run([sys.executable, "-m", f"bench.{module}", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"bench.{module} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-4000:]}"
    return p.stdout


def _rows(out: str, first_cell: str) -> list[list[str]]:
    return [[c.strip() for c in l.strip().strip("|").split("|")] for l in out.splitlines()
            if l.startswith(f"| {first_cell}")]


@pytest.mark.slow
def test_bench_trl_smoke_runs_all_three_sides():
    """Ours, TRL with transformers generation, TRL with vLLM colocate (weight sync through
    reload_weights): each trains 2 steps and the table has a finite ratio for both TRL sides."""
    out = _bench("bench_trl", "--smoke")
    rows = _rows(out, "tiny-3m")
    sides = {r[2]: r for r in rows if len(r) == 5}
    assert set(sides) == {"ours", "trl-hf", "trl-vllm"}, out
    for side in ("trl-hf", "trl-vllm"):
        ratio = re.search(r"\*\*([0-9.]+)x\*\*", sides[side][4])
        assert ratio and 0 < float(ratio.group(1)) < 100, sides[side]
    assert "Where our step goes" in out and "Target ours <= 0.5x TRL" in out


def test_bench_flops_smoke_reports_fraction_of_ceiling():
    out = _bench("bench_flops", "--smoke")
    rows = _rows(out, "fp32")
    assert rows, out
    real, padded = int(rows[0][3]), int(rows[0][4])
    assert 0 < real <= padded
    assert float(rows[0][6]) > 0 and rows[0][7].endswith("%")
    assert "Best update-phase fraction of the ceiling: fp32" in out


def test_step_breakdown_reads_the_committed_mini_snapshot():
    out = _bench("step_breakdown", "--snapshot", "results/table1-mini-v1/snapshot")
    assert "runs: snapshot results/table1-mini-v1/snapshot (18 runs)" in out
    ds = [r for r in _rows(out, "dynamic_sampling") if len(r) == 5]
    assert ds and ds[0][1] == "True" and float(ds[0][3]) > float(_rows(out, "grpo")[1][3])
    assert "## Steps to a fixed accuracy" in out


def test_scaling_sketch_is_labelled_arithmetic():
    out = _bench("scaling_sketch")
    assert "not a measurement" in out.lower() or "arithmetic" in out.lower()


@pytest.mark.slow
def test_bench_rollout_smoke():
    out = _bench("bench_rollout", "--prompts", "4", "--n", "2", "--max-tokens", "8", "--repeats", "1",
                 "--hf-repeats", "1")
    assert "ours" in out and "raw" in out
