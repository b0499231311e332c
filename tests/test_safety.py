"""Safe by default (issue 27): secrets never reach disk or a terminal, names never escape the output
root or garble a terminal, a run dir is resumed only by its own config and by one process at a time,
two submissions create one store, and `dapo plan` / `launch` values cannot divide by zero.

Every refusal is one ``error:`` line, exit 2, nothing written. Fast: the CLI cases run in
subprocesses that stop before torch is imported; the rest run in-process with a fake trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from dapo.config import ConfigError, config_diff, load_config, show, to_dict
from tests.test_bad_input import SMOKE, dapo, files_under, one_error, spec_dict, write_yaml

REPO = Path(__file__).resolve().parent.parent
SECRET = "Hunter2xyz"
PG = f"postgresql://mlflow:{SECRET}@db.lab:5432/mlflow"


# =========================================================================== 1. secrets
@pytest.mark.parametrize("path", ["train", "config", "plan", "sweep-expand", "sweep-dry-run-set", "spec-base-overrides"])
def test_a_password_in_a_uri_is_refused_everywhere_before_anything_is_written(tmp_path, path):
    out = tmp_path / "out"
    ov = f"logging.tracking_uri={PG}"
    if path == "train":
        r = dapo("train", str(SMOKE), f"output_dir={out}", ov, cwd=tmp_path)
    elif path == "config":
        r = dapo("config", str(SMOKE), ov, cwd=tmp_path)
    elif path == "plan":
        r = dapo("plan", str(REPO / "experiments" / "paper-dapo-32b.yaml"), ov, "--cluster", "example-gpu-cluster",
                 cwd=tmp_path)
    else:
        extra = {"base_overrides": {"rollout.engine": "hf", "logging.tracking_uri": PG}} \
            if path == "spec-base-overrides" else {}
        spec = write_yaml(tmp_path / "s.yaml", spec_dict(**extra))
        sets = ["--set", ov] if path != "spec-base-overrides" else []
        cmd = ["submit", "--dry-run", "--cluster", "local"] if path == "sweep-dry-run-set" else ["expand"]
        r = dapo("sweep", cmd[0], str(spec), *cmd[1:], *sets, "--output", str(out), cwd=tmp_path)
    line = one_error(r, "logging.tracking_uri", "postgresql://mlflow:***@db.lab", "$DAPO_TRACKING_PASSWORD_FILE")
    assert SECRET not in r.stdout + r.stderr, line
    assert not out.exists() and files_under(tmp_path) <= {"s.yaml"}


def test_any_uri_valued_key_and_any_error_echo_mask_the_password():
    with pytest.raises(ConfigError) as exc:       # not only tracking_uri: every string value
        load_config(SMOKE, [f"data.train=http://u:{SECRET}@h/d.jsonl"])
    assert "data.train" in str(exc.value) and SECRET not in str(exc.value)
    with pytest.raises(ConfigError) as exc:       # a password= query parameter
        load_config(SMOKE, [f"logging.tracking_uri=postgresql://db/m?password={SECRET}"])
    assert SECRET not in str(exc.value)
    # show(), what every error message prints a user value with, masks it even cut short or nested
    assert SECRET not in show({"k": [f"x {PG} " + "y" * 500]}) and SECRET not in show(PG + "z" * 1000)
    assert SECRET not in show(f"postgresql://u:{SECRET}" + "q" * 400 + "@h/db")


# =========================================================================== 2. names
@pytest.mark.parametrize("value", ["/abs/path", "../../x", "a/b", "..", ".", "a b", "a\x1b[31mb", "a\u202eb",
                                   "a\u2066b", "a\0b", "a\nb", "x" * 129, ""])
@pytest.mark.parametrize("key", ["name", "logging.experiment"])
def test_names_that_escape_the_output_root_or_garble_a_terminal_are_refused(key, value):
    with pytest.raises(ConfigError) as exc:
        load_config(SMOKE, {key: value})
    text = str(exc.value)
    assert f"{key} = " in text and "\n" not in text and "\x1b" not in text and "\u202e" not in text


@pytest.mark.parametrize("key, value", [("model.path", "tiny\x1b]0;pwned\x07"), ("output_dir", "runs\u202e"),
                                        ("logging.arm", "a/b"), ("logging.sweep", "s\r"),
                                        ("eval.datasets", [{"name": "arith-eval\x1b[2J"}])])
def test_every_string_value_is_free_of_control_and_direction_characters(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(SMOKE, {key: value})


def test_the_longest_name_and_the_shipped_names_pass():
    assert load_config(SMOKE, {"name": "x" * 128, "logging.experiment": "a.B_c-1"}).name == "x" * 128
    for exp in (REPO / "experiments").glob("*.yaml"):
        load_config(exp)


def test_train_with_a_name_outside_the_output_root_writes_nothing(tmp_path):
    out = tmp_path / "out"
    one_error(dapo("train", str(SMOKE), f"output_dir={out}", "name=../../escaped", cwd=tmp_path),
              "name = '../../escaped'")
    assert files_under(tmp_path) == set()


# =========================================================================== 3. resume under another config
@pytest.fixture
def train_main(monkeypatch, capsys):
    """``dapo train ARGS`` in-process with a fake trainer: (exit code, error text, fake's calls)."""
    from dapo.cli import train_main as real
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")     # route_engine_logs leaves the environment alone
    monkeypatch.delenv("RANK", raising=False)

    def run(*args: str):
        calls = []
        rc = real([str(SMOKE), *args], train_fn=lambda cfg, d: calls.append((cfg, Path(d))) or {})
        err = capsys.readouterr().err
        return rc, err, calls
    return run


def _stored_run(run_dir: Path, *overrides: str) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(load_config(SMOKE, list(overrides))), sort_keys=False))
    return run_dir


