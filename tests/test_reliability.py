"""Fault injection (issue #8): every fault is injected for real — real training processes
killed with SIGKILL, a real sqlite MLflow store shared by six processes, a real MLflow
server, real non-finite tensors, a real file-size limit — and the recovery is checked
against an uninterrupted run, number for number. docs/RELIABILITY.md has one row per fault.

All runs are the 3M random model with the transformers rollout engine, 2 prompts x 2
samples x 4 tokens per step: a few hundred milliseconds a step; most of the time goes into
starting the subprocesses that get killed. The faults are armed by DAPO_FAULT_* variables
(dapo/faults.py), read when the loop reaches each point.
"""

from __future__ import annotations

import ast
import errno
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from dapo import faults
from dapo.config import load_config
from dapo.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from dapo.train.loop import train
from dapo.train.rollout import DynamicSamplingExhausted
from dapo.train.update import NonFiniteError

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
EXP = "experiments/tiny-random-smoke.yaml"
# The smallest real run; entropy_coef > 0 gives non-zero gradients although a random model
# only has all-wrong groups (zero advantages), and lr 1e-3 makes every step move the weights,
# so a resume that restored the wrong optimizer state or RNG would show in the numbers.
FAST = {"rollout.engine": "hf", "rollout.n": 2, "rollout.max_new_tokens": 4, "train.batch_prompts": 2,
        "train.mini_batch_prompts": 1, "train.micro_batch_seqs": 2, "train.threads": 1, "train.lr": 1e-3,
        "algo.entropy_coef": 0.01, "eval.at_start": False, "eval.k": 1,
        "eval.datasets": "[{name: arith-eval, limit: 2}]", "data.train_limit": 16, "logging.progress": False}
# The reference run that several faults are compared with: 6 rollout steps (12 gradient steps),
# a checkpoint every 2 steps (so a flush sends 2 points), evaluation at the end.
REF = {**FAST, "train.rollout_steps": 6, "checkpoint.every": 2, "checkpoint.keep_last": 3}
FAULT_VARS = [k for k in os.environ if k.startswith("DAPO_FAULT_")]


def _args(overrides: dict) -> list[str]:
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]


def _cfg(uri: str, out: Path, **overrides):
    return load_config(REPO / EXP, _args({**overrides, "output_dir": str(out), "logging.tracking_uri": uri}))


def _spawn(uri: str, out: Path, run_dir: Path, overrides: dict, env: dict[str, str], timeout: float = 300):
    """``dapo train`` in a subprocess (the way a job runs it), with fault variables in its env."""
    args = [PY, "-m", "dapo.cli", "train", str(REPO / EXP),
            *_args({**overrides, "output_dir": str(out), "logging.tracking_uri": uri}), "--run-dir", str(run_dir)]
    e = {k: v for k, v in os.environ.items() if not k.startswith("DAPO_FAULT_")}
    e.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **env)
    return subprocess.run(args, cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)


def _history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a run: key -> [(step, value)] in step order (nan compares equal to nan)."""
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=uri)
    keys = c.get_run(run_id).data.metrics
    return {k: sorted(((m.step, _canon(m.value)) for m in c.get_metric_history(run_id, k)), key=lambda t: t[0])
            for k in keys}


def _canon(v: float):
    return "nan" if isinstance(v, float) and math.isnan(v) else v


def _comparable(hist: dict) -> dict:
    return {k: v for k, v in hist.items() if not k.startswith(("time/", "perf/"))}


def _run_id(run_dir: Path) -> str:
    return json.loads((run_dir / "mlflow_run.json").read_text())["run_id"] if (run_dir / "mlflow_run.json").exists() \
        else json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["mlflow_run_id"]


def _rollout_steps_logged(uri: str, run_dir: Path) -> list[int]:
    return [int(v) for _, v in _history(uri, _run_id(run_dir)).get("progress/rollout_step", [])]


@pytest.fixture(autouse=True)
def _no_stray_faults(monkeypatch):
    for k in FAULT_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setitem(faults._state, "engine_failures", 0)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One sqlite MLflow store for the module (each run is its own MLflow run in it)."""
    from dapo.tracking.tracker import Tracker
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlruns.db'}"
    Tracker(uri, "dapo-lab", "warm-up")   # create the store once (schema migration ~5 s)
    return uri


