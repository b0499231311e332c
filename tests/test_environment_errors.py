"""The environment around a run (issue #41, items 5 and 6): a run whose MLflow store was removed, and an
output directory that is read-only or full. Each is one ``error:`` line naming the file and what to do,
never a traceback, and nothing is half-written: no empty MLflow store in place of the lost one, no
partial output in a directory that refuses writes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.config import ConfigError
from dapo.preflight import check_writable, lost_store
from dapo.store_checks import write_problem
from dapo.tracking.tracker import Tracker, TrackingError

REPO = Path(__file__).resolve().parents[1]
ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin"}
TINY = ["experiments/tiny-random-smoke.yaml", "rollout.engine=hf", "rollout.n=2", "rollout.max_new_tokens=4",
        "train.batch_prompts=2", "train.mini_batch_prompts=1", "train.micro_batch_seqs=2", "train.threads=1",
        "eval.at_start=false", "eval.k=1", "eval.datasets=[{name: arith-eval, limit: 2}]", "data.train_limit=16",
        "logging.progress=false"]


def _dapo(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dapo.cli", *args], cwd=REPO, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=600)


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    errors = [ln for ln in lines if ln.startswith(("error: ", "dapo figures: error: "))]
    assert len(errors) == 1, p.stderr[-2000:]
    return errors[0]


# --------------------------------------------------------------------------- a removed MLflow store
def test_a_tracker_resuming_into_a_removed_sqlite_store_refuses_and_creates_nothing(tmp_path):
    db = tmp_path / "mlruns.db"
    with pytest.raises(TrackingError, match=r"MLflow run abc123\) was logged to .*mlruns.db, which no longer exists"
                                            r".*--new-mlflow-run"):
        Tracker(f"sqlite:///{db}", "exp", "run", run_uuid="abc123")
    assert not db.exists()                          # MLflow would have created an empty store here


def test_a_tracker_resuming_a_run_its_store_does_not_hold_names_the_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    Tracker(uri, "exp", "a run").finish()           # the store exists, with another run
    with pytest.raises(TrackingError, match=r"MLflow run 0123456789abcdef\) is not in the MLflow store"):
        Tracker(uri, "exp", "run", run_uuid="0123456789abcdef")


def test_lost_store_reads_the_run_dirs_record(tmp_path):
    assert lost_store(tmp_path) is None                                       # no MLflow run recorded yet
    (tmp_path / "mlflow_run.json").write_text(json.dumps({"run_id": "r1", "tracking_uri": "http://host:5000"}))
    assert lost_store(tmp_path) is None                                       # a server: not a file to miss
    db = tmp_path / "mlruns.db"
    (tmp_path / "mlflow_run.json").write_text(json.dumps({"run_id": "r1", "tracking_uri": f"sqlite:///{db}"}))
    assert lost_store(tmp_path) == ("r1", db)
    db.write_bytes(b"")
    assert lost_store(tmp_path) is None


@pytest.mark.slow
def test_resuming_a_run_whose_store_was_removed(tmp_path):
    """The issue's probe end to end: a real `dapo train` (3M random model) killed after step 3 of 4 with
    checkpoint 2; its mlruns.db removed. The same command is one error line (exit 2) and leaves no store;
    `dapo eval` of the run says so too, instead of logging to a new store; `--new-mlflow-run` resumes from
    checkpoint 2 and logs to a new MLflow run tagged with where its history starts (steps 3-4, and 1-2 as
    checkpoint 2 kept them)."""
    out, run = tmp_path / "out", tmp_path / "run"
    args = ["train", *TINY, "train.rollout_steps=4", "checkpoint.every=2", f"output_dir={out}", "--run-dir", str(run)]
    killed = _dapo(*args, env={"DAPO_FAULT_KILL_AT_STEP": "3"})
    assert killed.returncode != 0 and (run / "checkpoints" / "step_000002").is_dir()
    db = out / "mlruns.db"
    old_id = json.loads((run / "mlflow_run.json").read_text())["run_id"]
    db.unlink()
    again = _dapo(*args)
    line = _one_error_line(again)
    assert again.returncode == 2 and f"MLflow run {old_id}) was logged to {db}, which no longer exists" in line
    assert "--new-mlflow-run" in line and not db.exists()
    ev = _dapo("eval", str(run), "--step", "2")
    line = _one_error_line(ev)
    assert ev.returncode == 2 and "--no-mlflow" in line and str(db) in line and not db.exists()
    fresh = _dapo(*args, "--new-mlflow-run")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert f"MLflow run {old_id} (steps up to 2) is left behind" in fresh.stdout
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{db}")
    new_id = json.loads((run / "mlflow_run.json").read_text())["run_id"]
    assert new_id != old_id
    tags = client.get_run(new_id).data.tags
    assert tags["dapo.history_from_step"] == "2" and tags["dapo.history_lost"] == old_id
    steps = sorted(m.step for m in client.get_metric_history(new_id, "rollout/acc_mean"))
    assert steps == [2, 4, 6, 8]   # grad steps of rollout steps 1-4: checkpoint 2 holds its points, replayed


# --------------------------------------------------------------------------- a read-only or full output
@contextlib.contextmanager
def _mounted(path: Path, options: str):
    """A tmpfs at ``path`` with ``options`` (root on Linux), else skip; unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        if os.geteuid() != 0 and "ro" in options.split(","):
            path.chmod(0o555)                      # not root: a directory without write permission
            try:
                yield path
            finally:
                path.chmod(0o755)
            return
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def readonly(tmp_path):
    with _mounted(tmp_path / "ro", "ro,size=1m") as p:
        yield p


