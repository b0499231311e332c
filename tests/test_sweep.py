"""Sweep specs, expansion, cluster profiles and the launcher's pure parts (fast; no Slurm, no torch)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from shlex import quote as shlex_quote
from pathlib import Path

import pytest
import yaml

from dapo.commands.sweep import expand, load_profile, load_spec, main as sweep_main, sweep_info
from dapo.config import ConfigError, config_hash
from dapo.sweep.cluster import check_resources
from dapo.sweep.spec import arms
from dapo.sweep import jobs as sweep_jobs, records as sweep_records, state as sweep_state

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "sweeps").glob("*.yaml"))
PAPER = {"table1", "leave-one-out", "clip-higher-eps", "grpo-vs-dapo"}
PWN = "$(touch /tmp/pwned)"


def write_spec(tmp_path: Path, name: str = "s", **fields) -> Path:
    """A small valid ladder on the smoke experiment; ``fields`` replace top-level keys (None deletes)."""
    spec = {"name": name, "base": "experiments/tiny-random-smoke.yaml", "kind": "ladder",
            "base_overrides": {"rollout.engine": "hf"},
            "baseline": {"name": "grpo", "label": "GRPO", "overrides": {"algo.clip.eps_high": 0.2}, "paper": 30},
            "techniques": [{"name": "clip_higher", "label": "+ clip-higher", "paper": 38,
                            "overrides": {"algo.clip.eps_high": 0.28}}],
            "seeds": [0, 1], "metric": "eval/arith-eval/avg_at_2", "final_k": 1,
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2, "time_min": 10},
            "max_concurrent": 2}
    for k, v in fields.items():
        if v is None:
            spec.pop(k, None)
        else:
            spec[k] = v
    path = tmp_path / f"spec-{len(list(tmp_path.glob('spec-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    return str(exc.value)


# =========================================================================== shipped specs
def test_import_sweep_needs_neither_torch_nor_submitit():
    code = ("import dapo.commands.sweep, sys; dapo.commands.sweep.expand('sweeps/table1.yaml'); "
            "assert 'torch' not in sys.modules and 'submitit' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_spec_expands_and_fits_its_cluster(path: Path, tmp_path: Path):
    spec = load_spec(path)
    jobs = expand(spec, tmp_path)
    assert len(jobs) == len(arms(spec)) * len(spec.seeds) == len({j.run_id for j in jobs})
    info = sweep_info(spec)
    assert [a["name"] for a in info["arms"]] == list(dict.fromkeys(j.arm for j in jobs))
    assert info["metric"].startswith("eval/") and info["final_k"] >= 1
    for j in jobs:
        assert j.config.logging.sweep == j.config.logging.experiment == spec.name
        assert j.config.logging.arm == j.arm and j.config.train.seed == j.seed
        assert j.run_dir == tmp_path.resolve() / "runs" / j.run_id and j.run_id == config_hash(j.config)
    cluster = "example-gpu-cluster" if spec.name in PAPER else "local"
    check_resources(spec, load_profile(cluster))
    if spec.name in PAPER:
        assert spec.base.name == "paper-dapo-32b.yaml" and spec.resources.nodes * spec.resources.gpus_per_node == 128
        assert (REPO / "sweeps" / f"{spec.name}-mini.yaml").is_file()


def test_table1_ladder_matches_the_paper():
    info = sweep_info(REPO / "sweeps" / "table1.yaml")
    assert info["kind"] == "ladder" and info["metric"] == "eval/aime24/avg_at_32"
    assert [(a["name"], a["paper"]) for a in info["arms"]] == [
        ("grpo", 30), ("overlong_filter", 36), ("clip_higher", 38), ("soft_punish", 41), ("token_loss", 42),
        ("dynamic_sampling", 50)]
    jobs = {j.arm: j.config.algo for j in expand(REPO / "sweeps" / "table1.yaml")}
    g, d = jobs["grpo"], jobs["dynamic_sampling"]
    assert (g.clip.eps_high, g.loss_agg, g.overlong.filter, g.overlong.soft_punish, g.dynamic_sampling.enabled) == \
        (0.2, "seq_mean_token_mean", False, False, False)
    # the last row stacks filter and punishment, as the paper's table does
    assert (d.clip.eps_high, d.loss_agg, d.overlong.filter, d.overlong.soft_punish, d.dynamic_sampling.enabled) == \
        (0.28, "token_mean", True, True, True)
    assert jobs["clip_higher"].overlong.filter and not jobs["clip_higher"].overlong.soft_punish
    mini = load_spec(REPO / "sweeps" / "table1-mini.yaml")
    assert mini.seeds == tuple(range(10)) and mini.resources.cpus_per_task == 1 and mini.resources.nodes == 1
    v1 = load_spec(REPO / "sweeps" / "table1-mini-v1.yaml")
    assert v1.seeds == (0, 1, 2) and v1.name == "table1-mini-v1"


def test_leave_one_out_reverts_one_technique_to_the_baseline():
    jobs = {j.arm: j for j in expand(REPO / "sweeps" / "leave-one-out.yaml")}
    assert set(jobs) == {"full", "no_clip_higher", "no_soft_punish", "no_token_loss", "no_dynamic_sampling"}
    assert jobs["full"].overrides == {}                       # the full recipe is the base
    assert jobs["no_clip_higher"].overrides == {"algo.clip.eps_high": 0.2}
    assert jobs["no_dynamic_sampling"].overrides == {"algo.dynamic_sampling.enabled": False}
    assert jobs["no_token_loss"].overrides == {"algo.loss_agg": "seq_mean_token_mean"}


def test_the_same_run_in_two_sweeps_is_one_run():
    ids = {p: {j.arm: j.run_id for j in expand(REPO / "sweeps" / f"{p}.yaml")}
           for p in ("table1", "grpo-vs-dapo", "leave-one-out", "clip-higher-eps")}
    assert ids["grpo-vs-dapo"]["dapo"] == ids["leave-one-out"]["full"] == ids["clip-higher-eps"]["eps_high-0.28"]
    assert ids["grpo-vs-dapo"]["grpo"] == ids["table1"]["grpo"]


# =========================================================================== run ids
def test_run_id_is_stable_ignores_names_and_logging_but_not_the_seed(tmp_path: Path):
    a = expand(write_spec(tmp_path, "first"), tmp_path / "o1")
    other_arms = {"baseline": {"name": "sym", "label": "symmetric", "overrides": {"algo.clip.eps_high": 0.2}},
                  "techniques": [{"name": "ch", "label": "ch", "overrides": {"algo.clip.eps_high": 0.28}}]}
    b = expand(load_spec(write_spec(tmp_path, "second", **other_arms), {"logging.tracking_uri": "sqlite:///x.db"}),
               tmp_path / "o2")
    assert [j.run_id for j in a] == [j.run_id for j in b]         # same configs, other names, other store
    assert [j.run_id for j in a] == [j.run_id for j in expand(write_spec(tmp_path, "first"), tmp_path / "o1")]
    assert a[0].run_id != a[1].run_id and a[0].seed != a[1].seed  # the seed is part of the config
    c = expand(write_spec(tmp_path, "first", seeds=[5, 1]), tmp_path / "o1")
    assert c[0].run_id != a[0].run_id and c[1].run_id == a[1].run_id
    d = expand(load_spec(write_spec(tmp_path, "first"), {"train.rollout_steps": 3}), tmp_path / "o1")
    assert d[0].run_id != a[0].run_id and d[0].config.train.rollout_steps == 3
    assert d[0].overrides == a[0].overrides == {}     # rows show what differs from base + base_overrides


def test_expansion_counts_and_grid_product(tmp_path: Path, monkeypatch):
    one = write_spec(tmp_path, kind="one_at_a_time", techniques=[
        {"name": "t1", "overrides": {"algo.overlong.filter": True}},
        {"name": "t2", "overrides": {"algo.loss_agg": "token_mean"}}])
    jobs = expand(one, tmp_path)
    assert [j.arm for j in jobs] == ["grpo", "grpo", "t1", "t1", "t2", "t2"]
    assert jobs[4].overrides == {"algo.loss_agg": "token_mean"}     # t1 not stacked (base has eps_high 0.2)
    grid = write_spec(tmp_path, kind="grid", baseline=None, techniques=None, seeds=[0],
                      grid={"algo.clip.eps_high": [0.2, 0.28, 0.3], "train.lr": [1e-6, 1e-5]},
                      paper={"eps_high-0.28__lr-1e-05": 50})
    info = sweep_info(grid)
    assert len(info["arms"]) == 6 and info["arms"][3]["paper"] == 50
    assert info["arms"][3]["overrides"] == {"algo.clip.eps_high": 0.28, "train.lr": 1e-5}
    assert len(expand(grid, tmp_path)) == 6
    monkeypatch.chdir(tmp_path)              # real data files (`dapo sweep expand` checks that they exist)
    for f in ("a b.jsonl", "a_b.jsonl"):
        (tmp_path / f).write_text('{"prompt": "1+1?", "answer": "2"}\n')
    clash = write_spec(tmp_path, kind="grid", baseline=None, techniques=None, seeds=[0],
                       grid={"data.train": ["a b.jsonl", "a_b.jsonl"]})
    assert [a["name"] for a in sweep_info(clash)["arms"]] == ["train-a_b.jsonl_0", "train-a_b.jsonl_1"]


def test_finished_run_is_reused_not_rerun(tmp_path: Path):
    from dapo.sweep import launcher
    spec = load_spec(write_spec(tmp_path))
    jobs = expand(spec, tmp_path / "out")
    jobs[0].run_dir.mkdir(parents=True)
    (jobs[0].run_dir / "summary.json").write_text("{}")
    assert jobs[0].finished and not jobs[1].finished
    rec = launcher.submit(spec, load_profile("local"), tmp_path / "out", dry_run=True, log=lambda *_: None)
    assert [j.arm for j in jobs] == ["grpo", "grpo", "clip_higher", "clip_higher"]     # expand: arm-major
    # the local executor runs seed-major (every arm's seed 0, then seed 1): a partial sweep has pairs
    assert [(j["arm"], j["seed"]) for j in rec["jobs"]] == [("clip_higher", 0), ("grpo", 1), ("clip_higher", 1)]
    assert {j["run_id"] for j in rec["jobs"]} == {j.run_id for j in jobs[1:]}
    assert rec["skipped"] == [{"run_id": jobs[0].run_id, "arm": "grpo", "seed": 0, "reason": "finished"}]


def test_a_dry_run_estimates_time_from_finished_runs_or_the_plan(tmp_path: Path, capsys):
    """A finished run of an arm prices its other seeds (measured: its wall time); an arm without one has no
    estimate on a CPU profile; on a GPU profile the plan prices every arm; jobs fill `parallel` slots in order."""
    from dapo.commands.sweep import time_estimate
    spec = load_spec(write_spec(tmp_path))
    out = tmp_path / "out"
    jobs = expand(spec, out)
    jobs[0].run_dir.mkdir(parents=True)
    (jobs[0].run_dir / "summary.json").write_text(json.dumps({"wall_s": 7200.0}))   # grpo seed 0: 2 h
    lines = time_estimate(spec, jobs[1:], load_profile("local"), out, parallel=2)
    assert "  grpo                     2.00 h a run (measured: mean of 1 finished run(s))" in lines
    assert any(l.startswith("  clip_higher") and "no estimate" in l for l in lines)
    assert lines[-1] == "  1 job(s), 2 at a time: ≈ 2.0 h (2.0 h of runs)"
    paper = load_spec(REPO / "sweeps" / "table1.yaml")
    lines = time_estimate(paper, expand(paper, out), load_profile("example-gpu-cluster"), out, parallel=2)
    hours = [float(l.split()[1]) for l in lines[1:-1]]
    assert len(hours) == 6 and all(h > 1 for h in hours)        # 30B-class runs on 128 GPUs: days, not seconds
    assert lines[-1].startswith("  6 job(s), 2 at a time: ≈ ")
    assert sweep_main(["submit", str(write_spec(tmp_path)), "--cluster", "local", "--output", str(out), "--dry-run"]) == 0
    assert "time estimate (queue waits and requeues not counted):" in capsys.readouterr().out


# =========================================================================== validation errors
@pytest.mark.parametrize("fields, key, words", [
    ({"techniques": [{"name": "t", "overrides": {"algo.clip.eps_hgh": 0.3}}]},
     "techniques[0].overrides", "unknown key 'algo.clip.eps_hgh'"),
    ({"base_overrides": {"trian.lr": 1.0}}, "base_overrides", "unknown key 'trian.lr'"),
    ({"colour": "red"}, "colour", "unknown key"),
    ({"kind": "staircase"}, "kind", "expected one of ladder"),
    ({"seeds": "0"}, "seeds", "expected a non-empty list"),
    ({"seeds": [0, "1"]}, "seeds[1]", "expected an integer"),
    ({"seeds": [0, 0]}, "seeds", "a seed repeats"),
    ({"final_k": 0}, "final_k", "expected an integer >= 1"),
    ({"resources": {"cpus_per_task": "two"}}, "resources.cpus_per_task", "expected an integer"),
    ({"resources": {"gpus": 8}}, "resources.gpus", "unknown key"),
    ({"max_concurrent": 1.5}, "max_concurrent", "expected an integer"),
    ({"techniques": [{"name": "t", "paper": "high", "overrides": {"algo.clip.eps_high": 0.3}}]},
     "techniques[0].paper", "expected a number or null"),
    ({"techniques": [{"name": "t", "overrides": {"algo.clip.eps_high": "wide"}}]},
     "algo.clip.eps_high", "arm 't'"),
    ({"techniques": [{"name": "t", "overrides": {"train.seed": 3}}]}, "train.seed", "set by seeds"),
    ({"techniques": [{"name": "t", "overrides": {"logging.arm": "x"}}]}, "logging.arm", "set by the launcher"),
    ({"techniques": [{"name": "t", "overrides": {}}]}, "overrides", "is empty"),
    ({"techniques": [{"name": "t", "overrides": {"algo.clip.eps_high": 0.2}}]}, "'grpo' and 't'",
     "resolve to the same config"),
    ({"techniques": [{"name": "a", "overrides": {"train.lr": 1e-5}}, {"name": "a", "overrides": {"train.lr": 1e-4}}]},
     "techniques", "used twice"),
    ({"base": "experiments/nope.yaml"}, "base", "no such experiment file"),
    ({"baseline": None}, "baseline", "is missing"),
    ({"kind": "grid", "baseline": None, "techniques": None, "grid": {}}, "grid", "grid is empty"),
    ({"kind": "grid", "baseline": None, "techniques": None, "grid": {"train.lr": []}}, "grid.train.lr",
     "non-empty list"),
    ({"kind": "grid", "baseline": None, "techniques": None, "grid": {"train.lr": [1e-6], "train.zz": [1]}}, "grid",
     "unknown key 'train.zz'"),
    ({"kind": "leave_one_out", "techniques": [{"name": "t", "overrides": {"algo.loss_agg": "token_mean"}}]},
     "techniques[0] (t).overrides.algo.loss_agg", "baseline.overrides, which does not set it"),
    ({"paper": {"nobody": 3}}, "paper.nobody", "no such arm"),
    ({"resources": {"nodes": 2, "gpus_per_node": 8}}, "resources", "launch.num_nodes"),
    ({"techniques": [{1: None, "x": None}]}, "techniques[0]", "unknown key"),          # mixed-type keys
    ({"kind": "grid", "baseline": None, "techniques": None, "grid": {"algo.clip.eps_high": [{"": None, 0: None}, 0.2]}},
     "algo.clip.eps_high", "expected float"),
])
def test_validation_error_names_file_and_key(tmp_path: Path, fields, key, words):
    path = write_spec(tmp_path, **fields)
    msg = error_of(path)
    assert str(path) in msg and key in msg and words in msg, msg


def test_resources_beyond_the_cluster_profile_are_refused(tmp_path: Path):
    spec = load_spec(write_spec(tmp_path, resources={"cpus_per_task": 64, "mem_gb": 2, "time_min": 10}))
    with pytest.raises(ConfigError, match=r"resources.cpus_per_task = 64: cluster profile 'local' .* at most 2"):
        check_resources(spec, load_profile("local"))
    big = load_spec(REPO / "sweeps" / "table1.yaml")
    check_resources(big, load_profile("example-gpu-cluster"))
    for key, limit in (("gpus_per_node", 4), ("time_min", 60), ("mem_gb", 64), ("nodes", 8)):
        prof = yaml.safe_load((REPO / "slurm" / "example-gpu-cluster.yaml").read_text())
        prof["limits"][key] = limit
        (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
        with pytest.raises(ConfigError, match=rf"table1.yaml: resources.{key} = .*at most {limit}"):
            check_resources(big, load_profile(tmp_path / "p.yaml"))


def test_cli_errors_before_anything_is_submitted(tmp_path: Path, capsys):
    bad = write_spec(tmp_path, techniques=[{"name": "t", "overrides": {"algo.nope": 1}}])
    out = tmp_path / "out"
    assert sweep_main(["submit", str(bad), "--cluster", "local", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "algo.nope" in err
    big = write_spec(tmp_path, resources={"cpus_per_task": 64})
    assert sweep_main(["submit", str(big), "--cluster", "local", "--executor", "slurm", "--output", str(out)]) == 2
    assert "resources.cpus_per_task = 64" in capsys.readouterr().err
    assert not out.exists()                            # nothing recorded, nothing submitted


def test_cli_expand_table_and_json(tmp_path: Path, capsys):
    assert sweep_main(["expand", str(REPO / "sweeps" / "table1.yaml"), "--output", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "6 arms x 1 seeds = 6 jobs" in text and "algo.overlong.filter=true" in text
    assert sweep_main(["expand", str(REPO / "sweeps" / "smoke-slurm.yaml"), "--json", "--output", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["arm"], r["seed"]) for r in rows] == [("grpo", 0), ("grpo", 1), ("clip_higher", 0), ("clip_higher", 1)]
    assert rows[2]["overrides"] == {"algo.clip.eps_high": 0.28} and not rows[0]["finished"]


# =========================================================================== shell safety
@pytest.mark.parametrize("bad", ["x; rm -rf /", PWN, "a b", "x\n#SBATCH --x", "`id`", "..", ""])
def test_names_with_shell_metacharacters_are_refused(tmp_path: Path, bad):
    assert "expected a name matching" in error_of(write_spec(tmp_path, name=bad))
    t = [{"name": bad, "overrides": {"algo.clip.eps_high": 0.28}}]
    assert "techniques[0].name" in error_of(write_spec(tmp_path, techniques=t))
    prof = yaml.safe_load((REPO / "slurm" / "local.yaml").read_text())
    for key in ("partition", "account", "qos"):
        (tmp_path / "p.yaml").write_text(yaml.safe_dump({**prof, key: bad}))
        with pytest.raises(ConfigError, match=f"{key} = .*expected a name matching"):
            load_profile(tmp_path / "p.yaml")
    with pytest.raises(ConfigError):
        load_profile(bad if "/" not in bad else "x;y")


def test_profile_env_names_and_multiline_setup_are_refused(tmp_path: Path):
    prof = yaml.safe_load((REPO / "slurm" / "local.yaml").read_text())
    for patch, words in (({"env": {"A;B": "1"}}, "not a valid variable name"),
                         ({"setup": ["module load x\nrm -rf /"]}, "expected one non-empty line"),
                         ({"constraint": "a100 && $(id)"}, "constraint"),
                         ({"python": "py\nrm -rf /"}, "python")):
        (tmp_path / "p.yaml").write_text(yaml.safe_dump({**prof, **patch}))
        with pytest.raises(ConfigError, match=words):
            load_profile(tmp_path / "p.yaml")


def test_sbatch_script_quotes_every_value(tmp_path: Path):
    """Run the generated script with a fake srun: no metacharacter from setup, env, python or
    the output path is ever interpreted (the canary files must not appear)."""
    from dapo.sweep import launcher
    canary = tmp_path / "pwned"
    nasty = f"$(touch {canary}1)"
    prof = yaml.safe_load((REPO / "slurm" / "local.yaml").read_text())
    prof.update(executor="slurm", setup=[f"echo setup; touch {canary}2", f"echo `touch {canary}3` {nasty}"],
                env={"DAPO_X": f"v; touch {canary}4 {nasty}", "DAPO_Y": "it's"},
                python=f"{tmp_path}/bin/py thon;touch {canary}5")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    profile = load_profile(tmp_path / "p.yaml")
    out = tmp_path / f"out $(touch {canary}6); x"
    rec = launcher.submit(load_spec(write_spec(tmp_path)), profile, out, dry_run=True, log=lambda *_: None)
    script = rec["script"]
    assert "--job-name=dapo-s" in script and "--array=0-3%2" in script
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\necho "X=$DAPO_X" >> "$SRUN_ARGS"\n')
    (fake / "srun").chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "args")}
    (tmp_path / "job.sh").write_text(script)
    run = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert not list(tmp_path.glob("pwned*")), "a value was executed by the shell"
    args = (tmp_path / "args").read_text().splitlines()      # srun's argv, one per line, then $DAPO_X
    folder = str(out.resolve() / "sweeps" / "s" / "submitit" / "<timestamp>")
    assert args[-6:] == [f"{tmp_path}/bin/py thon;touch {canary}5", "-u", "-m", "submitit.core._submit", folder,
                         f"X=v; touch {canary}4 {nasty}"]
    assert "echo setup\\;" not in run.stdout and "setup; touch" in run.stdout


# =========================================================================== launcher pieces
def test_accelerate_command_for_two_nodes_of_eight_gpus():
    from dapo.sweep.launcher import accelerate_command
    cmd = accelerate_command(python="/venv/bin/python", config_path="/r/cfg.yaml", run_dir="/r", nodes=2,
                             gpus_per_node=8, machine_rank=1, main_ip="node-a", main_port=29512, fsdp=True,
                             mixed_precision="bf16")
    opts = dict(zip(cmd[3:-5:2], cmd[4:-5:2]))
    assert cmd[:3] == ["/venv/bin/python", "-m", "accelerate.commands.launch"]
    assert opts["--num_processes"] == "16" and opts["--num_machines"] == "2" and opts["--machine_rank"] == "1"
    assert opts["--main_process_ip"] == "node-a" and opts["--main_process_port"] == "29512"
    assert opts["--mixed_precision"] == "bf16"
    assert Path(opts["--config_file"]) == REPO / "slurm" / "accelerate-fsdp.yaml"
    assert "--multi_gpu" not in cmd and cmd[-6:] == ["-m", "dapo.train", "--allow-resource-change",
                                                     "/r/cfg.yaml", "--run-dir", "/r"]
    assert "--same_network" in cmd and cmd[cmd.index("--rdzv_backend") + 1] == "static"
    ddp = accelerate_command(python="p", config_path="c", run_dir="r", nodes=1, gpus_per_node=8, machine_rank=0,
                             main_ip="h", main_port=1, fsdp=False)
    assert "--multi_gpu" in ddp and "--config_file" not in ddp and "--same_network" not in ddp
    fsdp = yaml.safe_load((REPO / "slurm" / "accelerate-fsdp.yaml").read_text())
    # accelerate only launches; sharding (FSDP2), checkpoints and engines are dapo.dist.distributed's
    assert fsdp["distributed_type"] == "MULTI_GPU" and "fsdp_config" not in fsdp


def test_sbatch_parameters_for_the_paper_sweep():
    from dapo.sweep.launcher import sbatch_parameters
    p = sbatch_parameters(load_spec(REPO / "sweeps" / "table1.yaml"), load_profile("example-gpu-cluster"))
    assert (p["nodes"], p["gpus_per_node"], p["ntasks_per_node"], p["cpus_per_task"]) == (16, 8, 1, 96)
    assert (p["time"], p["mem"], p["array_parallelism"], p["partition"]) == (10080, "1000GB", 2, "gpu")
    assert not any(l.startswith("module") for l in p["setup"]) and "export NCCL_DEBUG=WARN" in p["setup"]


def test_checkpoint_requeues_a_bounded_number_of_times(tmp_path: Path):
    from dapo.sweep.launcher import RunJob
    job = RunJob({"name": "x"}, str(tmp_path), max_requeues=2)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        first, second = job.checkpoint(), job.checkpoint()
        # the `scontrol requeue` submitit runs next survives the SIGTERM the requeue sends the job
        child = subprocess.run(["sh", "-c", "kill -TERM $$; echo survived"], capture_output=True, text=True)
        assert child.returncode == 0 and child.stdout == "survived\n", child
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert first.function is job and second.function is job            # resubmits itself
    assert json.loads((tmp_path / "requeues.json").read_text())["count"] == 2
    with pytest.raises(SystemExit, match="giving up"):                  # then a clear failure, which no
        job.checkpoint()                                                 # `except Exception` can swallow
    assert "max_requeues = 2 reached" in json.loads((tmp_path / "failed.json").read_text())["reason"]


def test_status_maps_slurm_states_and_shows_the_failed_log(tmp_path: Path, monkeypatch):
    from dapo.sweep import launcher
    spec = load_spec(write_spec(tmp_path, seeds=[0, 1, 2]))
    jobs = expand(spec, tmp_path)
    folder = tmp_path / "sweeps" / "s" / "submitit" / "x"
    folder.mkdir(parents=True)
    (folder / "7_4_0_log.out").write_text("\n".join(f"line {i}" for i in range(30)) + "\nValueError: boom\n")
    states = ["PENDING", "RUNNING", "REQUEUED", "COMPLETED", "FAILED", "CANCELLED"]
    entries = [{"run_id": j.run_id, "arm": j.arm, "seed": j.seed, "run_dir": str(j.run_dir), "job_id": f"7_{i}"}
               for i, j in enumerate(jobs)]
    sweep_records._write_json(tmp_path / "sweeps" / "s" / "submissions.json",
                         {"sweep": "s", "submissions": [{"executor": "slurm", "folder": str(folder), "jobs": entries}]})
    jobs[3].run_dir.mkdir(parents=True)
    (jobs[3].run_dir / "summary.json").write_text("{}")
    monkeypatch.setattr(sweep_state, "_sacct", lambda ids: {f"7_{i}": s for i, s in enumerate(states)})
    rows = launcher.status(spec, tmp_path)
    assert [r["state"] for r in rows] == ["pending", "running", "requeued", "done", "failed", "failed"]
    assert rows[4]["detail"] == "FAILED" and rows[4]["log_tail"].splitlines()[-1] == "ValueError: boom"
    assert len(rows[4]["log_tail"].splitlines()) == 20


def test_local_profile_has_an_embedded_default(tmp_path: Path, monkeypatch):
    import dapo.sweep.cluster as cluster
    monkeypatch.setattr(cluster, "REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    prof = load_profile("local")
    assert prof.path is None and prof.executor == "local" and prof.max_nodes == 1 and prof.max_cpus_per_task >= 1
    with pytest.raises(ConfigError, match="no profile slurm/elsewhere.yaml"):
        load_profile("elsewhere")


def test_a_multi_node_job_starts_accelerate_with_its_node_rank(tmp_path: Path, monkeypatch):
    """RunJob on node 1 of a 2-node × 8-GPU allocation (Slurm env faked; accelerate not run)."""
    from dapo.config import build_config, load_config, to_dict
    from dapo.sweep import launcher
    cfg = load_config(REPO / "experiments" / "paper-dapo-32b.yaml", ["launch.num_nodes=2"])
    env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4321", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
           "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    calls = []
    monkeypatch.setattr(sweep_jobs, "run_launcher", lambda cmd, job: calls.append(cmd) or 0)
    job = launcher.RunJob(to_dict(cfg), str(tmp_path), max_requeues=1, python="/venv/bin/python")
    assert job() is None                                           # only node 0 returns the summary
    [cmd] = calls
    get = lambda flag: cmd[cmd.index(flag) + 1]                    # noqa: E731
    assert (get("--num_processes"), get("--num_machines"), get("--machine_rank")) == ("16", "2", "1")
    assert get("--main_process_ip") == "gpu07" and get("--main_process_port") == str(20000 + 4321)
    assert Path(get("--config_file")).name == "accelerate-fsdp.yaml" and cmd[0] == "/venv/bin/python"
    written = yaml.safe_load(Path(cmd[-3]).read_text())
    assert config_hash(build_config(written)) == config_hash(cfg) and cmd[-2:] == ["--run-dir", str(tmp_path)]
    assert not (tmp_path / "job.json").exists()                    # written by global rank 0 only


def _node1_env(monkeypatch) -> list:
    """Slurm's environment of node 1 of a 2-node job; accelerate is not run: its argv is recorded."""
    env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4321", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
           "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    calls: list = []
    monkeypatch.setattr(sweep_jobs, "run_launcher", lambda cmd, job: calls.append(cmd) or 0)
    return calls