@pytest.fixture(scope="module")
def reference(store, tmp_path_factory):
    """The uninterrupted run every recovered run must equal: (summary, comparable history)."""
    out = tmp_path_factory.mktemp("reference")
    summary = train(_cfg(store, out, **REF), out / "run")
    hist = _history(store, summary["mlflow_run_id"])
    assert [v for _, v in hist["progress/rollout_step"]] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in hist["progress/rollout_step"]] == [2, 4, 6, 8, 10, 12]
    return summary, _comparable(hist)


def _assert_same_as_reference(reference, store, summary):
    ref_summary, ref_hist = reference
    hist = _comparable(_history(store, summary["mlflow_run_id"]))
    assert (summary["rollout_steps"], summary["grad_steps"]) == (ref_summary["rollout_steps"], ref_summary["grad_steps"])
    assert sorted(hist) == sorted(ref_hist)
    for key in ref_hist:        # every step exactly once (no duplicate, none missing), the same numbers
        assert hist[key] == ref_hist[key], key
    assert summary["final_eval"] == ref_summary["final_eval"]


# =========================================================================== 1 + 3: kill -9
def test_sigkill_at_four_points_resumes_to_the_uninterrupted_metrics_exactly_once(store, reference, tmp_path):
    """Four real SIGKILLs of `dapo train`, each at a different point, each followed by a
    resubmission of the same command; the last resubmission runs to the end. MLflow must end
    with every rollout step exactly once and every metric equal to the uninterrupted run.

    1. mid-write of checkpoint 4 (model.pt written, optimizer/state not) -> step 2 stays latest
    2. right after checkpoint 4 is published, before its points reach MLflow
    3. in the middle of the resumed run's flush of those points (after the first of two)
    4. after step 5's update, before its checkpoint (the classic mid-step kill)
    """
    out, run = tmp_path, tmp_path / "run"
    ckpts = run / "checkpoints"

    p = _spawn(store, out, run, REF, {"DAPO_FAULT_KILL_IN_CHECKPOINT": "4"})
    assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-3000:]
    assert "fault injection: SIGKILL at kill_in_checkpoint 4" in p.stdout
    assert latest_checkpoint(run) == ckpts / "step_000002"                 # the half-written one is ignored
    assert [d.name for d in ckpts.glob(".tmp_step_000004_*")]              # ... and really was half written
    assert not list(ckpts.glob(".tmp_step_000004_*"))[0].joinpath("state.json").exists()
    assert _rollout_steps_logged(store, run) == [1, 2]

    p = _spawn(store, out, run, REF, {"DAPO_FAULT_KILL_AFTER_CHECKPOINT": "4"})
    assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-3000:]
    assert "resuming from" in p.stdout and "step_000002" in p.stdout
    assert latest_checkpoint(run) == ckpts / "step_000004"
    assert not list(ckpts.glob(".tmp_step_*"))                             # the leftover was cleaned up
    assert [pt["rollout_step"] for pt in json.loads((ckpts / "step_000004" / "state.json").read_text())["pending"]] \
        == [3, 4]                                                           # checkpointed, not yet logged
    assert _rollout_steps_logged(store, run) == [1, 2]

    p = _spawn(store, out, run, REF, {"DAPO_FAULT_KILL_IN_FLUSH": "1"})
    assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-3000:]
    assert _rollout_steps_logged(store, run) == [1, 2, 3]                   # one of the two pending points

    p = _spawn(store, out, run, REF, {"DAPO_FAULT_KILL_AT_STEP": "5"})
    assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-3000:]
    assert "step 5/6" not in p.stdout and latest_checkpoint(run) == ckpts / "step_000004"
    assert _rollout_steps_logged(store, run) == [1, 2, 3, 4]                # 3 not sent twice, 4 sent once

    summary = train(_cfg(store, out, **REF), run)                           # the last resubmission
    _assert_same_as_reference(reference, store, summary)


