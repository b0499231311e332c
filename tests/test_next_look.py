"""dapo sweep next-look: a declared stopping rule's next look runs only the undecided comparisons' arms."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

from analysis.looks import plan_next_look

LOOKS, SEEDS = (10, 16), tuple(range(10, 26))
ARMS = ("grpo", "clip_higher", "soft_punish", "token_loss", "dynamic_sampling")


def _family(rows):
    return pd.DataFrame(rows, columns=["comparison", "off", "on", "looks_done", "look"])


def test_look_one_not_done_runs_look_one():
    p = plan_next_look(None, LOOKS, SEEDS, ARMS)
    assert (p.done, p.next_look, p.seeds) == (0, 1, SEEDS[:10])
    half = _family([["a", "grpo", "dynamic_sampling", "10", 0], ["b", "clip_higher", "soft_punish", "", 0]])
    p = plan_next_look(half, LOOKS, SEEDS, ARMS)
    assert (p.done, p.next_look, p.seeds) == (0, 1, SEEDS[:10]) and "not complete" in p.reason


def test_only_the_undecided_comparisons_arms_get_the_next_looks_seeds():
    fam = _family([["+ soft", "clip_higher", "soft_punish", "10", 1],
                   ["+ dyn", "token_loss", "dynamic_sampling", "10", 0],
                   ["dapo vs grpo", "grpo", "dynamic_sampling", "10", 0]])
    p = plan_next_look(fam, LOOKS, SEEDS, ARMS)
    assert (p.done, p.next_look) == (1, 2)
    assert p.seeds == SEEDS[:16]                       # run ids per (arm, seed): 10-19 are already finished
    assert p.arms == ("grpo", "token_loss", "dynamic_sampling")          # spec order; clip_higher/soft_punish stop
    assert p.decided == ("+ soft (look 1)",) and p.undecided == ("+ dyn", "dapo vs grpo")
    assert "seeds [20, 21, 22, 23, 24, 25]" in p.reason


def test_nothing_runs_once_all_are_decided_or_the_last_look_is_done():
    all_done = _family([["a", "grpo", "dynamic_sampling", "10", 1], ["b", "clip_higher", "soft_punish", "10", 1]])
    p = plan_next_look(all_done, LOOKS, SEEDS, ARMS)
    assert p.next_look is None and p.arms == () and "stops" in p.reason
    last = _family([["a", "grpo", "dynamic_sampling", "10,16", 0], ["b", "clip_higher", "soft_punish", "10,16", 2]])
    p = plan_next_look(last, LOOKS, SEEDS, ARMS)
    assert p.next_look is None and "unplanned look" in p.reason and p.undecided == ("a",)


def test_next_look_refuses_a_spec_without_a_stopping_rule(tmp_path):
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "dapo.sweep", "next-look", str(root / "sweeps" / "table1-mini.yaml"),
                        "--output", str(tmp_path)], capture_output=True, text=True, cwd=root, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith("error: ") and "no stopping rule" in p.stderr and p.stderr.count("\n") == 1


def test_a_finished_sweep_prints_each_arms_last_evaluation_and_the_report_command(tmp_path):
    import argparse
    import dataclasses
    import json

    from dapo.commands.sweep import end_summary, expand, load_spec
    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "sweeps" / "table1-mini-replication.yaml")
    spec = dataclasses.replace(spec, seeds=(10, 11), only_arms=("grpo", "dynamic_sampling"))
    jobs = expand(spec, tmp_path)
    for i, j in enumerate(jobs):
        j.run_dir.mkdir(parents=True)
        (j.run_dir / "summary.json").write_text(json.dumps({"final_eval": {spec.metric: 0.1 * (i + 1)}}))
    out = end_summary(spec, jobs, argparse.Namespace(spec="sweeps/x.yaml", output=str(tmp_path)))
    assert out[0].startswith("every run of table1-mini-replication is done. eval/arith-fresh/avg_at_64")
    assert out[1].split() == ["naive", "GRPO", "0.1500", "(2", "seeds)"]                  # (0.1 + 0.2) / 2
    assert out[2].split()[-3:] == ["0.3500", "(2", "seeds)"]
    assert out[-1] == f"report: dapo figures sweeps/x.yaml --runs {tmp_path}"


def test_next_look_counts_the_runs_of_a_committed_snapshot_and_runs_none_of_them_again(tmp_path):
    """The replication's look 1 is only in results/ (no store under --output): with --with-snapshot the three
    declared comparisons are decided and nothing is submitted; without it, the first look would run again."""
    root = Path(__file__).resolve().parents[1]
    spec, snap = root / "sweeps" / "table1-mini-replication.yaml", root / "results" / "table1-mini-replication"

    def next_look(*extra):
        return subprocess.run([sys.executable, "-m", "dapo.sweep", "next-look", str(spec), "--output", str(tmp_path),
                               "--dry-run", *extra], capture_output=True, text=True, cwd=root, timeout=300)
    p = next_look("--with-snapshot", str(snap / "snapshot"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("decided: ") == 3 and "undecided" not in p.stdout and "nothing more runs" in p.stdout
    assert "50 runs from the snapshot" in p.stderr and not (tmp_path / "sweeps").exists()
    p = next_look("--with-snapshot", str(snap))                 # the report folder, not its snapshot/
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and f"{snap / 'snapshot'} has one" in p.stderr
    p = next_look()
    assert p.returncode == 2 and "no look has been run" in p.stderr and "--with-snapshot" in p.stderr


def test_a_run_only_a_snapshot_holds_is_skipped_by_submit(tmp_path):
    from dapo.commands.sweep import expand, load_spec
    from dapo.sweep.cluster import load_profile
    from dapo.sweep.launcher import submit
    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "sweeps" / "table1-mini-replication.yaml")
    jobs = expand(spec, tmp_path)
    rec = submit(spec, load_profile("local"), tmp_path, dry_run=True, held={jobs[0].run_id}, log=lambda m: None)
    assert [s["run_id"] for s in rec["skipped"]] == [jobs[0].run_id] and rec["skipped"][0]["reason"] == "in an earlier snapshot"
    assert len(rec["jobs"]) == len(jobs) - 1