@pytest.mark.parametrize("changed", [["train.lr=3e-6"], ["algo.clip.eps_high=0.28", "train.rollout_steps=9"]])
def test_resuming_a_run_dir_under_another_config_is_refused_naming_the_keys(tmp_path, train_main, changed):
    d = _stored_run(tmp_path / "run")
    before = (d / "config.yaml").read_text()
    rc, err, calls = train_main(*changed, "--run-dir", str(d))
    assert rc == 2 and not calls and err.startswith("error: ") and err.count("\n") == 1, err
    for ov in changed:
        assert ov.split("=")[0] in err
    assert "change its numbers" in err and (d / "config.yaml").read_text() == before
    assert sorted(p.name for p in d.iterdir()) == ["config.yaml"]


def test_more_rollout_steps_into_a_finished_run_says_it_cannot_be_extended(tmp_path, train_main):
    d = _stored_run(tmp_path / "run", "train.rollout_steps=3")
    rc, err, calls = train_main("train.rollout_steps=9", "--run-dir", str(d))
    assert rc == 2 and not calls and err.count("\n") == 1, err
    assert "a run of 3 rollout steps; a run cannot be extended in place to 9" in err and "omit --run-dir" in err


def test_a_resource_only_change_needs_the_explicit_flag(tmp_path, train_main):
    d = _stored_run(tmp_path / "run", "train.threads=1")
    rc, err, calls = train_main("train.threads=2", "--run-dir", str(d))
    assert rc == 2 and not calls and "train.threads" in err and "--allow-resource-change" in err, err
    rc, err, calls = train_main("train.threads=2", "--run-dir", str(d), "--allow-resource-change")
    assert rc == 0 and len(calls) == 1 and calls[0][0].train.threads == 2, err
    rc, err, calls = train_main("train.threads=1", "logging.arm=other", "--run-dir", str(d))   # same config: resumes
    assert rc == 0 and len(calls) == 1, err


def test_a_directory_that_is_not_a_run_dir_is_refused_and_left_alone(tmp_path, train_main):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    (d / "summary.json").write_text("{}")        # a run's file name, but beside a file no run writes
    rc, err, calls = train_main("--run-dir", str(d))
    assert rc == 2 and not calls and "not a run directory" in err and "'notes.txt'" in err, err
    assert (d / "notes.txt").read_text() == "keep me" and sorted(p.name for p in d.iterdir()) == ["notes.txt", "summary.json"]
    (tmp_path / "f").write_text("x")
    rc, err, calls = train_main("--run-dir", str(tmp_path / "f"))
    assert rc == 2 and not calls and "not a directory" in err


def test_resuming_into_another_mlflow_store_is_refused(tmp_path, train_main):
    """A run dir resumed with another output_dir (the default store moves with it) or tracking URI
    logged to an MLflow run id the new store does not have (a RELIABILITY.md known gap)."""
    import json
    d = _stored_run(tmp_path / "run", f"output_dir={tmp_path / 'a'}")
    (d / "mlflow_run.json").write_text(json.dumps({"run_id": "abc", "tracking_uri": f"sqlite:///{tmp_path / 'a' / 'mlruns.db'}"}))
    rc, err, calls = train_main(f"output_dir={tmp_path / 'b'}", "--run-dir", str(d))
    assert rc == 2 and not calls and "mlflow_run.json" in err and str(tmp_path / "b" / "mlruns.db") in err, err
    rc, err, calls = train_main(f"logging.tracking_uri=sqlite:///{tmp_path / 'other.db'}", "--run-dir", str(d))
    assert rc == 2 and not calls and "its MLflow run is not there" in err, err
    (tmp_path / "a").mkdir(); (tmp_path / "a" / "mlruns.db").touch()   # the store it logged to is still there
    rc, err, calls = train_main(f"output_dir={tmp_path / 'x' / '..' / 'a'}", "--run-dir", str(d))   # the same store
    assert rc == 0 and len(calls) == 1, err