def test_async_checkpoints_are_published_a_checkpoint_later_and_a_kill_falls_back_to_the_one_before(
        store, reference, tmp_path):
    """checkpoint.async_save: the files of checkpoint r are written in the background and published at
    checkpoint r + 2 (or the end), its metrics sent then. A SIGKILL in the background writer of
    checkpoint 4, then one after step 5's update (checkpoint 4 written, not yet published), each leave
    step 2 the latest and MLflow with steps 1-2 only; the last resubmission ends equal to the
    synchronous reference, every step once."""
    out, run = tmp_path, tmp_path / "run"
    ckpts = run / "checkpoints"
    ref = {**REF, "checkpoint.async_save": True}
    p = _spawn(store, out, run, ref, {"DAPO_FAULT_KILL_IN_CHECKPOINT": "4"})
    assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-3000:]
    assert latest_checkpoint(run) == ckpts / "step_000002" and _rollout_steps_logged(store, run) == [1, 2]
    p = _spawn(store, out, run, ref, {"DAPO_FAULT_KILL_AT_STEP": "5"})
    assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-3000:]
    assert "resuming from" in p.stdout and "step 4/6" in p.stdout
    assert latest_checkpoint(run) == ckpts / "step_000002"                  # 4 was never published
    assert list(ckpts.glob(".tmp_step_000004_*"))[0].joinpath("state.json").exists()   # though fully written
    assert _rollout_steps_logged(store, run) == [1, 2]
    summary = train(_cfg(store, out, **ref), run)
    _assert_same_as_reference(reference, store, summary)
    assert latest_checkpoint(run) == ckpts / "step_000006" and not list(ckpts.glob(".tmp_*"))


# =========================================================================== 3: full disk
def test_disk_full_during_a_checkpoint_keeps_the_previous_one_and_the_run_resumes(store, reference, tmp_path,
                                                                                   monkeypatch):
    """torch.save of checkpoint 4 fails with ENOSPC inside a real run: the error names the
    checkpoint path, no temporary directory is left, step 2 stays loadable, and the rerun
    resumes from it to the uninterrupted run's numbers."""
    real_save = torch.save

    def save(obj, f, *a, **k):
        if "step_000004" in str(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *a, **k)

    run = tmp_path / "run"
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(CheckpointError, match=r"step_000004: could not write checkpoint \(OSError: .*No space left"):
        train(_cfg(store, tmp_path, **REF), run)
    monkeypatch.setattr(torch, "save", real_save)
    ckpts = run / "checkpoints"
    assert latest_checkpoint(run) == ckpts / "step_000002" and not list(ckpts.glob(".tmp_*"))
    assert _rollout_steps_logged(store, run) == [1, 2]
    summary = train(_cfg(store, tmp_path, **REF), run)
    _assert_same_as_reference(reference, store, summary)


def _tiny_model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))   # ~260 kB of weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    return model, opt