def test_check_writable_names_the_directory_and_probes_nothing_left(readonly, tmp_path):
    with pytest.raises(ConfigError, match=r"--to '?.*ro/a/b'?: cannot write there \(Read-only file system|"
                                          r"Permission denied\).*where it would be made, refuses"):
        check_writable(readonly / "a" / "b", "--to")
    check_writable(tmp_path / "new" / "dir", "--to")
    assert not (tmp_path / "new").exists() and [p.name for p in tmp_path.iterdir()] == ["ro"]


def test_write_problem_only_for_what_a_writer_can_hit():
    import errno
    assert write_problem(OSError(errno.ENOSPC, "No space left on device", "/x/f")) == \
        "cannot write /x/f: No space left on device"
    assert write_problem(OSError(errno.ENOSPC, "No space left on device"), into="/out") == \
        "cannot write into /out: No space left on device"
    assert write_problem(OSError(errno.ENOENT, "No such file", "/x/f")) is None


def test_each_command_refuses_a_read_only_output_in_one_line_and_writes_nothing(readonly):
    """train, sweep submit, figures and eval into a read-only file system: exit non-zero, one `error:` line
    naming the path, no traceback, nothing written there (they used to print 18-34-line tracebacks)."""
    probes = {
        "train": ["train", *TINY, f"output_dir={readonly / 'out'}"],
        "sweep submit": ["sweep", "submit", "sweeps/demo.yaml", "--cluster", "local", "--output",
                         str(readonly / "runs")],
        "figures": ["figures", "--from-snapshot", "results/table1-mini/snapshot", "--to", str(readonly / "fig")],
        "eval": ["eval", "tiny-3m", "--protocol", "dapo", "--k", "1", "--limit", "2", "--to", str(readonly / "ev")],
    }
    for what, args in probes.items():
        p = _dapo(*args)
        line = _one_error_line(p)
        assert p.returncode != 0, what
        assert str(readonly) in line and ("Read-only" in line or "Permission denied" in line), (what, line)
        assert list(readonly.iterdir()) == [], what


def test_a_full_disk_during_a_write_is_one_line_naming_the_file(tmp_path):
    """A 64 KiB tmpfs fills while `dapo figures` writes its report: one line naming the file, exit 1."""
    with _mounted(tmp_path / "full", "size=64k") as full:
        p = _dapo("figures", "--from-snapshot", "results/table1-mini/snapshot", "--to", str(full / "fig"))
        line = _one_error_line(p)
        assert p.returncode == 1 and line.startswith(f"dapo figures: error: cannot write into {full}/fig") and \
            "No space left" in line and "run the same command again" in line