def test_node_1_of_a_fresh_multi_node_job_makes_the_run_dir_itself(tmp_path: Path, monkeypatch):
    """Only global rank 0 writes job.json (and so the run dir); node 1 may start first on a fresh run:
    it writes its launch config into a run dir that does not exist yet."""
    from dapo.config import load_config, to_dict
    from dapo.sweep import launcher
    calls = _node1_env(monkeypatch)
    cfg = load_config(REPO / "experiments" / "paper-dapo-32b.yaml", ["launch.num_nodes=2"])
    run_dir = tmp_path / "out" / "runs" / "fresh"
    assert launcher.RunJob(to_dict(cfg), str(run_dir), max_requeues=1)() is None
    [cmd] = calls
    assert Path(cmd[-3]) == run_dir / ".launch-config.node1.yaml" and Path(cmd[-3]).is_file()
    assert sorted(p.name for p in run_dir.iterdir()) == [".launch-config.node1.yaml"]   # no temp file left


def test_a_sweep_expanded_elsewhere_gives_its_jobs_the_absolute_accelerate_config(tmp_path: Path, monkeypatch):
    """`launch.accelerate_config: slurm/accelerate-fsdp.yaml` is read like `base:` when the sweep is
    expanded (not from the job's cwd, wherever it was submitted); the run ids do not change."""
    from dapo.sweep import launcher
    monkeypatch.chdir(tmp_path)                                   # submitted from outside the repo
    spec = load_spec(REPO / "sweeps" / "table1.yaml")
    job = expand(spec, tmp_path)[0]
    assert job.accelerate_config == REPO / "slurm" / "accelerate-fsdp.yaml"
    assert job.config.launch.accelerate_config == "slurm/accelerate-fsdp.yaml"   # the config (and run id) as written
    calls = _node1_env(monkeypatch)
    assert launcher._make_job(spec, job, load_profile("example-gpu-cluster"))() is None
    [cmd] = calls
    assert cmd[cmd.index("--config_file") + 1] == str(REPO / "slurm" / "accelerate-fsdp.yaml")
    # beside the spec also counts; a file that is nowhere is one clear error at expansion
    (tmp_path / "acc.yaml").write_text("{}")
    local = load_spec(write_spec(tmp_path, base=str(REPO / "experiments" / "tiny-random-smoke.yaml"),
                                 base_overrides={"launch.accelerate_config": "acc.yaml"}))
    monkeypatch.chdir(REPO)
    assert expand(local, tmp_path)[0].accelerate_config == tmp_path / "acc.yaml"
    missing = load_spec(write_spec(tmp_path, base=str(REPO / "experiments" / "tiny-random-smoke.yaml"),
                                   base_overrides={"launch.accelerate_config": "nowhere.yaml"}))
    with pytest.raises(ConfigError, match=r"launch.accelerate_config = 'nowhere.yaml': no such file \(looked"):
        expand(missing, tmp_path)


