"""Sweeps on a real one-node Slurm cluster (slurm/local-cluster.sh) and on submitit's LocalExecutor.

Every job is a real training run of the 3M random model with the transformers rollout engine
(seconds each). To keep the wall time down on 2 cores, one module fixture submits everything
at once — the smoke sweep (one array), a failing job, a job to preempt, one to cancel, and the
same sweeps through the LocalExecutor — and each test then waits for its part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

try:  # tests/ is on sys.path (pytest's default rootdir-less import mode) ...
    from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)
except ImportError:  # ... or tests is a package
    from tests.slurm_cluster import slurm_cluster  # noqa: F401

from dapo.commands.sweep import expand, load_profile, load_spec, main as sweep_main
from dapo.sweep import launcher
from dapo.sweep import state as sweep_state

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "sweeps" / "smoke-slurm.yaml"
WAIT_S = 420          # per wait; generous for a loaded 2-core CI machine
SMALL = {"rollout.engine": "hf", "train.threads": 1, "data.train_limit": 64, "logging.progress": False}


def _spec_file(folder: Path, name: str, base_overrides: dict, **extra) -> Path:
    spec = {"name": name, "base": "experiments/tiny-random-smoke.yaml", "kind": "grid",
            "base_overrides": {**SMALL, **base_overrides}, "grid": {"algo.clip.eps_high": [0.28]},
            "seeds": [0], "metric": "eval/arith-eval/avg_at_2", "final_k": 1,
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2, "time_min": 10},
            "max_concurrent": 1, "max_requeues": 1, **extra}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _cli(*argv: str, out: Path | None = None) -> subprocess.Popen:
    log = open(out, "w") if out else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "dapo.cli", "sweep", *argv], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})


class Launched:
    """What the module fixture submitted; ``wait_*`` poll until a condition holds."""

    def __init__(self, root: Path, cluster):
        self.root, self.cluster = root, cluster
        self.uri = f"sqlite:///{root / 'mlruns.db'}"
        self.started = time.monotonic()

    def status(self, spec, output: Path) -> list[dict]:
        return launcher.status(spec, output)

    def wait(self, what: str, cond, timeout: float = WAIT_S, every: float = 0.5):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = cond()
            if value:
                return value
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.cluster.logs()}")

    def wait_states(self, spec, output: Path, final=("done", "failed")) -> list[dict]:
        return self.wait(f"{spec.name} to end", lambda: (lambda rows: rows if all(
            r["state"] in final for r in rows) else None)(self.status(spec, output)))


@pytest.fixture(scope="module")
def launched(slurm_cluster, tmp_path_factory):  # noqa: F811 - the fixture imported above
    root = tmp_path_factory.mktemp("sweep-slurm")
    saved = {k: os.environ.get(k) for k in slurm_cluster.env}
    os.environ.update(slurm_cluster.env)
    L = Launched(root, slurm_cluster)
    quiet = lambda *_: None  # noqa: E731
    local = load_profile("local")
    try:
        # 1. the job to preempt (6 steps, a checkpoint after each) and its uninterrupted twin (local)
        L.preempt_spec = load_spec(_spec_file(root, "preempt", {"train.rollout_steps": 6, "checkpoint.every": 1}),
                                   {"logging.tracking_uri": L.uri})
        L.preempt_out = root / "preempt"
        L.preempt_rec = launcher.submit(L.preempt_spec, local, L.preempt_out, executor="slurm", log=quiet)
        L.reference_out = root / "reference"
        L.reference = _cli("submit", str(L.preempt_spec.path), "--cluster", "local", "--output",
                           str(L.reference_out), out=root / "reference.log")
        # 2. the shipped smoke sweep, 2 arms x 2 seeds, as one array; a failing job; one to cancel
        L.smoke_spec = load_spec(SMOKE, {"logging.tracking_uri": L.uri})
        L.smoke_out = root / "smoke"
        L.smoke_rec = launcher.submit(L.smoke_spec, local, L.smoke_out, executor="slurm", log=quiet)
        L.fail_spec = load_spec(_spec_file(root, "broken", {"data.train": str(root / "missing.jsonl")}),
                                {"logging.tracking_uri": L.uri})
        L.fail_rec = launcher.submit(L.fail_spec, local, L.smoke_out, executor="slurm", log=quiet)
        L.cancel_spec = load_spec(_spec_file(root, "cancelme", {"train.rollout_steps": 50}),
                                  {"logging.tracking_uri": L.uri})
        L.cancel_rec = launcher.submit(L.cancel_spec, local, L.smoke_out, executor="slurm", log=quiet)
        # 3. the same smoke sweep through submitit's LocalExecutor (the default of --cluster local)
        L.local_out = root / "local"
        L.local = _cli("submit", str(SMOKE), "--cluster", "local", "--output", str(L.local_out),
                       out=root / "local.log")
        yield L
    finally:
        for p in (getattr(L, "reference", None), getattr(L, "local", None)):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(30)
        for spec, out in ((getattr(L, "smoke_spec", None), root / "smoke"),
                          (getattr(L, "preempt_spec", None), root / "preempt")):
            if spec is not None:
                try:
                    launcher.cancel(spec, out, log=quiet)
                except Exception:  # noqa: BLE001 - best effort cleanup
                    pass
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _mlflow_run(summary_path: Path):
    from mlflow.tracking import MlflowClient
    summary = json.loads(summary_path.read_text())
    client = MlflowClient(tracking_uri=summary["mlflow_uri"])
    return client, client.get_run(summary["mlflow_run_id"])


def _history(summary_path: Path, key: str) -> list[tuple[int, float]]:
    client, run = _mlflow_run(summary_path)
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


# =========================================================================== tests
def test_cancel_scancels_the_sweeps_jobs(launched):
    L = launched
    [job] = L.cancel_rec["jobs"]
    assert launcher.cancel(L.cancel_spec, L.smoke_out, log=lambda *_: None) == [job["job_id"]]
    [row] = L.wait_states(L.cancel_spec, L.smoke_out)
    assert row["state"] == "failed" and row["detail"] == "CANCELLED", row


def test_preempted_job_requeues_then_fails_clearly_then_resumes_on_resubmission(launched):
    """Preempt twice (max_requeues 1): the first time submitit requeues the job and the loop
    resumes from its checkpoint; the second time the job fails with a clear reason; a
    resubmission resumes from the newest checkpoint. The finished run's metrics equal those
    of the uninterrupted twin (same run id, run locally), every step logged once."""
    import submitit
    L = launched
    [entry] = L.preempt_rec["jobs"]
    run_dir = Path(entry["run_dir"])
    ckpt = lambda step: (run_dir / "checkpoints" / f"step_{step:06d}" / "state.json").is_file()  # noqa: E731
    seen = set()

    def state(*final):
        [row] = L.status(L.preempt_spec, L.preempt_out)
        seen.add(row["state"])
        return row if row["state"] in final else None

    L.wait("checkpoint 2", lambda: ckpt(2), every=0.2)
    assert not (run_dir / "summary.json").exists(), "the run ended before it could be preempted"
    submitit.SlurmJob(folder=L.preempt_rec["folder"], job_id=entry["job_id"])._interrupt()
    L.wait("the requeued job to pass checkpoint 4", lambda: ckpt(4) or state("done", "failed"), every=0.2)
    assert ckpt(4) and not (run_dir / "summary.json").exists() and "requeued" in seen, seen
    submitit.SlurmJob(folder=L.preempt_rec["folder"], job_id=entry["job_id"])._interrupt()
    row = L.wait("the job to give up", lambda: state("done", "failed"), every=0.3)
    assert row["state"] == "failed" and "max_requeues = 1 reached" in row["detail"], row
    log = Path(row["log"]).read_text()
    assert "requeue 1/1" in log and "resuming from" in log and "giving up" in log

    # the newest checkpoint (every step): 4, or 5 when the job passed step 5 before the second signal
    # landed (under load it can)
    newest = max(p.parent.name for p in (run_dir / "checkpoints").glob("step_*/state.json"))
    assert newest >= "step_000004", newest
    rec = launcher.submit(L.preempt_spec, load_profile("local"), L.preempt_out, executor="slurm", log=lambda *_: None)
    assert [j["run_id"] for j in rec["jobs"]] == [entry["run_id"]] and rec["jobs"][0]["job_id"] != entry["job_id"]
    row = L.wait("the resubmitted run to finish", lambda: state("done", "failed"), every=0.5)
    assert row["state"] == "done" and row["requeues"] == 0, row
    log = Path(row["log"]).read_text()
    assert f"resuming from {run_dir / 'checkpoints' / newest} " in log, (newest, log[-2000:])

    assert L.reference.wait(WAIT_S) == 0, (L.root / "reference.log").read_text()
    ref_dir = L.reference_out / "runs" / row["run_id"]                 # the same run id, another output root
    a, b = (json.loads((d / "summary.json").read_text()) for d in (run_dir, ref_dir))
    assert (a["rollout_steps"], a["grad_steps"]) == (b["rollout_steps"], b["grad_steps"]) == (6, 12)
    assert a["final_eval"] == b["final_eval"] and a["mlflow_run_id"] != b["mlflow_run_id"]
    for key in ("train/loss", "train/entropy", "train/grad_norm", "rollout/response_len_mean"):
        ha, hb = _history(run_dir / "summary.json", key), _history(ref_dir / "summary.json", key)
        assert len(ha) == 6 and ha == hb, key                           # every step once, same numbers


def test_smoke_sweep_runs_as_one_array_with_tags_and_status(launched, capsys):
    L = launched
    ids = [j["job_id"] for j in L.smoke_rec["jobs"]]
    array = L.smoke_rec["array_job_id"]
    assert ids == [f"{array}_{i}" for i in range(4)]                         # one Slurm job array
    rows = L.wait_states(L.smoke_spec, L.smoke_out)
    assert [r["state"] for r in rows] == ["done"] * 4, rows
    jobs = expand(L.smoke_spec, L.smoke_out)
    for j in jobs:
        _, run = _mlflow_run(j.run_dir / "summary.json")
        t = run.data.tags
        assert (t["dapo.sweep"], t["dapo.arm"], t["dapo.seed"], t["dapo.run_id"]) == \
            ("smoke-slurm", j.arm, str(j.seed), j.run_id)
        assert run.info.run_name == f"smoke-slurm/{j.arm}/s{j.seed}"              # the UI lists runs by arm and seed
        assert run.info.experiment_id and run.data.params["algo.clip.eps_high"] == str(j.config.algo.clip.eps_high)
    L.wait("sacct to say COMPLETED", lambda: set(sweep_state._sacct(ids).values()) == {"COMPLETED"})
    assert sweep_main(["status", str(SMOKE), "--output", str(L.smoke_out)]) == 0
    out = capsys.readouterr().out
    assert "sweep smoke-slurm: 4 done" in out and out.count(" done ") == 4
    records = launcher.load_records(L.smoke_out, "smoke-slurm")
    assert records["submissions"][0]["set"] == {"logging.tracking_uri": L.uri}


def test_resubmission_skips_finished_runs(launched):
    L = launched
    L.wait_states(L.smoke_spec, L.smoke_out)
    rec = launcher.submit(L.smoke_spec, load_profile("local"), L.smoke_out, executor="slurm", log=lambda *_: None)
    assert rec["jobs"] == [] and [s["reason"] for s in rec["skipped"]] == ["finished"] * 4
    assert len(launcher.load_records(L.smoke_out, "smoke-slurm")["submissions"]) == 1   # nothing new sent


def test_failing_job_shows_failed_with_its_log_tail(launched, capsys):
    L = launched
    [row] = L.wait_states(L.fail_spec, L.smoke_out)
    assert row["state"] == "failed" and row["detail"] == "FAILED", row
    assert "missing.jsonl" in row["log_tail"] and len(row["log_tail"].splitlines()) <= 20
    assert sweep_main(["status", str(L.fail_spec.path), "--output", str(L.smoke_out)]) == 1
    out = capsys.readouterr().out
    assert "failed" in out and "missing.jsonl" in out and row["log"] in out
    # a resubmission would run the failed run again (a dry run shows it), not the finished ones
    rec = launcher.submit(L.fail_spec, load_profile("local"), L.smoke_out, executor="slurm", dry_run=True,
                          log=lambda *_: None)
    assert [j["run_id"] for j in rec["jobs"]] == [row["run_id"]]


def test_bad_specs_fail_before_submission(launched, tmp_path: Path, capsys):
    L = launched
    before = L.cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    bad = _spec_file(tmp_path, "bad", {"algo.clip.eps_hgih": 0.3})
    big = _spec_file(tmp_path, "big", {}, resources={"cpus_per_task": 64, "mem_gb": 2, "time_min": 10})
    for spec, words in ((bad, "unknown key 'algo.clip.eps_hgih'"), (big, "resources.cpus_per_task = 64")):
        out = tmp_path / spec.stem
        assert sweep_main(["submit", str(spec), "--cluster", "local", "--executor", "slurm",
                           "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert str(spec) in err and words in err
        assert not out.exists()
    after = L.cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    assert set(after) <= set(before)                                    # nothing new was queued


def test_local_executor_runs_the_same_sweep(launched):
    L = launched
    assert L.local.wait(WAIT_S) == 0, (L.root / "local.log").read_text()
    rows = launcher.status(load_spec(SMOKE), L.local_out)
    assert [r["state"] for r in rows] == ["done"] * 4, rows
    assert all(r["job_id"].isdigit() for r in rows)                    # local job ids are process ids
    slurm_ids = [j["run_id"] for j in L.smoke_rec["jobs"]]
    assert [r["run_id"] for r in rows] == slurm_ids                     # logging.* is not in the run id
    print(f"sweep slurm tests: all jobs ended {time.monotonic() - L.started:.0f}s after the first submission")