def test_config_diff_groups_keys_by_what_they_change():
    a = load_config(SMOKE)
    b = load_config(SMOKE, ["train.lr=0.5", "train.threads=3", "logging.arm=z", "name=other"])
    d = config_diff(a, b)
    assert list(d["run"]) == ["train.lr"] and list(d["resources"]) == ["train.threads"]
    assert sorted(d["naming"]) == ["logging.arm", "name"]


# =========================================================================== 4. one process per run dir
HOLD = ("import sys, time; from dapo.run_dir import hold_run_dir\n"
        "with hold_run_dir(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)\n")


def _holder(run_dir: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_train_into_a_held_run_dir_exits_2_naming_the_pid_and_the_lock_dies_with_its_holder(
        tmp_path, train_main, monkeypatch):
    d = tmp_path / "run"
    holder = _holder(d)
    try:
        rc, err, calls = train_main("--run-dir", str(d))
        assert rc == 2 and not calls and f"in use by pid {holder.pid}" in err and err.count("\n") == 1, err
        monkeypatch.setenv("RANK", "1")     # another rank of the holder's own multi-process run shares the dir
        rc, err, calls = train_main("--run-dir", str(d))
        assert rc == 0 and len(calls) == 1, err
        monkeypatch.delenv("RANK")
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # as a preempted / requeued job dies: no handler runs
        holder.wait()
    rc, err, calls = train_main("--run-dir", str(d))
    assert rc == 0 and len(calls) == 1, err


def test_the_lock_is_reentrant_and_held_by_train_itself(tmp_path):
    """`dapo train` holds it and train() takes it again (a sweep job calls train() directly):
    entering twice in one process neither blocks nor releases it."""
    from dapo.run_dir import hold_run_dir
    d = tmp_path / "run"
    with hold_run_dir(d):
        with hold_run_dir(d):
            pass
        probe = subprocess.run([sys.executable, "-c", HOLD, str(d)], cwd=REPO, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
        assert probe.returncode != 0 and "RunDirBusy" in probe.stderr and f"pid {os.getpid()}" in probe.stderr
    holder = _holder(d)        # released on exit: another process takes it, then this one again
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with hold_run_dir(d):
        pass


def test_who_holds_a_run_dir_is_asked_without_taking_the_lock(tmp_path):
    """`dapo runs` says running (run.lock held by a live process) or stopped (nobody holds it); asking
    takes nothing, so the holder keeps it and, once the holder is gone, a run starts at once."""
    from dapo.commands.runs import run_row
    from dapo.run_dir import hold_run_dir, run_dir_holder
    d = tmp_path / "run"
    assert run_dir_holder(d) is None                   # no lock file yet
    holder = _holder(d)
    try:
        assert run_dir_holder(d).startswith(f"pid {holder.pid} on ")
        assert run_dir_holder(d) is not None           # the question released nothing
        assert run_row(d)["status"] == "running"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert run_dir_holder(d) is None and run_row(d)["status"] == "stopped"
    with hold_run_dir(d):                              # this process: answered without opening the file
        assert run_dir_holder(d) == f"pid {os.getpid()} (this process)"
        probe = subprocess.run([sys.executable, "-c", HOLD, str(d)], cwd=REPO, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
        assert probe.returncode != 0 and "RunDirBusy" in probe.stderr     # still held


# =========================================================================== 5. two submissions, one fresh store
def _jobs(tmp_path: Path):
    from dapo.sweep.spec import expand, load_spec
    return expand(load_spec(write_yaml(tmp_path / "s.yaml", spec_dict())), tmp_path / "out")


def test_submit_opens_a_fresh_store_only_under_the_lock_the_trainer_takes(tmp_path, monkeypatch):
    """Two `dapo sweep submit` 0.3 s apart on a fresh output root: the second one died in MLflow's
    schema migration, which the first was running without the lock. Whether the store is opened
    under ``<db>.lock`` is checked when it is opened (a probe tries the lock from another descriptor)."""
    import fcntl

    import mlflow.tracking

    from dapo.sweep.cluster import load_profile
    from dapo.sweep.launcher import _init_tracking
    lock = (tmp_path / "out").resolve() / "mlruns.db.lock"
    held: list[bool] = []

    class Client:
        def __init__(self, tracking_uri: str):
            fd = os.open(lock, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
            finally:
                os.close(fd)

        def get_experiment_by_name(self, name):
            return None

        def create_experiment(self, name, artifact_location=None):
            return "1"
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", Client)
    _init_tracking(_jobs(tmp_path), load_profile("local"))
    assert held == [True]


def test_submit_waits_for_a_store_being_created_then_creates_its_experiment(tmp_path):
    from dapo.sweep.cluster import load_profile
    from dapo.sweep.launcher import _init_tracking
    from dapo.tracking.tracker import store_lock
    jobs = _jobs(tmp_path)
    uri = f"sqlite:///{(tmp_path / 'out').resolve() / 'mlruns.db'}"
    errors: list[BaseException] = []

    def init():
        try:
            _init_tracking(jobs, load_profile("local"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    with store_lock(uri):                     # a trainer (or another submit) is creating the store
        t = threading.Thread(target=init)
        t.start()
        time.sleep(0.5)
        assert t.is_alive()
    t.join(180)
    assert not t.is_alive() and not errors, errors
    from mlflow.tracking import MlflowClient
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("s") is not None


# =========================================================================== 6. figures from a wrong snapshot
SNAP = REPO / "results" / "smollm2-mini" / "snapshot"     # a small committed snapshot (sweep smollm2-mini)


def _snap(tmp_path: Path, drop: str | None = None, blank: str | None = None) -> Path:
    import shutil

    import pandas as pd
    d = tmp_path / "snap"
    shutil.copytree(SNAP, d)
    df = pd.read_parquet(d / "runs.parquet")
    if drop:
        df = df.drop(columns=[drop])
    if blank:
        df.loc[df.index[::7], blank] = None
    df.to_parquet(d / "runs.parquet", index=False)
    return d


def _figures(capsys, *argv: str) -> str:
    from analysis.report import main
    rc = main(list(argv))
    cap = capsys.readouterr()
    assert rc == 2 and "Traceback" not in cap.err, (rc, cap.err)
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dapo figures: error: "), cap.err
    return lines[0]


@pytest.mark.parametrize("drop, blank, words", [
    ("arm", None, "lacks the column arm"), ("metric", None, "lacks the column metric"),
    ("value", None, "lacks the column value"), ("run_id", None, "lacks the column run_id"),
    ("seed", None, "lacks the column seed"), (None, "arm", "column arm is empty in"),
    (None, "metric", "column metric is empty in")])
def test_figures_refuse_a_snapshot_lacking_a_needed_column(tmp_path, capsys, drop, blank, words):
    """Each used to write a report with exit 0 (seeds 0, no arms, a table of NaN) or a traceback."""
    line = _figures(capsys, "--from-snapshot", str(_snap(tmp_path, drop, blank)), "--to", str(tmp_path / "out"))
    assert words in line and "runs.parquet" in line, line
    assert not (tmp_path / "out").exists()


def test_figures_refuse_another_sweeps_snapshot_and_a_final_k_below_1(tmp_path, capsys):
    out = tmp_path / "out"
    line = _figures(capsys, str(REPO / "sweeps" / "table1-mini.yaml"), "--from-snapshot", str(SNAP), "--to", str(out))
    assert "of sweep 'smollm2-mini' (its sweep.json)" in line and "'table1-mini'" in line, line
    for k in ("0", "-1"):
        line = _figures(capsys, "--from-snapshot", str(SNAP), "--to", str(out), "--final-k", k)
        assert f"--final-k {k}: expected an integer >= 1" in line, line
    assert not out.exists()


# =========================================================================== 7. preflight
def _preflight_case(tmp: Path, case: str) -> list[str]:
    """The overrides of one bad-input case of ``dapo train``, its files made in ``tmp``."""
    (tmp / "two.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "1+2", "answer": "3"}\n')
    (tmp / "empty.jsonl").write_text("")
    (tmp / "afile").write_text("x")
    (tmp / "old").mkdir()
    (tmp / "old" / "mlruns.db").write_text("not a database")
    out = f"output_dir={tmp / 'out'}"
    return {"empty data": [out, f"data.train={tmp / 'empty.jsonl'}"],
            "short data": [out, f"data.train={tmp / 'two.jsonl'}"],
            "skip past the end": [out, "data.train_skip=19998"],
            "train_limit 0": [out, "data.train_limit=0"], "train_limit -3": [out, "data.train_limit=-3"],
            "train_limit < batch": [out, "data.train_limit=3"],
            "mini-base:0": [out, "model.path=mini-base:0"], "mini-base:5": [out, "model.path=mini-base-v2:5"],
            "mini-base huge": [out, "model.path=mini-base:99999999999"],
            "kv cache 0": [out, "rollout.vllm_kv_cache_gib=0"],
            "ftp store": [out, "logging.tracking_uri=ftp://h/x"], "s3 store": [out, "logging.tracking_uri=s3://b/x"],
            "empty experiment": [out, "logging.experiment="],
            "corrupt default store": [f"output_dir={tmp / 'old'}"],
            "corrupt sqlite uri": [out, f"logging.tracking_uri=sqlite:///{tmp / 'old' / 'mlruns.db'}"],
            "store is a dir": [out, f"logging.tracking_uri=sqlite:///{tmp / 'old'}"],
            "unreachable server": [out, "logging.tracking_uri=http://127.0.0.1:1"],
            "output_dir a file": [f"output_dir={tmp / 'afile'}"],
            "output_dir under a file": [f"output_dir={tmp / 'afile' / 'sub'}"],
            "empty eval set": [out, f"eval.datasets=[{{name: {tmp / 'empty.jsonl'}}}]"]}[case]


PREFLIGHT = {
    "empty data": "0 usable training problems", "short data": "2 usable training problems (2 of 2 rows kept), "
    "fewer than one generation round takes (train.batch_prompts = 4)", "skip past the end": "after data.train_skip",
    "train_limit 0": "data.train_limit = 0: must be >= 1", "train_limit -3": "data.train_limit = -3: must be >= 1",
    "train_limit < batch": "data.train_limit = 3: fewer training problems than one generation round takes (4",
    "mini-base:0": "mini-base:<supervised steps> takes 10 to 100000 steps", "mini-base:5": "at least its 10 warm-up",
    "mini-base huge": "takes 10 to 100000 steps", "kv cache 0": "rollout.vllm_kv_cache_gib = 0.0: must be > 0",
    "ftp store": "unsupported scheme 'ftp'", "s3 store": "unsupported scheme 's3'",
    "empty experiment": "logging.experiment = ''", "corrupt default store": "mlruns.db is not an SQLite database",
    "corrupt sqlite uri": "is not an SQLite database", "store is a dir": "is a directory, not an SQLite database",
    "unreachable server": "tracking server http://127.0.0.1:1 does not answer",
    "output_dir a file": "output_dir = ", "output_dir under a file": "which is a file",
    "empty eval set": "eval.datasets[0].name = ", }


@pytest.mark.parametrize("case", list(PREFLIGHT))
def test_preflight_refuses_what_used_to_start_a_run_and_end_in_a_traceback(tmp_path, train_main, case):
    """Each case used to create a run dir and end in a traceback (the sampler, the base-model build, vLLM,
    MLflow, mkdir); now one ``error:`` line before anything is written."""
    overrides = _preflight_case(tmp_path, case)
    before = files_under(tmp_path)
    t0 = time.monotonic()
    rc, err, calls = train_main(*overrides)
    assert rc == 2 and not calls and err.startswith("error: ") and err.count("\n") == 1, err
    assert PREFLIGHT[case] in err, err
    assert files_under(tmp_path) == before and time.monotonic() - t0 < 30


# =========================================================================== 9. an unreachable or broken store
def _truncated_sqlite(path: Path) -> Path:
    import sqlite3
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.executemany("INSERT INTO t VALUES (?)", [("y" * 500,)] * 200)
    con.commit()
    con.close()
    with open(path, "r+b") as f:
        f.truncate(6000)       # the header is right, the pages behind it are gone
    return path


@pytest.mark.parametrize("case", ["server", "garbage", "directory", "truncated"])
def test_figures_from_an_unreachable_or_broken_store_is_one_line_at_once(tmp_path, capsys, case):
    """An unreachable server was retried by MLflow for ~249 s, then a 115-line traceback; a damaged
    mlruns.db gave SQLAlchemy's traceback."""
    runs = tmp_path / "runs"
    db = runs / "mlruns.db"
    if case == "garbage":
        db.parent.mkdir()
        db.write_text("not a database")
    elif case == "directory":
        db.mkdir(parents=True)
    elif case == "truncated":
        _truncated_sqlite(db)
    store = ["--tracking-uri", "http://127.0.0.1:1"] if case == "server" else ["--runs", str(runs)]
    t0 = time.monotonic()
    line = _figures(capsys, "--sweep", "s", *store, "--to", str(tmp_path / "out"))
    assert time.monotonic() - t0 < 30, time.monotonic() - t0
    want = {"server": "tracking server http://127.0.0.1:1 does not answer (ConnectionRefusedError",
            "garbage": "is not an SQLite database", "directory": "is a directory, not an SQLite database",
            "truncated": "is not an SQLite database"}[case]
    assert want in line, line
    assert not (tmp_path / "out").exists()


# =========================================================================== 10. Ctrl-C
SIGINT_EACH = """
import importlib, os, signal, sys, time
import dapo.cli as cli
def interrupted(argv):
    os.kill(os.getpid(), signal.SIGINT)   # a real Ctrl-C, delivered while the command runs
    time.sleep(30)
    return 0
for cmd, (module, _) in cli.COMMANDS.items():
    if cmd in ("config", "train"):
        setattr(cli, cmd + "_main", interrupted)
    else:
        importlib.import_module(module).main = interrupted
    t0 = time.monotonic()
    rc = cli.main([cmd, "x"])
    print(cmd, rc, round(time.monotonic() - t0, 1), flush=True)
"""


def test_ctrl_c_in_every_command_is_one_line_and_exit_130():
    """Ctrl-C printed a traceback everywhere (~140 lines in train); now ``dapo <cmd>: interrupted``, 130."""
    from dapo.cli import COMMANDS
    r = subprocess.run([sys.executable, "-c", SIGINT_EACH], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    rows = [line.split() for line in r.stdout.splitlines()]
    assert [row[0] for row in rows] == list(COMMANDS) and all(row[1] == "130" for row in rows), r.stdout
    assert all(float(row[2]) < 10 for row in rows), r.stdout                 # at once, not after the sleep
    assert r.stderr.splitlines() == [f"dapo {cmd}: interrupted" for cmd in COMMANDS], r.stderr


def test_ctrl_c_in_a_real_training_run_exits_130_in_one_line_and_the_run_resumes(tmp_path):
    """SIGINT in the middle of rollout step 2's update: exit 130, the last stderr line names the run dir,
    no traceback; the same command resumes from checkpoint 1 and finishes."""
    out, run_dir, markers = tmp_path / "out", tmp_path / "run", tmp_path / "markers"
    args = [sys.executable, "-m", "dapo.cli", "train", str(SMOKE), "rollout.engine=hf", "rollout.n=2",
            "rollout.max_new_tokens=4", "train.batch_prompts=2", "train.mini_batch_prompts=1", "train.micro_batch_seqs=2",
            "train.threads=1", "eval.at_start=false", "eval.k=1", "eval.datasets=[{name: arith-eval, limit: 2}]",
            "data.train_limit=16", "logging.progress=false", "train.rollout_steps=3", "checkpoint.every=1",
            f"output_dir={out}", "--run-dir", str(run_dir)]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAPO_FAULT_")}, "PYTHONPATH": str(REPO),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "DAPO_FAULT_PAUSE": "update@2",
           "DAPO_FAULT_PAUSE_S": "120", "DAPO_FAULT_MARKER_DIR": str(markers)}
    p = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (markers / "update@2").exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"dapo train: interrupted; {run_dir} keeps its last checkpoint: the same "
                                            f"command resumes it"), err[-2000:]
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and (run_dir / "summary.json").exists(), r.stderr[-3000:]
    assert "resuming from" in r.stdout + r.stderr and "rollout step 1," in r.stdout + r.stderr


# =========================================================================== 11. the rough edges
def _cli(capsys, *argv: str) -> str:
    """``dapo ARGV`` in-process: exit 2 and exactly one ``error:`` line on stderr, nothing on stdout."""
    from dapo.cli import main
    rc = main(list(argv))
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), (rc, cap.err)
    assert "Traceback" not in cap.err + cap.out
    return lines[0]


def _must_not_run(*args, **kwargs):
    raise AssertionError("a bad flag must stop the command before it builds or runs anything")


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], "error: dapo base: --steps 0: must be >= 1"),
    (["--steps", "5"], "--warmup-steps 10: must be in [0, steps]"),
    (["--preset", "nope"], "--preset 'nope': is not one of"),
    (["--lr", "nan"], "--lr nan: expected a finite number"), (["--lr", "-1"], "--lr -1.0: must be > 0"),
    (["--n-ops", "3,1"], "--n-ops (3, 1): must be (lo, hi)"), (["--threads", "0"], "--threads 0: must be >= 1"),
    (["--length-buckets", "0"], "--length-buckets 0"), (["--out", "FILE"], "not a directory"),
    (["--out", "NOT-A-MODEL", "--steps", "10"], "exists and is not a base model directory")])
def test_base_flags_out_of_range_are_one_error_line_before_anything_is_built(tmp_path, capsys, monkeypatch,
                                                                             argv, words):
    import dapo.base_model
    if "NOT-A-MODEL" not in argv:      # (that one is refused by build_base_model itself, before any work)
        monkeypatch.setattr(dapo.base_model, "build_base_model", _must_not_run)
    (tmp_path / "f").write_text("x")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes").write_text("keep")
    argv = [{"FILE": str(tmp_path / "f"), "NOT-A-MODEL": str(tmp_path / "mine")}.get(a, a) for a in argv]
    before = files_under(tmp_path)
    assert words in _cli(capsys, "base", *argv)
    assert files_under(tmp_path) == before


def test_base_flag_error_in_a_process_imports_no_torch(tmp_path):
    one_error(dapo("base", "--steps", "0", cwd=tmp_path), "--steps 0")


@pytest.mark.parametrize("case", ["missing spec", "bad yaml", "output file", "results file"])
def test_demo_flags_are_one_error_line(tmp_path, capsys, monkeypatch, case):
    import dapo.base_model
    import dapo.sweep.launcher
    monkeypatch.setattr(dapo.sweep.launcher, "submit", _must_not_run)
    monkeypatch.setattr(dapo.base_model, "build_base_model", _must_not_run)
    (tmp_path / "f").write_text("x")
    (tmp_path / "s.yaml").write_text("name: s\nbase: [\n")
    argv, words = {"missing spec": (["--spec", str(tmp_path / "none.yaml")], "no such sweep spec"),
                   "bad yaml": (["--spec", str(tmp_path / "s.yaml")], "not valid YAML: line 3, column 1"),
                   "output file": (["--output", str(tmp_path / "f")], "--output"),
                   "results file": (["--results", str(tmp_path / "f")], "--results")}[case]
    assert words in _cli(capsys, "demo", *argv, "--output" if case != "output file" else "--results",
                         str(tmp_path / "o"))
    assert files_under(tmp_path) == {"f", "s.yaml"}


@pytest.mark.parametrize("text, words", [
    ("train:\n  lr: [1, 2\nrollout:\n  n: 3\n", "line 3, column 8: expected ',' or ']', but got ':' "
                                                 "(while parsing a flow sequence at line 2, column 7)"),
    ("a: 1\n\tb: 2\n", "line 2, column 1: found character '\\t' that cannot start any token"),
    ("a: b: c\n", "line 1, column 5: mapping values are not allowed here"),
    ('a: "x\x00y"\n', "unacceptable character #x0000")])
def test_yaml_syntax_errors_are_one_readable_line(tmp_path, capsys, text, words):
    """They were PyYAML's message as a Python repr: quotes, literal \\n, a '<unicode string>' snippet."""
    (tmp_path / "x.yaml").write_text(text)
    line = _cli(capsys, "config", str(tmp_path / "x.yaml"))
    assert words in line and "\\n" not in line and "<unicode string>" not in line and "^" not in line, line


def test_a_bad_command_line_value_is_blamed_on_the_command_line_not_the_file(capsys):
    line = _cli(capsys, "config", str(SMOKE), "train.lr=[1,")
    assert line == f"error: command line: train.lr = '[1,': expected float (overriding {SMOKE})", line
    line = _cli(capsys, "config", str(SMOKE), "eval.datasets=[{name: arith-eval, limit: 0}]")
    assert line.startswith("error: command line: eval.datasets[0].limit = 0"), line
    with pytest.raises(ConfigError, match=r"^\S*tiny-random-smoke.yaml: train.lr"):   # a spec's dict: the file
        load_config(SMOKE, {"train.lr": "x"})


def test_runs_with_a_missing_or_file_output_is_an_error(tmp_path, capsys):
    assert "no such directory" in _cli(capsys, "runs", "--output", str(tmp_path / "none"))
    (tmp_path / "f").write_text("x")
    assert "not a directory" in _cli(capsys, "runs", "--output", str(tmp_path / "f"))
    assert not (tmp_path / "none").exists()


# =========================================================================== newcomer friction
def test_no_kept_group_gives_zero_advantages_without_a_torch_warning():
    """A step whose dynamic sampling keeps no group used to print torch's std() 'degrees of freedom' warning."""
    import warnings

    import torch

    from dapo.algo import group_advantages
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert group_advantages(torch.zeros(0, 4)).shape == (0, 4)


def test_a_new_store_is_created_without_mlflow_info_lines(tmp_path):
    code = ("import sys; from dapo.tracking.tracker import Tracker; "
            "Tracker(sys.argv[1], 'e', 'r').finish()")
    r = subprocess.run([sys.executable, "-c", code, f"sqlite:///{tmp_path / 'mlruns.db'}"], cwd=REPO, capture_output=True,
                       text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "INFO" not in r.stderr and "database tables" not in r.stderr, r.stderr


def test_the_demo_ends_with_a_short_table_and_what_one_seed_can_show():
    """`make demo` ended with a raw 26-column DataFrame (NaN in most of it)."""
    import pandas as pd

    from dapo.commands.demo import final_table
    df = pd.DataFrame({"arm": ["grpo", "dapo"], "label": ["naive GRPO", "DAPO"], "ours": [19.76, 26.4],
                       "ci_lo": [19.76, 26.4], "d_prev": [float("nan"), 6.64], "wall_min": [4.04, 4.1],
                       "n_seeds": [1, 1], "p_holm": [float("nan"), 1.0]})
    text = final_table(df)
    lines = text.splitlines()
    assert lines[1].split() == ["arm", "final", "score", "vs", "previous", "minutes"]
    assert lines[2].split() == ["naive", "GRPO", "19.8", "-", "4.0"] and lines[3].split() == ["DAPO", "26.4", "+6.6", "4.1"]
    assert "NaN" not in text and "ci_lo" not in text and len(lines) == 5
    assert lines[4].startswith("One seed per arm") and "seed-to-seed noise" in lines[4]
    assert final_table(df.assign(n_seeds=10)).splitlines()[-1].startswith("10 seeds per arm")


# =========================================================================== 8. plan flags, launch layout
@pytest.mark.parametrize("args, words", [
    (["--mfu", "0"], "--mfu = 0: a FLOP utilisation must be in (0, 1]"),
    (["--mfu", "nan"], "--mfu = nan: expected a finite number"),
    (["--overhead-gib", "-5"], "--overhead-gib = -5: must be >= 0"),
    (["--vllm-act-gib", "-1"], "--vllm-act-gib = -1: must be >= 0"),
    (["--peak-tflops", "0"], "--peak-tflops = 0: must be > 0"),
    (["--decode-tps-32b", "inf"], "expected a finite number"),
    (["--rounds", "0"], "--rounds = 0: a step takes at least one generation round"),
    (["--mean-response-tokens", "0"], "--mean-response-tokens = 0: must be > 0"),
    (["launch.num_nodes=100000"], "launch.num_nodes = 100000: cluster profile 'example-gpu-cluster'"),
    (["launch.num_processes=16"], "launch.num_processes = 16: cluster profile 'example-gpu-cluster'"),
    (["launch.num_processes=0"], "launch.num_processes = 0: must be >= 1"),
])
def test_plan_flags_and_layouts_out_of_range_are_one_error_line(capsys, args, words):
    from dapo.sweep import plan
    rc = plan.main([str(REPO / "experiments" / "paper-dapo-32b.yaml"), *args, "--cluster", "example-gpu-cluster"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "" and cap.err.count("\n") == 1 and words in cap.err, cap.err


@pytest.mark.parametrize("ov", [{"launch.num_processes": 0}, {"launch.num_nodes": 0},
                                {"launch.num_processes": 0, "rollout.tensor_parallel_size": 1}])
def test_a_zero_process_layout_is_a_config_error_not_a_division_by_zero(ov):
    with pytest.raises(ConfigError, match=r"launch\.num_(processes|nodes) = 0: must be >= 1"):
        load_config(SMOKE, ov)


@pytest.mark.parametrize("case", ["healthy", "empty", "short header", "pages gone", "foreign", "directory",
                                  "broken link", "missing", "hot journal"])
def test_one_store_check_for_preflight_tracker_and_analysis(tmp_path, case):
    """The sqlite checks of preflight, the tracker and `dapo figures` are one function
    (dapo.store_checks); a header cut short (< 100 bytes) and pages gone behind a good header
    are damaged, an empty file is a new store, a missing one is the run's to create."""
    import sqlite3
    from analysis.runs import store_problem
    from dapo.preflight import sqlite_problem
    from dapo.store_checks import sqlite_file_problem
    db = tmp_path / "mlruns.db"
    if case == "healthy":
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE t (x)")
        con.commit()
        con.close()
    elif case == "empty":
        db.write_bytes(b"")
    elif case == "short header":
        db.write_bytes(b"SQLite format 3\x00" + b"\x10" * 20)
    elif case == "pages gone":
        _truncated_sqlite(db)
    elif case == "foreign":
        db.write_text("not a database")
    elif case == "directory":
        db.mkdir()
    elif case == "broken link":
        db.symlink_to(tmp_path / "nowhere.db")
    elif case == "hot journal":   # a writer killed mid-transaction (as torchrun's SIGTERM after a rank died)
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE t (x)")
        con.commit()
        con.close()
        code = (f"import os, signal, sqlite3\ncon = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
                "con.execute('PRAGMA cache_size=1'); con.execute('BEGIN')\n"
                "for _ in range(5000): con.execute('INSERT INTO t VALUES (?)', (b'x' * 200,))\n"
                "os.kill(os.getpid(), signal.SIGKILL)\n")
        assert subprocess.run([sys.executable, "-c", code]).returncode == -signal.SIGKILL
        assert (tmp_path / "mlruns.db-journal").stat().st_size > 0
    bad = {"short header": "is not an SQLite database", "pages gone": "is not an SQLite database",
           "foreign": "is not an SQLite database", "directory": "is a directory",
           "broken link": "broken symbolic link"}.get(case)
    problem = sqlite_file_problem(db)
    assert (problem is None) == (bad is None) and (bad is None or bad in problem), problem
    if case == "hot journal":   # the next writer rolls the journal back: the committed row is all there is
        con = sqlite3.connect(db)
        assert con.execute("SELECT COUNT(*) FROM t").fetchone() == (0,)
        con.close()
    assert sqlite_problem(db) == problem
    via_analysis = store_problem(f"sqlite:///{db}")
    if case == "missing":
        assert "does not exist" in via_analysis
    else:
        assert via_analysis == (None if problem is None else f"tracking store sqlite:///{db}: {problem}")


@pytest.mark.parametrize("argv, words", [
    (["--sweep", "s", "--formats", "svg"], "--formats must start with png"),
    (["--sweep", "s", "--reading", "/nonexistent/reading.md"], "--reading /nonexistent/reading.md: no such file"),
    (["--from-snapshot"], "--from-snapshot without DIR needs the sweep"),
    (["--from-snapshot", "/nonexistent-snap"], "no snapshot in /nonexistent-snap (runs.parquet missing)"),
    ([], "give the sweep (SPEC or --sweep NAME), or --from-snapshot DIR"),
])
def test_figures_argument_mistakes_are_one_line_without_usage(capsys, argv, words):
    """These went through argparse: a `usage:` block, then the error."""
    assert words in _figures(capsys, *argv)