def test_file_size_limit_makes_torch_save_fail_for_real_and_the_previous_checkpoint_survives(tmp_path):
    """A real write failure from the kernel (RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC).
    torch.save reports it as a RuntimeError, not an OSError; it must still become a
    CheckpointError naming the path, with the previous checkpoint intact and loadable."""
    model, opt = _tiny_model_and_optimizer()
    first = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=None, state={"rollout_step": 1})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # else the kernel's SIGXFSZ kills us
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(CheckpointError) as err:
            save_checkpoint(tmp_path, 2, model=model, optimizer=opt, scheduler=None, state={"rollout_step": 2})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert str(tmp_path / "checkpoints" / "step_000002") in str(err.value)
    assert latest_checkpoint(tmp_path) == first
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name != "step_000001"]
    fresh, _ = _tiny_model_and_optimizer()
    state = load_checkpoint(first, model=fresh, optimizer=torch.optim.AdamW(fresh.parameters()))
    assert state == {"rollout_step": 1}
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_unreadable_checkpoint_is_a_checkpoint_error_naming_the_path(tmp_path):
    model, opt = _tiny_model_and_optimizer()
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=None, state={})
    data = (path / "model.pt").read_bytes()
    (path / "model.pt").write_bytes(data[: len(data) // 2])                 # truncated by a dying disk
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        load_checkpoint(path, model=model)


# =========================================================================== 5: rollout engine dies
def test_engine_dying_mid_generation_is_retried_and_the_step_is_unchanged(store, reference, tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.setenv("DAPO_FAULT_ENGINE_FAIL_AT_STEP", "3")
    summary = train(_cfg(store, tmp_path, **REF), tmp_path / "run")
    log = capsys.readouterr().out
    assert "rollout step 3: engine failure (InjectedEngineFailure" in log and "re-creating the engine" in log
    _assert_same_as_reference(reference, store, summary)


def test_engine_dying_past_its_retries_fails_cleanly_and_the_run_resumes(store, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_FAULT_ENGINE_FAIL_AT_STEP", "3")
    monkeypatch.setenv("DAPO_FAULT_ENGINE_FAILURES", "2")                   # rollout.retries = 1
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match=r"rollout step 3: generation failed 2 times \(rollout.retries = 1\); "
                                           r"the run is resumable from its last checkpoint"):
        train(_cfg(store, tmp_path, **REF), run)
    assert latest_checkpoint(run).name == "step_000002"
    monkeypatch.delenv("DAPO_FAULT_ENGINE_FAIL_AT_STEP")
    summary = train(_cfg(store, tmp_path, **REF), run)
    _assert_same_as_reference(reference, store, summary)


# =========================================================================== 6: NaN / inf
NAN_RUN = {**FAST, "train.rollout_steps": 4, "checkpoint.every": 1, "checkpoint.keep_last": 10}


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt / "model.pt", weights_only=True)


def test_nonfinite_loss_and_gradient_are_skipped_and_logged(store, tmp_path, monkeypatch):
    """Step 2: NaN logits (so NaN loss and gradients); step 3: an inf gradient. With
    train.nonfinite=skip both optimizer steps are dropped (the weights do not move), the
    offending values and train/skipped_step are logged, training goes on, and every
    checkpoint holds finite weights."""
    monkeypatch.setenv("DAPO_FAULT_NONFINITE", "loss@2,grad@3")
    run = tmp_path / "run"
    summary = train(_cfg(store, tmp_path, **NAN_RUN, **{"train.nonfinite": "skip"}), run)
    h = {k: dict((int(s), v) for s, v in pts) for k, pts in _history(store, summary["mlflow_run_id"]).items()}
    at = {r: s for s, r in h["progress/rollout_step"].items()}               # rollout step -> MLflow step
    assert h["train/skipped_step"][at[1]] == 0 and h["train/skipped_step"][at[4]] == 0
    assert h["train/skipped_step"][at[2]] == 1 and h["train/skipped_step"][at[3]] == 1
    assert h["train/loss"][at[2]] == "nan" and h["train/grad_norm"][at[2]] == "nan"
    assert h["train/loss"][at[3]] != "nan" and h["train/grad_norm"][at[3]] == "nan"   # inf is stored as nan
    assert h["train/grad_norm"][at[4]] != "nan"                              # and the run recovered
    ck = run / "checkpoints"
    w = {s: _weights(ck / f"step_{s:06d}") for s in (1, 2, 3, 4)}
    assert all(torch.isfinite(t).all() for ws in w.values() for t in ws.values())
    assert all(torch.equal(w[1][k], w[3][k]) for k in w[1])                  # steps 2 and 3 changed nothing
    assert not all(torch.equal(w[3][k], w[4][k]) for k in w[3])              # step 4 did


def test_nonfinite_loss_with_stop_ends_the_run_and_marks_mlflow(store, tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_FAULT_NONFINITE", "loss@2")
    run = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=r"non-finite loss nan / grad norm nan; train.nonfinite=stop"):
        train(_cfg(store, tmp_path, **NAN_RUN, **{"train.nonfinite": "stop"}), run)
    assert latest_checkpoint(run).name == "step_000001"
    from mlflow.tracking import MlflowClient
    r = MlflowClient(tracking_uri=store).get_run(_run_id(run))
    assert r.info.status == "FAILED" and r.data.tags["dapo.status"] == "failed"
    assert r.data.tags["dapo.error"].startswith("rollout step 2: non-finite loss nan")


def test_nonfinite_weights_are_never_checkpointed(store, tmp_path, monkeypatch):
    """A NaN weight (a bad update) with nonfinite=skip: every later step is skipped, and the
    next checkpoint is refused with an error naming it; the last good checkpoint stays."""
    monkeypatch.setenv("DAPO_FAULT_NONFINITE", "weights@2")
    run = tmp_path / "run"
    with pytest.raises(CheckpointError, match=r"step_000002: refusing to checkpoint non-finite \(NaN/inf\) weights"):
        train(_cfg(store, tmp_path, **NAN_RUN, **{"train.nonfinite": "skip"}), run)
    assert latest_checkpoint(run).name == "step_000001"
    assert all(torch.isfinite(t).all() for t in _weights(latest_checkpoint(run)).values())
    assert not list((run / "checkpoints").glob("*step_000002*"))


# =========================================================================== 7: dynamic sampling
DS = {**FAST, "train.rollout_steps": 2, "checkpoint.every": 1, "algo.dynamic_sampling.enabled": True,
      "algo.dynamic_sampling.gen_batch_prompts": 2, "algo.dynamic_sampling.max_gen_rounds": 2}


def test_dynamic_sampling_that_cannot_fill_a_batch_errors_naming_the_knobs(store, tmp_path):
    """A random model answers everything wrong: no group is informative. With
    on_exhausted=error the run stops after max_gen_rounds rounds, not never."""
    t = time.monotonic()
    with pytest.raises(DynamicSamplingExhausted) as err:
        train(_cfg(store, tmp_path, **DS, **{"algo.dynamic_sampling.on_exhausted": "error"}), tmp_path / "run")
    msg = str(err.value)
    assert "rollout step 1: dynamic sampling kept 0/2 groups after 2 rounds" in msg
    assert "(4 groups: 0 all-correct, 4 all-wrong)" in msg
    for knob in ("algo.dynamic_sampling.max_gen_rounds", "algo.dynamic_sampling.gen_batch_prompts",
                 "algo.dynamic_sampling.on_exhausted=proceed"):
        assert knob in msg
    assert time.monotonic() - t < 120


def test_dynamic_sampling_with_proceed_and_nothing_kept_skips_the_update_and_logs_it(store, tmp_path, capsys):
    summary = train(_cfg(store, tmp_path, **DS, **{"algo.dynamic_sampling.on_exhausted": "proceed"}),
                    tmp_path / "run")
    assert "no update this step (sampling/skipped_update = 1)" in capsys.readouterr().out
    assert (summary["rollout_steps"], summary["grad_steps"]) == (2, 0)
    h = _history(store, summary["mlflow_run_id"])
    assert [v for _, v in h["progress/rollout_step"]] == [1, 2]
    assert [v for _, v in h["sampling/skipped_update"]] == [1, 1]
    assert [v for _, v in h["sampling/kept_groups"]] == [0, 0]
    assert [v for _, v in h["sampling/gen_rounds"]] == [2, 2]
    assert [v for _, v in h["sampling/all_wrong_frac"]] == [1, 1]
    assert [v for _, v in h["rollout/acc_mean"]] == ["nan", "nan"]            # undefined, not a fake 0


# =========================================================================== bad data rows
def _bad_jsonl(path: Path) -> Path:
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": 4}, {"prompt": "3+3="},
            {"prompt": "4+4=", "answer": None}, {"prompt": "5+5=", "answer": [10]}, {"prompt": "6+6=", "answer": 1.5},
            {"prompt": "7+" * 40 + "7=", "answer": "56"}, {"prompt": "8+8=", "answer": "16"},
            {"prompt": ["not", "a", "chat"], "answer": "1"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    return path


BAD_DATA_RUN = {**FAST, "train.rollout_steps": 1, "checkpoint.every": 1, "data.train_limit": "null",
                "data.max_prompt_tokens": 32}


def test_bad_rows_are_counted_reported_and_dropped(store, tmp_path, capsys):
    data = _bad_jsonl(tmp_path / "bad.jsonl")
    summary = train(_cfg(store, tmp_path, **BAD_DATA_RUN, **{"data.train": str(data)}), tmp_path / "run")
    log = capsys.readouterr().out
    assert ("4/10 rows kept; bad: invalid JSON (Expecting property name enclosed in double quotes): 1, "
            "missing answer: 2, non-string answer: 2, non-string prompt: 1") in log
    assert "dropped 1 prompts longer than data.max_prompt_tokens=32" in log
    assert summary["rollout_steps"] == 1
    from mlflow.tracking import MlflowClient
    tags = MlflowClient(tracking_uri=store).get_run(summary["mlflow_run_id"]).data.tags
    assert "4/10 rows kept" in tags["dapo.data.train"] and tags["dapo.data.too_long_prompts"] == "1"


def test_bad_rows_with_on_bad_fail_stop_naming_the_row(store, tmp_path):
    from dapo.data.datasets import DataError
    data = _bad_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match=re.escape(f"{data}: row 2: missing answer")):
        train(_cfg(store, tmp_path, **BAD_DATA_RUN, **{"data.train": str(data), "data.on_bad": "fail"}),
              tmp_path / "run")
    long_only = tmp_path / "long.jsonl"
    long_only.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n"
                         + json.dumps({"prompt": "7+" * 40 + "7=", "answer": "56"}) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{long_only}: row 1: prompt too long (tokens) (82 > 32): "
                                                  f"raise data.max_prompt_tokens=32")):
        train(_cfg(store, tmp_path, **BAD_DATA_RUN, **{"data.train": str(long_only), "data.on_bad": "fail"}),
              tmp_path / "run2")