def test_cancelling_a_local_job_kills_its_whole_process_tree():
    """A local job is `sh -c ... && python -m submitit.local._local` → controller → task; all must go,
    even with SIGINT ignored (as for anything started from a background shell)."""
    py = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    shell = subprocess.Popen(["sh", "-c", f"{shlex_quote(sys.executable)} -c {shlex_quote(py)} submitit-task & "
                              f"{shlex_quote(sys.executable)} -c {shlex_quote(py)} submitit-controller; : submitit"],
                             preexec_fn=lambda: __import__("signal").signal(2, 1))
    deadline = time.monotonic() + 20
    while len(sweep_state._local_tree(str(shell.pid))) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    tree = sweep_state._local_tree(str(shell.pid))
    assert len(tree) == 3 and tree[-1] == shell.pid
    sweep_state._kill_local(str(shell.pid))
    shell.wait(10)                                                 # ended (killed, or its child was)
    deadline = time.monotonic() + 10
    while any(sweep_state._local_alive(str(p)) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(sweep_state._local_alive(str(p)) for p in tree)


def test_status_when_sacct_is_silent(tmp_path: Path, monkeypatch):
    from dapo.sweep import launcher
    spec = load_spec(write_spec(tmp_path, seeds=[0]))
    jobs = expand(spec, tmp_path)
    sub = {"executor": "slurm", "folder": str(tmp_path), "time": "2020-01-01T00:00:00+00:00",
           "jobs": [{"run_id": j.run_id, "arm": j.arm, "seed": j.seed, "job_id": f"9_{i}"} for i, j in enumerate(jobs)]}
    sweep_records._write_json(tmp_path / "sweeps" / "s" / "submissions.json", {"sweep": "s", "submissions": [sub]})
    monkeypatch.setattr(sweep_state, "_sacct", lambda ids: None)           # Slurm unreachable: never resubmit blindly
    assert {r["state"] for r in launcher.status(spec, tmp_path)} == {"unknown"}
    rec = launcher.submit(spec, load_profile("local"), tmp_path, dry_run=True, log=lambda *_: None)
    assert rec["jobs"] == [] and len(rec["skipped"]) == 2
    monkeypatch.setattr(sweep_state, "_sacct", lambda ids: {})             # sacct answers but forgot the jobs
    rows = launcher.status(spec, tmp_path)
    assert {r["state"] for r in rows} == {"failed"} and "unknown to sacct" in rows[0]["detail"]


def test_seeds_option_runs_a_subset_with_the_same_run_ids(tmp_path, capsys):
    """`--seeds 6-9` extends a sweep whose other seeds ran elsewhere: the jobs are exactly the full
    expansion's jobs of those seeds (same run ids); a seed outside the spec is one error line, exit 2."""
    from dapo.commands.sweep import parse_seeds
    assert parse_seeds("6-9") == (6, 7, 8, 9) and parse_seeds("0,2-3,2") == (0, 2, 3)
    for bad in ("9-6", "a", "1,,2", "-1"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)
    spec = REPO / "sweeps" / "table1-mini.yaml"
    full = {(j.arm, j.seed): j.run_id for j in expand(spec, tmp_path)}
    assert sweep_main(["expand", str(spec), "--seeds", "6-9", "--json", "--output", str(tmp_path)]) == 0
    sub = json.loads(capsys.readouterr().out)
    assert len(sub) == 6 * 4 and {j["seed"] for j in sub} == {6, 7, 8, 9}
    assert all(full[(j["arm"], j["seed"])] == j["run_id"] for j in sub)
    assert sweep_main(["expand", str(spec), "--seeds", "6-12", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[10, 11, 12] are not in" in err


def test_arms_option_runs_a_subset_with_the_same_run_ids(tmp_path, capsys):
    """`--arms` picks cells of a grid (the others ran under another sweep with the same configs)."""
    spec = REPO / "sweeps" / "soft-punish-x-ds-mini.yaml"
    full = {(j.arm, j.seed): j.run_id for j in expand(spec, tmp_path)}
    new = "soft_punish-false__enabled-false,soft_punish-false__enabled-true"
    assert sweep_main(["expand", str(spec), "--arms", new, "--seeds", "0-1", "--json", "--output", str(tmp_path)]) == 0
    sub = json.loads(capsys.readouterr().out)
    assert {(j["arm"], j["seed"]) for j in sub} == {(a, s) for a in new.split(",") for s in (0, 1)}
    assert all(full[(j["arm"], j["seed"])] == j["run_id"] for j in sub)
    # the grid's two soft-punish cells are the Table 1 ladder's last two arms: the same runs
    ladder = {j.run_id: j.arm for j in expand(REPO / "sweeps" / "table1-mini.yaml", tmp_path)}
    shared = {ladder[r] for (a, _), r in full.items() if r in ladder}
    assert shared == {"token_loss", "dynamic_sampling"}
    assert sweep_main(["expand", str(spec), "--arms", "nope", "--output", str(tmp_path)]) == 2
    assert "'nope' not among" in capsys.readouterr().err


def test_two_submissions_of_one_sweep_keep_both_records(tmp_path):
    """Two `dapo sweep submit` of the same sweep into one output (e.g. other --arms), saving while both
    run: each save re-reads the file under its lock and replaces only its own record (by id), so neither
    overwrites the other (each used to rewrite the whole file from the copy it read at its start)."""
    import multiprocessing as mp

    from dapo.sweep import launcher
    path = tmp_path / "sweeps" / "s" / "submissions.json"
    a = {"id": "A", "executor": "local", "jobs": [{"run_id": "r1", "job_id": None}]}
    b = {"id": "B", "executor": "local", "jobs": [{"run_id": "r2", "job_id": None}]}
    sweep_records._save_record(path, "s", a)
    sweep_records._save_record(path, "s", b)
    a["jobs"][0]["job_id"] = "101"                      # A starts its job and saves again
    sweep_records._save_record(path, "s", a)
    subs = launcher.load_records(tmp_path, "s")["submissions"]
    assert [s["id"] for s in subs] == ["A", "B"] and subs[0]["jobs"][0]["job_id"] == "101"
    ctx = mp.get_context("fork")                        # and from several processes at once: nothing lost
    procs = [ctx.Process(target=_save_many, args=(path, k)) for k in ("P", "Q", "R")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    ids = [s["id"] for s in launcher.load_records(tmp_path, "s")["submissions"]]
    assert sorted(ids) == ["A", "B", "P", "Q", "R"]


def _save_many(path, key):
    rec = {"id": key, "executor": "local", "jobs": [{"run_id": key, "job_id": None}]}
    for i in range(30):
        rec["jobs"][0]["job_id"] = str(i)
        sweep_records._save_record(path, "s", rec)
