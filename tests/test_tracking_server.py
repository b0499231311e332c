"""Tracking at cluster scale: an MLflow server on a real PostgreSQL, profiles, secrets.

The slow tests start a throwaway PostgreSQL cluster (scripts/setup-postgres.sh: initdb in a
temporary directory, 127.0.0.1 and a free port, stopped by its pid) unless scripts/run-tests.sh
already started one (``DAPO_PG_URI``), then an MLflow server over it (dapo.tracking.mlflow_server):

- 12 writer processes × 200 steps through the server: every point once; one writer SIGKILLs
  itself mid-flush and one is killed -9 from outside, both restarted;
- the server stopped mid-run: the writer fails after its bounded retries with a clear
  message, and once the server is back the restarted writer ends with every point once;
- a 2-arm × 2-seed sweep (local executor) logs through the server; ``dapo figures`` reads it
  with one request per metric and gives the same Table 1 and tidy table as from a sqlite
  copy of the same runs;
- a sweep whose profile names a ``postgresql://`` store and a password file: the password is
  in no file the sweep writes, nor in the job script, nor in MLflow.

The fast tests (no PostgreSQL) cover the URI/profile/secret rules and the pre-submit check.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from bench.bench_tracking import check_points, read_points
from dapo.config import ConfigError
from dapo.sweep.cluster import load_profile
from dapo.tracking.mlflow_server import free_port, start_server
from dapo.tracking.tracker import TrackingError, Tracker, check_server, redact, refuse_password, uri_password

REPO = Path(__file__).resolve().parents[1]
PG_SCRIPT = REPO / "scripts" / "setup-postgres.sh"
LIMITS = {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 2, "mem_gb": 8, "time_min": 60}


# =========================================================================== helpers
def write_spec(tmp_path: Path, name: str, seeds: list[int], *, one_arm: bool = False) -> Path:
    """A 2-arm ladder (or a 1-arm grid) on the random-init smoke model (hf engine, 2 rollout steps, eval each)."""
    spec = {"name": name, "base": "experiments/tiny-random-smoke.yaml", "kind": "ladder",
            "base_overrides": {"rollout.engine": "hf", "train.threads": 1, "logging.progress": False,
                               "eval.every": 1},
            "baseline": {"name": "grpo", "label": "GRPO", "overrides": {"algo.clip.eps_high": 0.2}, "paper": 30},
            "techniques": [{"name": "clip_higher", "label": "+ clip-higher", "paper": 38,
                            "overrides": {"algo.clip.eps_high": 0.28}}],
            "seeds": seeds, "metric": "eval/arith-eval/avg_at_2", "final_k": 1,
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2, "time_min": 30},
            "max_concurrent": 2}
    if one_arm:
        del spec["baseline"], spec["techniques"]
        spec.update(kind="grid", grid={"algo.clip.eps_high": [0.28]})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_profile(tmp_path: Path, name: str, **tracking) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "executor": "local", "limits": LIMITS, "max_array_parallel": 2,
                                    **tracking}, sort_keys=False))
    return path


def run(cmd: list[str], *, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; the whole group is killed if it outlives ``timeout``."""
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{' '.join(cmd[:6])}... hung for {timeout}s:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def writer(reap: list, uri: str, w: int, state: Path, *, steps: int, metrics: int, env: dict | None = None,
           **kw) -> subprocess.Popen:
    """One writer process of bench/bench_tracking.py (what a training job does with its Tracker).

    It runs in its own process group, which ``reap`` (the fixture) kills if the test ends first.
    """
    args = json.dumps({"uri": uri, "experiment": "writers", "writer": w, "state_path": str(state),
                       "steps": steps, "metrics": metrics, **kw})
    p = subprocess.Popen([sys.executable, "-m", "bench.bench_tracking", "--writer", args], cwd=REPO,
                         env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    reap.append(p)
    return p


@pytest.fixture
def reap():
    """Processes a test started; any still running when it ends (a failed wait) are killed with their group."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """Wait for every writer (killing every process group past ``timeout``): [(returncode, output)]."""
    deadline = time.monotonic() + timeout
    out = []
    for p in procs:
        try:
            text = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            pytest.fail(f"writers hung for {timeout}s")
        out.append((p.returncode, text))
    return out


def wait_for_step(state: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state.exists() and json.loads(state.read_text())["step"] >= step:
            return
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    pytest.fail(f"{state} never reached step {step}")


# =========================================================================== fast: no PostgreSQL
def test_uri_passwords_are_found_and_masked():
    assert uri_password("postgresql://mlflow:s3cr3t@db.lab:5432/mlflow") == "s3cr3t"
    assert uri_password("http://alice:pw@mlflow.lab:5000") == "pw"
    assert uri_password("postgresql://db.lab/mlflow?sslmode=require&password=q1") == "q1"
    assert uri_password("postgresql://mlflow@db.lab:5432/mlflow") is None
    assert uri_password("http://127.0.0.1:5000") is None and uri_password("sqlite:////tmp/a:b@c.db") is None
    text = "failed: postgresql://mlflow:s3cr3t@db.lab/m and http://a:pw@h:1/x?password=q1&k=2"
    assert redact(text) == "failed: postgresql://mlflow:***@db.lab/m and http://a:***@h:1/x?password=***&k=2"
    with pytest.raises(TrackingError) as exc:
        refuse_password("postgresql://mlflow:s3cr3t@db.lab/mlflow", "logging.tracking_uri")
    assert "s3cr3t" not in str(exc.value) and "postgresql://mlflow:***@db.lab/mlflow" in str(exc.value)
    assert "tracking_password_file" in str(exc.value)


def test_tracker_refuses_a_password_in_its_uri():
    with pytest.raises(TrackingError, match=r"logging.tracking_uri: the tracking URI postgresql://u:\*\*\*@") as exc:
        Tracker("postgresql://u:Hunter2x@127.0.0.1:1/mlflow", "e", "r")
    assert "Hunter2x" not in str(exc.value)


@pytest.mark.parametrize("extra, words", [
    ({"tracking_uri": "postgresql://u:Hunter2x@db/m"}, "tracking_uri = 'postgresql://u:***@db/m' holds a password"),
    ({"tracking_uri": "ftp://db/m"}, "tracking_uri = 'ftp://db/m': expected an MLflow tracking URI"),
    ({"tracking_uri": "postgresql://u@db/m", "tracking_password_env": "A", "tracking_password_file": "/f"},
     "give tracking_password_env or tracking_password_file, not both"),
    ({"tracking_uri": "postgresql://u@db/m", "tracking_password_env": "$(x)"}, "is not a valid variable name"),
    ({"tracking_password_file": "/f"}, "a tracking password is named but tracking_uri is not set"),
    ({"tracking_uri": "http://h:1\nexport X=1"}, "tracking_uri: expected one non-empty line"),
])
def test_profile_tracking_keys_are_checked(tmp_path, extra, words):
    with pytest.raises(ConfigError) as exc:
        load_profile(write_profile(tmp_path, "p", **extra))
    assert words in str(exc.value) and "Hunter2x" not in str(exc.value)
    assert str(tmp_path / "p.yaml") in str(exc.value)


def test_job_script_exports_the_uri_and_only_the_password_source(tmp_path):
    pw_file = tmp_path / "pw"
    pw_file.write_text("Hunter2x\n")
    prof = write_profile(tmp_path, "p", tracking_uri="postgresql://mlflow@db.lab:5432/mlflow",
                         tracking_password_file=str(pw_file))
    spec = write_spec(tmp_path, "s", [0])
    p = run([sys.executable, "-m", "dapo.sweep", "submit", str(spec), "--cluster", str(prof), "--output",
             str(tmp_path / "out"), "--dry-run"], timeout=300)
    assert p.returncode == 0, p.stderr
    assert "export MLFLOW_TRACKING_URI=postgresql://mlflow@db.lab:5432/mlflow" in p.stdout
    assert f"export DAPO_TRACKING_PASSWORD_FILE={pw_file}" in p.stdout
    assert "Hunter2x" not in p.stdout + p.stderr


def test_submit_checks_the_server_before_submitting_anything(tmp_path):
    port = free_port()   # nothing listens there
    prof = write_profile(tmp_path, "p", tracking_uri=f"http://127.0.0.1:{port}")
    out = tmp_path / "out"
    p = run([sys.executable, "-m", "dapo.sweep", "submit", str(write_spec(tmp_path, "s", [0])), "--cluster",
             str(prof), "--output", str(out)], timeout=300)
    assert p.returncode == 2 and p.stdout == ""
    err = p.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err   # one clear line
    assert err.startswith(f"error: tracking server http://127.0.0.1:{port} does not answer (")
    assert "Connection refused" in err and "nothing was submitted" in err and str(prof) in err
    assert not (out / "sweeps").exists() and not list(out.glob("runs/*"))   # no record, no run directory
    with pytest.raises(TrackingError, match="does not answer"):
        check_server("postgresql://dapo@127.0.0.1:%d/mlflow" % port, timeout_s=5)


def test_the_writers_check_finds_lost_duplicated_and_wrong_points():
    from bench.bench_tracking import PROGRESS, metric_names, metric_value
    good = {(n, s): [metric_value(1, s, m)] for m, n in enumerate(metric_names(2)) for s in (1, 2)}
    good.update({(p, s): [float(s)] for p in PROGRESS for s in (1, 2)})
    assert check_points({"w01": good}, [1], steps=2, metrics=2) == []
    lost = {k: v for k, v in good.items() if k != ("bench/m01", 2)}
    dup = {**good, ("bench/m00", 1): good[("bench/m00", 1)] * 2}
    wrong = {**good, ("progress/rollout_step", 2): [3.0]}
    assert check_points({"w01": lost}, [1], steps=2, metrics=2) == ["w01: 1 point(s) missing, e.g. [('bench/m01', 2)]"]
    assert check_points({"w01": dup}, [1], steps=2, metrics=2) == ["w01: 1 point(s) duplicated, e.g. [('bench/m00', 1)]"]
    assert check_points({"w01": wrong}, [1], steps=2, metrics=2) == [
        "w01: 1 point(s) wrong value, e.g. [('progress/rollout_step', 2)]"]
    assert check_points({}, [1], steps=2, metrics=2) == ["w01: no run"]


# =========================================================================== PostgreSQL fixtures
@dataclass
class PG:
    base_uri: str        # postgresql://dapo@127.0.0.1:PORT/mlflow (no password)
    password_file: str

    @property
    def password(self) -> str:
        return Path(self.password_file).read_text().strip()

    def database(self, prefix: str) -> str:
        """A new, empty database on the cluster; its URI (no password)."""
        import psycopg
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.base_uri, password=self.password, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.base_uri.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="module")
def pg():
    if os.environ.get("DAPO_PG_URI") and os.environ.get("DAPO_PG_PASSWORD_FILE"):   # scripts/run-tests.sh's
        yield PG(os.environ["DAPO_PG_URI"], os.environ["DAPO_PG_PASSWORD_FILE"])
        return
    inst = subprocess.run(["bash", str(PG_SCRIPT), "install"], capture_output=True, text=True, timeout=900)
    if inst.returncode != 0:
        reason = (inst.stderr.strip().splitlines() or ["?"])[-1]
        if os.environ.get("DAPO_PG_REQUIRED") == "1":
            pytest.fail(f"PostgreSQL is required (DAPO_PG_REQUIRED=1) but cannot be installed: {reason}")
        pytest.skip(f"PostgreSQL binaries cannot be installed on this machine: {reason}")
    start = subprocess.run(["bash", str(PG_SCRIPT), "start"], capture_output=True, text=True, timeout=300)
    assert start.returncode == 0, start.stderr[-3000:]
    env = dict(line[len("export "):].split("=", 1) for line in start.stdout.splitlines() if line.startswith("export "))
    try:
        yield PG(env["DAPO_PG_URI"], env["DAPO_PG_PASSWORD_FILE"])
    finally:
        stop = subprocess.run(["bash", str(PG_SCRIPT), "stop", env["DAPO_PG_DIR"]], capture_output=True, text=True,
                              timeout=120)
        assert stop.returncode == 0, stop.stderr
        subprocess.run(["rm", "-rf", env["DAPO_PG_DIR"]], check=False)


@pytest.fixture(scope="module")
def server(pg, tmp_path_factory):
    """An MLflow server over a fresh PostgreSQL database; ``.srv`` may be stopped and replaced by a test."""
    holder = SimpleNamespace(db=pg.database("srv"), root=tmp_path_factory.mktemp("mlflow-server"), srv=None)
    holder.srv = start_server(holder.root, backend_store_uri=holder.db, password_file=pg.password_file)
    try:
        yield holder
    finally:
        holder.srv.stop()


# =========================================================================== slow: PostgreSQL
@pytest.mark.slow
def test_the_server_reads_its_password_from_a_file_and_a_wrong_one_fails_fast(pg, server, tmp_path, monkeypatch):
    assert pg.password not in server.srv.log_path.read_text()
    assert pg.password not in " ".join(Path(f"/proc/{server.srv.proc.pid}/cmdline").read_text().split("\0"))
    bad = tmp_path / "bad"
    bad.write_text("not-the-password\n")
    bad.chmod(0o600)
    monkeypatch.setenv("DAPO_TRACKING_PASSWORD_FILE", str(bad))
    monkeypatch.setenv("PGPASSWORD", "-")       # recorded, so the Tracker's PGPASSWORD is undone too
    monkeypatch.delenv("PGPASSWORD")
    t = time.monotonic()
    with pytest.raises(TrackingError) as exc:
        Tracker(server.db, "e", "r")
    assert time.monotonic() - t < 30     # not MLflow's minutes of engine retries
    assert "password authentication failed" in str(exc.value) and "not-the-password" not in str(exc.value)


@pytest.mark.slow
def test_twelve_writers_each_point_once_and_killed_writers_resume(server, tmp_path, reap):
    steps, metrics, uri = 200, 4, server.srv.uri
    states = [tmp_path / f"w{w}.json" for w in range(12)]
    procs = [writer(reap, uri, w, states[w], steps=steps, metrics=metrics,
                    env={"DAPO_FAULT_KILL_IN_FLUSH": "57"} if w == 3 else None) for w in range(12)]
    wait_for_step(states[7], 100, procs[7])
    os.kill(procs[7].pid, signal.SIGKILL)                 # kill -9 from outside, mid-run
    results = finish(procs, timeout=900)
    assert results[3][0] == -signal.SIGKILL and results[7][0] == -signal.SIGKILL
    assert all(rc == 0 for w, (rc, _) in enumerate(results) if w not in (3, 7)), results
    assert 50 <= json.loads(states[3].read_text())["step"] < steps   # it died mid-run, after checkpoint 60's flush began
    again = finish([writer(reap, uri, w, states[w], steps=steps, metrics=metrics) for w in (3, 7)], timeout=600)
    assert [rc for rc, _ in again] == [0, 0], again
    points = read_points(uri, "writers")
    assert sorted(points) == [f"w{w:02d}" for w in range(12)]           # one run per writer, none restarted anew
    assert check_points(points, list(range(12)), steps=steps, metrics=metrics) == []
    from mlflow.tracking import MlflowClient
    exp = MlflowClient(uri).get_experiment_by_name("writers")
    assert len(MlflowClient(uri).search_runs([exp.experiment_id])) == 12


@pytest.mark.slow
def test_server_stopped_mid_run_fails_clearly_then_resumes(pg, server, tmp_path, reap):
    state, port = tmp_path / "w.json", server.srv.port
    uri = server.srv.uri
    p = writer(reap, uri, 20, state, steps=120, metrics=3, step_sleep=0.02, env={"DAPO_MLFLOW_RETRIES": "3"})
    wait_for_step(state, 30, p)
    server.srv.stop()
    (rc, out), = finish([p], timeout=300)
    assert rc == 1, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert re.match(rf"dapo\.tracking\.tracker\.TrackingError: MLflow store {re.escape(uri)}: .* failed 3 times \(.*\); "
                    r"the run is resumable from its last checkpoint", last), last
    assert "Connection refused" in last or "Max retries exceeded" in last, last
    stopped_at = json.loads(state.read_text())["step"]
    assert 30 <= stopped_at < 120
    server.srv = start_server(server.root, port=port, backend_store_uri=server.db, password_file=pg.password_file)
    (rc, out), = finish([writer(reap, uri, 20, state, steps=120, metrics=3)], timeout=600)
    assert rc == 0, out[-3000:]
    assert check_points(read_points(uri, "writers"), [20], steps=120, metrics=3) == []


def copy_runs(src: str, dst: str, experiment: str, artifacts: Path) -> None:
    """Copy an experiment's runs (tags, params, every metric point, config.yaml, status, times) to another store."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient
    a, b = MlflowClient(src), MlflowClient(dst)
    exp_id = b.create_experiment(experiment, artifact_location=artifacts.as_uri())
    for r in a.search_runs([a.get_experiment_by_name(experiment).experiment_id]):
        new = b.create_run(exp_id, start_time=r.info.start_time, run_name=r.info.run_name).info.run_id
        pts = [Metric(k, m.value, m.timestamp, m.step) for k in r.data.metrics for m in a.get_metric_history(r.info.run_id, k)]
        b.log_batch(new, params=[Param(k, v) for k, v in r.data.params.items()][:100],
                    tags=[RunTag(k, v) for k, v in r.data.tags.items() if not k.startswith("mlflow.")])
        for i in range(100, len(r.data.params), 100):
            b.log_batch(new, params=[Param(k, v) for k, v in list(r.data.params.items())[i:i + 100]])
        for i in range(0, len(pts), 1000):
            b.log_batch(new, metrics=pts[i:i + 1000])
        cfg = a.download_artifacts(r.info.run_id, "config.yaml", str(artifacts / "dl" / r.info.run_id))
        b.log_artifact(new, cfg)
        b.set_terminated(new, status=r.info.status, end_time=r.info.end_time)


@pytest.mark.slow
def test_sweep_logs_through_the_server_and_figures_match_sqlite(server, tmp_path, capsys):
    uri = server.srv.uri
    spec = write_spec(tmp_path, "pgsweep", [0, 1])
    prof = write_profile(tmp_path, "labserver", tracking_uri=uri)
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = run([sys.executable, "-m", "dapo.cli", "sweep", "submit", str(spec), "--cluster", str(prof), "--output",
             str(out)], timeout=1200, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count(": done") == 4, p.stdout
    assert not list(out.rglob("mlruns.db"))                              # nothing went to a sqlite file
    for summary in out.glob("runs/*/summary.json"):
        assert json.loads(summary.read_text())["mlflow_uri"] == uri
    from dapo.commands.runs import main as runs_main    # `dapo runs`: the run directories, and where to browse them
    capsys.readouterr()
    assert runs_main(["--output", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in rows] == ["done"] * 4 and {r["tracking_uri"] for r in rows} == {uri}
    assert runs_main(["--output", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"browse: open {uri} in a browser (the MLflow server serves the UI)"

    from mlflow.tracking import MlflowClient
    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("pgsweep").experiment_id])
    assert len(runs) == 4 and {r.data.tags["dapo.status"] for r in runs} == {"finished"}
    keys = {k for r in runs for k in r.data.metrics}
    from analysis.report import main as figures   # `dapo figures`, in this process (saves its start-up)
    offset = server.srv.log_path.stat().st_size
    assert figures([str(spec), "--tracking-uri", uri, "--to", str(tmp_path / "fig-server"), "--formats", "png"]) == 0
    with open(server.srv.log_path, "rb") as f:
        f.seek(offset)
        requests_log = f.read().decode(errors="replace")
    # one request per metric (4 runs fit one batch), none per (run, metric)
    assert requests_log.count("/ajax-api/2.0/mlflow/metrics/get-history-bulk?") == len(keys)
    assert not re.search(r"/mlflow/metrics/get-history[ ?]", requests_log)

    sqlite_uri = f"sqlite:///{tmp_path / 'copy' / 'mlruns.db'}"
    (tmp_path / "copy").mkdir()
    copy_runs(uri, sqlite_uri, "pgsweep", tmp_path / "copy" / "artifacts")
    assert figures([str(spec), "--tracking-uri", sqlite_uri, "--to", str(tmp_path / "fig-sqlite"),
                    "--formats", "png"]) == 0
    t_server = pd.read_csv(tmp_path / "fig-server" / "table1.csv")
    t_sqlite = pd.read_csv(tmp_path / "fig-sqlite" / "table1.csv")
    assert t_server["arm"].tolist() == ["grpo", "clip_higher"] and (t_server["grad_steps"] == 4).all()
    pd.testing.assert_frame_equal(t_server, t_sqlite)
    tidy = [pd.read_parquet(tmp_path / d / "snapshot" / "runs.parquet").drop(columns="run")
            .sort_values(["run_id", "metric", "grad_step"]).reset_index(drop=True) for d in ("fig-server", "fig-sqlite")]
    assert len(tidy[0]) > 100
    pd.testing.assert_frame_equal(tidy[0], tidy[1])


@pytest.mark.slow
def test_the_password_is_in_no_file_script_or_mlflow_record(pg, tmp_path):
    db = pg.database("secret")
    secret = pg.password
    prof = write_profile(tmp_path, "labdb", tracking_uri=db, tracking_password_file=pg.password_file)
    spec = write_spec(tmp_path, "secretsweep", [0], one_arm=True)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "DAPO_TRACKING_PASSWORD_FILE")}
    env["HF_HUB_OFFLINE"] = "1"
    base = [sys.executable, "-m", "dapo.cli", "sweep", "submit", str(spec), "--cluster", str(prof), "--output", str(out)]
    dry = run(base + ["--dry-run"], timeout=300, env=env)
    assert dry.returncode == 0 and f"export MLFLOW_TRACKING_URI={db}" in dry.stdout
    p = run(base, timeout=1200, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count(": done") == 1, p.stdout
    for text in (dry.stdout, dry.stderr, p.stdout, p.stderr):
        assert secret not in text
    files = [f for f in out.rglob("*") if f.is_file()]
    assert any(f.name.endswith("_log.out") for f in files) and any(f.name == "summary.json" for f in files)
    assert [f for f in files if secret.encode() in f.read_bytes()] == []      # run dirs, job logs, pickles, records
    import psycopg
    with psycopg.connect(db, password=secret) as conn:
        rows = {t: conn.execute(f"SELECT * FROM {t}").fetchall() for t in ("tags", "params", "runs", "experiments")}
        uris = {v for (v,) in conn.execute("SELECT value FROM params WHERE key = 'logging.tracking_uri'")}
    assert len(rows["runs"]) == 1 and len(rows["params"]) > 50 and uris == {db}   # the URI is there, its password not
    assert secret not in repr(rows)