# =========================================================================== 4: six jobs, one store
WRITER = textwrap.dedent("""
    import sys
    from dapo.tracking.tracker import Tracker
    uri, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = Tracker(uri, "six-jobs", name)
    t.set_tags({"dapo.run_id": name})
    t.log_params({f"p{i}": i for i in range(120)})
    for s in range(1, n + 1):          # one flush per point: the most transactions a run makes
        t.record({f"m/{k}": s * 1000 + k for k in range(40)}, rollout_step=s, grad_step=2 * s)
        t.flush()
    t.finish()
    print("RUN", t.run_uuid)
""")
POINTS = 8


def _six_writers(uri: str) -> list[str]:
    procs = [subprocess.Popen([PY, "-c", WRITER, uri, f"job{i}", str(POINTS)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(6)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]
    return [re.search(r"^RUN (\w+)$", o, re.M).group(1) for o in outs]


def _assert_every_metric_once(uri: str, run_ids: list[str]):
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=uri)
    assert len(set(run_ids)) == 6
    for rid in run_ids:
        run = c.get_run(rid)
        assert run.info.status == "FINISHED" and len(run.data.params) == 120
        assert len(run.data.metrics) == 40 + 2
        for k in range(40):
            hist = sorted((m.step, m.value) for m in c.get_metric_history(rid, f"m/{k}"))
            assert hist == [(2 * s, s * 1000 + k) for s in range(1, POINTS + 1)], (rid, k)


def test_six_processes_create_and_share_a_fresh_sqlite_store(tmp_path):
    """Six processes start at once on a store that does not exist yet. Without the store lock
    MLflow's schema migration races and every one of them crashes (alembic errors); with it
    all six log every point."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    _assert_every_metric_once(uri, _six_writers(uri))


def _listening_addresses(pids: list[int]) -> list[str]:
    """Local addresses (hex ip:port, as in /proc/net/tcp*) of the LISTEN sockets of ``pids``."""
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":
                listening[f[9]] = f[1]
    out = []
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in listening:
                out.append(listening[link[8:-1]])
    return out


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_six_processes_log_through_the_local_mlflow_server_which_listens_on_loopback_only(tmp_path):
    from dapo.tracking.mlflow_server import start_server
    with start_server(tmp_path / "server") as srv:
        addrs = _listening_addresses(srv.pids())
        assert addrs and all(a.split(":")[0] in ("0100007F", "0000000000000000FFFF00000100007F") for a in addrs), addrs
        assert any(int(a.split(":")[1], 16) == srv.port for a in addrs)
        run_ids = _six_writers(srv.uri)
        _assert_every_metric_once(srv.uri, run_ids)
    assert not srv.alive()


def test_transient_store_errors_are_retried_then_reported_with_the_store(monkeypatch):
    from dapo.tracking.tracker import TrackingError, call_with_retry
    monkeypatch.setattr(time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "ok"
    assert call_with_retry(flaky, what="log", uri="sqlite:///x.db") == "ok" and len(calls) == 3
    with pytest.raises(TrackingError, match=r"MLflow store sqlite:///x.db: log metrics failed 4 times"):
        call_with_retry(lambda: (_ for _ in ()).throw(RuntimeError("database is locked")), what="log metrics",
                        uri="sqlite:///x.db", attempts=4)
    with pytest.raises(KeyError):                                             # not transient: at once
        call_with_retry(lambda: {}["x"], what="x", uri="u")


# =========================================================================== security
# (call name, file) pairs that were reviewed; everything else that matches fails the test.
VETTED = {
    ("pickle_load", "dapo/sweep/state.py"): "submitit's result pickle of our own job, in our own sweep folder",
}
DANGEROUS_CALLS = {"eval", "exec", "compile", "__import__", "system", "popen", "loads", "load", "pickle_load",
                   "unsafe_load", "full_load", "load_all", "Unpickler"}


def _dangerous(path: Path) -> list[tuple[str, int, str]]:
    """Calls in ``path`` that execute code or deserialize arbitrary objects, and shell=True."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        kw = {k.arg: k.value for k in node.keywords}
        if any(k == "shell" and not (isinstance(v, ast.Constant) and v.value is False) for k, v in kw.items()):
            found.append(("shell=True", node.lineno, owner))
        if any(k == "trust_remote_code" and not (isinstance(v, ast.Constant) and v.value is False)
               for k, v in kw.items()):
            found.append(("trust_remote_code", node.lineno, owner))
        if name not in DANGEROUS_CALLS:
            continue
        if name in ("eval", "exec", "compile", "__import__") and isinstance(f, ast.Name):
            found.append((name, node.lineno, ""))
        elif name in ("system", "popen") and owner == "os":
            found.append((f"os.{name}", node.lineno, owner))
        elif name in ("load", "loads", "Unpickler") and owner in ("pickle", "cloudpickle", "marshal", "dill", "shelve"):
            found.append((f"{owner}.{name}", node.lineno, owner))
        elif name in ("load", "unsafe_load", "full_load", "load_all") and owner == "yaml":
            found.append((f"yaml.{name}", node.lineno, owner))
        elif name == "load" and owner == "torch":
            wo = kw.get("weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                found.append(("torch.load without weights_only=True", node.lineno, owner))
        elif name == "pickle_load":
            found.append(("pickle_load", node.lineno, owner))
    return sorted(found, key=lambda t: t[1])


def test_no_eval_exec_unsafe_deserialization_or_shell_in_the_package():
    bad = []
    for path in sorted([*REPO.joinpath("dapo").rglob("*.py"), *REPO.joinpath("analysis").rglob("*.py")]):
        rel = path.relative_to(REPO).as_posix()
        for what, line, _ in _dangerous(path):
            if (what, rel) not in VETTED:
                bad.append(f"{rel}:{line}: {what}")
    assert not bad, "unreviewed code execution / deserialization / shell use:\n" + "\n".join(bad)


def test_the_scanner_finds_what_it_is_meant_to_find(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("import pickle, os, subprocess, torch, yaml\neval(s)\nexec(s)\npickle.loads(b)\n"
                   "torch.load(p)\ntorch.load(p, weights_only=False)\ntorch.load(p, weights_only=True)\n"
                   "subprocess.run(c, shell=True)\nos.system(c)\nyaml.load(t)\nyaml.safe_load(t)\n"
                   "m.eval()\nf(trust_remote_code=True)\n")
    assert [w for w, _, _ in _dangerous(src)] == [
        "eval", "exec", "pickle.loads", "torch.load without weights_only=True",
        "torch.load without weights_only=True", "shell=True", "os.system", "yaml.load", "trust_remote_code"]


@pytest.mark.parametrize("exc, status", [(RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_a_crash_ends_the_mlflow_run_with_the_reason(tmp_path, monkeypatch, exc, status):
    """Any exception out of the loop ends the run's MLflow run (FAILED, or KILLED for an
    interrupt) with dapo.error, instead of leaving it RUNNING; a resume sets RUNNING again."""
    import json as _json

    from mlflow.tracking import MlflowClient

    import dapo.train.loop as T
    from dapo.config import load_config
    from dapo.tracking.tracker import Tracker
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tr = Tracker(uri, "crash", "run")
    (run_dir / "mlflow_run.json").write_text(_json.dumps({"run_id": tr.run_uuid, "tracking_uri": uri}))

    def crash(*a, **k):
        raise exc
    monkeypatch.setattr(T, "_train", crash)
    with pytest.raises(type(exc)):
        T.train(load_config(None), run_dir)
    run = MlflowClient(uri).get_run(tr.run_uuid)
    assert run.info.status == status
    assert run.data.tags["dapo.status"] == status.lower()
    assert run.data.tags["dapo.error"].startswith(type(exc).__name__)
    Tracker(uri, "crash", "run", run_uuid=tr.run_uuid)      # what a resume does
    assert MlflowClient(uri).get_run(tr.run_uuid).info.status == "RUNNING"
    assert T.mark_run_ended(tmp_path / "nowhere", ValueError("x")) is False
