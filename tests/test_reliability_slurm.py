"""Slurm preemption at a chosen moment (issue #8, fault 2), on the real local cluster.

tests/test_sweep_slurm.py preempts a job once, between steps. Here two jobs are preempted
twice each, *inside* a step: once in the middle of a rollout (after its first generation
round) and once in the middle of an update (after its first of two optimizer steps). A fault
variable (DAPO_FAULT_PAUSE, exported by the job script through the cluster profile's env)
makes the job write a marker and sleep at those points; the test then sends submitit's
preemption signals (SIGTERM, then USR2) with ``job._interrupt()``, as Slurm does before it
preempts a job.

- max_requeues 2, preempted in step 2's rollout then in step 3's update: requeued twice,
  resumes from its last checkpoint each time, finishes, and its MLflow run equals an
  uninterrupted run of the same config, every step exactly once.
- max_requeues 1, preempted in step 2's update then in step 3's rollout: the second
  preemption is one too many. submitit then raises UncompletedJobError from its signal
  handler inside the rollout; that must not be taken for an engine failure and retried: the
  job ends FAILED with a clear reason (failed.json, the job log, ``dapo sweep status``), its
  last checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path

import pytest
import yaml

try:  # tests/ is on sys.path (pytest's default rootdir-less import mode) ...
    from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)
except ImportError:  # ... or tests is a package
    from tests.slurm_cluster import slurm_cluster  # noqa: F401

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 420
STEPS = {"rollout.engine": "hf", "rollout.n": 2, "rollout.max_new_tokens": 4, "train.batch_prompts": 2,
         "train.mini_batch_prompts": 1, "train.micro_batch_seqs": 2, "train.threads": 1, "train.lr": 1e-3,
         "algo.entropy_coef": 0.01, "eval.at_start": False, "eval.k": 1,
         "eval.datasets": [{"name": "arith-eval", "limit": 2}], "data.train_limit": 16,
         "logging.progress": False, "train.rollout_steps": 4, "checkpoint.every": 1}


def _spec(folder: Path, name: str, max_requeues: int) -> Path:
    spec = {"name": name, "base": "experiments/tiny-random-smoke.yaml", "kind": "grid",
            "base_overrides": STEPS, "grid": {"algo.clip.eps_high": [0.28]}, "seeds": [0],
            "metric": "eval/arith-eval/avg_at_1", "final_k": 1,
            "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2, "time_min": 10},
            "max_concurrent": 1, "max_requeues": max_requeues}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Job:
    def __init__(self, root: Path, name: str, max_requeues: int, pauses: list[str], cluster, uri: str):
        from dapo.commands.sweep import expand, load_profile, load_spec
        from dapo.sweep import launcher
        self.out = root / name
        self.markers = root / f"{name}-markers"
        self.pauses = pauses
        self.spec = load_spec(_spec(root, name, max_requeues), {"logging.tracking_uri": uri})
        profile = dataclasses.replace(load_profile("local"), env={
            "DAPO_FAULT_PAUSE": ",".join(pauses), "DAPO_FAULT_MARKER_DIR": str(self.markers), "DAPO_FAULT_PAUSE_S": "300",
            "HF_HUB_OFFLINE": "1"})
        [self.job] = expand(self.spec, self.out)   # fixed now: the experiment files may change meanwhile
        self.rec = launcher.submit(self.spec, profile, self.out, executor="slurm", log=lambda *_: None)
        [self.entry] = self.rec["jobs"]
        assert self.entry["run_id"] == self.job.run_id
        self.run_dir = Path(self.entry["run_dir"])
        self.cluster = cluster

    def wait(self, what, cond, timeout=WAIT_S, every=0.3):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = cond()
            if value:
                return value
            time.sleep(every)
        log = self.log_path().read_text() if self.log_path() else ""
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\njob log:\n{log[-3000:]}\n"
                             f"{self.cluster.logs()}")

    def log_path(self) -> Path | None:
        log = self.row().get("log")
        return Path(log) if log and Path(log).is_file() else None

    def preempt_at(self, marker: str):
        import submitit
        self.wait(f"the job to pause at {marker}", lambda: (self.markers / marker).is_file(), every=0.2)
        submitit.SlurmJob(folder=self.rec["folder"], job_id=self.entry["job_id"])._interrupt()

    def row(self):
        from dapo.sweep import launcher
        [row] = launcher.status(self.spec, self.out, jobs=[self.job])
        return row


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):  # noqa: F811 - the fixture imported above
    root = tmp_path_factory.mktemp("reliability-slurm")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    saved = {k: os.environ.get(k) for k in slurm_cluster.env}
    os.environ.update(slurm_cluster.env)
    made = []
    try:
        made.append(Job(root, "requeue-twice", 2, ["rollout@2", "update@3"], slurm_cluster, uri))
        made.append(Job(root, "requeue-limit", 1, ["update@2", "rollout@3"], slurm_cluster, uri))
        for i in range(2):                # both jobs run at once; preempt each at its first point,
            for j in made:                # then (requeued, resumed) at its second
                j.preempt_at(j.pauses[i])
        yield {"uri": uri, "root": root, "twice": made[0], "limit": made[1]}
    finally:
        from dapo.sweep import launcher
        for j in made:
            try:
                launcher.cancel(j.spec, j.out, log=lambda *_: None)
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _history(uri: str, run_id: str) -> dict:
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=uri)
    canon = lambda v: "nan" if math.isnan(v) else v  # noqa: E731
    return {k: sorted((m.step, canon(m.value)) for m in c.get_metric_history(run_id, k))
            for k in c.get_run(run_id).data.metrics if not k.startswith(("time/", "perf/"))}


def test_preempted_in_a_rollout_and_in_an_update_resumes_and_matches_an_uninterrupted_run(jobs, tmp_path):
    from dapo.train.loop import train
    J = jobs["twice"]
    row = J.wait("the job to finish", lambda: (lambda r: r if r["state"] in ("done", "failed") else None)(J.row()))
    log = J.log_path().read_text()
    assert row["state"] == "done" and row["requeues"] == 2, (row, log[-3000:])
    assert "pausing 300s in the rollout of rollout step 2" in log and "pausing 300s in the update of rollout step 3" in log
    assert "requeue 1/2" in log and "requeue 2/2" in log
    assert "step_000001 (rollout step 1" in log and "step_000002 (rollout step 2" in log   # resumed twice
    summary = json.loads((J.run_dir / "summary.json").read_text())
    assert (summary["rollout_steps"], summary["grad_steps"]) == (4, 8)
    # the same resolved config, run here without interruption, into its own MLflow run
    ref = train(dataclasses.replace(J.job.config, output_dir=str(tmp_path)), tmp_path / "run")
    got, want = _history(jobs["uri"], summary["mlflow_run_id"]), _history(jobs["uri"], ref["mlflow_run_id"])
    assert [v for _, v in got["progress/rollout_step"]] == [1, 2, 3, 4]
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key
    assert summary["final_eval"] == ref["final_eval"]


def test_one_preemption_too_many_fails_clearly_and_keeps_the_checkpoint(jobs):
    from dapo.models import load_model
    from dapo.train.checkpoint import latest_checkpoint, load_checkpoint
    from dapo.base_model import resolve_policy_path
    J = jobs["limit"]
    row = J.wait("the job to fail", lambda: (lambda r: r if r["state"] in ("done", "failed") else None)(J.row()))
    log = J.log_path().read_text()
    assert row["state"] == "failed", (row, log[-3000:])
    reason = json.loads((J.run_dir / "failed.json").read_text())["reason"]
    assert "preempted or timed out 2 times; max_requeues = 1 reached" in reason
    assert "pausing 300s in the update of rollout step 2" in log and "pausing 300s in the rollout of rollout step 3" in log
    assert "[dapo] giving up: preempted or timed out 2 times; max_requeues = 1 reached" in log
    assert "engine failure" not in log and "step 3/4" not in log
    assert not (J.run_dir / "summary.json").exists()
    ckpt = latest_checkpoint(J.run_dir)
    assert ckpt.name == "step_000002"
    state = load_checkpoint(ckpt, model=load_model(resolve_policy_path(J.job.config.model.path)))
    assert (state["rollout_step"], state["grad_step"]) == (2, 4)
    from mlflow.tracking import MlflowClient
    hist = MlflowClient(tracking_uri=jobs["uri"]).get_metric_history(state["mlflow_run_id"], "progress/rollout_step")
    assert sorted(int(m.value) for m in hist) == [1, 2]
