"""train.staleness (dapo/train/staleness.py): which weights sample which step, the kept versions, the
checkpoint round trip, the config rules, and a real run: the lag logged, the rollouts changed from
step 2 on, and a kill + resume that reproduces the straight run exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dapo.train.staleness import LaggedWeights, lagged_version

REPO = Path(__file__).resolve().parents[1]


def test_lagged_versions_and_what_is_kept():
    assert [lagged_version(r, 2) for r in range(1, 7)] == [0, 0, 0, 1, 2, 3]
    assert [lagged_version(r, 1) for r in range(1, 5)] == [0, 0, 1, 2]
    model = torch.nn.Linear(2, 1)
    lw = LaggedWeights(2)
    for v in range(5):
        with torch.no_grad():
            model.weight.fill_(float(v))
        lw.record(v, model)
    assert list(lw.weights) == [2, 3, 4]                                  # k + 1 kept
    v, w = lw.for_step(6)                                                 # r - 1 - k = 3
    assert v == 3 and torch.all(w["weight"] == 3.0)
    with pytest.raises(KeyError, match="not kept"):
        lw.for_step(3)
    other = LaggedWeights(2)
    other.load_state_dict(lw.state_dict())
    assert list(other.weights) == [2, 3, 4] and torch.equal(other.weights[4]["weight"], lw.weights[4]["weight"])


def test_staleness_config_rules_and_hash():
    from dapo.config import ConfigError, config_hash, load_config
    base = load_config("experiments/mini-dapo.yaml")
    assert config_hash(load_config("experiments/mini-dapo.yaml", ["train.staleness=0"])) == config_hash(base)
    assert config_hash(load_config("experiments/mini-dapo.yaml", ["train.staleness=1"])) != config_hash(base)
    with pytest.raises(ConfigError, match="train.staleness"):
        load_config("experiments/mini-dapo.yaml", ["train.staleness=-1"])
    load_config("experiments/tiny-random-smoke.yaml", ["train.staleness=1", "launch.num_processes=2"])   # allowed


TINY = ["rollout.engine=hf", "rollout.n=2", "rollout.max_new_tokens=6", "train.batch_prompts=2",
        "train.mini_batch_prompts=1", "train.micro_batch_seqs=2", "train.threads=1", "eval.every=0",
        "eval.at_start=false", "data.train_limit=16", "logging.progress=false", "train.rollout_steps=3",
        "checkpoint.every=1", "train.lr=1e-2", "model.autocast_bf16=false"]


def _train(out: Path, *extra: str, env: dict | None = None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("DAPO_FAULT_")}
    e.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    p = subprocess.run([sys.executable, "-m", "dapo.cli", "train", "experiments/tiny-random-smoke.yaml", *TINY, *extra,
                        f"output_dir={out}", f"logging.tracking_uri=sqlite:///{out / 'mlruns.db'}",
                        "--run-dir", str(out / "run")], cwd=REPO, env=e, capture_output=True, text=True, timeout=600)
    return p


def _history(out: Path) -> dict[str, list[float]]:
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
    run_id = json.loads((out / "run" / "summary.json").read_text())["mlflow_run_id"]
    keys = client.get_run(run_id).data.metrics
    return {k: [None if m.value != m.value else m.value      # NaN (e.g. no finished response) as None: comparable
                for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
            for k in keys if not k.startswith(("time/", "perf/"))}


@pytest.mark.slow
def test_a_stale_run_logs_its_lag_changes_the_rollouts_and_resumes_bit_for_bit(tmp_path):
    """(~2 min: four 3-step runs of the random tiny model on the transformers engine)"""
    for name, extra, env in (("sync", (), None), ("stale", ("train.staleness=1",), None),
                             ("killed", ("train.staleness=1",), {"DAPO_FAULT_KILL_AT_STEP": "3"})):
        p = _train(tmp_path / name, *extra, env=env)
        assert p.returncode == (-9 if name == "killed" else 0), p.stdout[-2000:] + p.stderr[-3000:]
    p = _train(tmp_path / "killed", "train.staleness=1")                  # resumes from checkpoint 2
    assert p.returncode == 0 and "resuming from" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
    sync, stale, resumed = (_history(tmp_path / n) for n in ("sync", "stale", "killed"))
    assert stale["offpolicy/staleness"] == [0.0, 1.0, 1.0] and "offpolicy/staleness" not in sync
    assert stale["train/loss"][0] == sync["train/loss"][0]                 # step 1: both sample with θ_0
    # step 1: π_rollout = π_old = θ_0 in both; from step 2 the stale run samples with the previous update's
    # weights while π_old is the current ones (here they differ by AdamW's weight decay: a random model's
    # groups are all wrong, so the loss is 0): its mismatch is far above the synchronous run's fp32 noise
    d_sync, d_stale = sync["mismatch/abs_diff_max"], stale["mismatch/abs_diff_max"]
    assert d_stale[0] == d_sync[0] < 1e-4
    assert all(b > 10 * max(a, 1e-6) for a, b in zip(d_sync[1:], d_stale[1:])), (d_sync, d_stale)
    # the split at π_lag (the trainer's forward with the weights that sampled): with the transformers
    # engine in fp32 the kernels agree, so the kernel part is float noise and the lag part is the whole
    assert "mismatch/lag/kl" not in sync
    kern, lag = stale["mismatch/kernel/abs_diff_max"], stale["mismatch/lag/abs_diff_max"]
    assert max(kern) < 1e-4 and lag[0] == 0.0, (kern, lag)
    assert all(b > 10 * max(a, 1e-6) for a, b in zip(kern[1:], lag[1:])), (kern, lag)
    for k3, k3_lag, k3_kern in zip(stale["mismatch/k3"], stale["mismatch/lag/k3"], stale["mismatch/kernel/k3"]):
        assert k3_kern < 1e-8 and k3_lag == pytest.approx(k3, rel=1e-3, abs=1e-9)
    assert resumed == stale                                                # the lagged weights came back


def test_split_mismatch_parts_add_up_in_log_ratio():
    """log ρ = log π_old − log π_rollout splits at π_lag into lag + kernel: each part's kl is the mean
    of its own log-ratio, so kl(lag) + kl(kernel) = kl(whole) exactly (hand tensors)."""
    import torch

    from dapo.algo.corrections import mismatch_metrics
    from dapo.train.staleness import split_mismatch
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    lag = torch.tensor([[-1.2, -1.9, -0.7], [-0.3, -2.5, 0.0]])
    roll = torch.tensor([[-1.25, -1.85, -0.7], [-0.3, -2.45, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    parts = split_mismatch(mismatch_metrics, old, lag, roll, mask)
    whole = mismatch_metrics(old, roll, mask)
    assert parts["mismatch/lag/kl"] + parts["mismatch/kernel/kl"] == pytest.approx(whole["mismatch/kl"], abs=1e-7)
    assert parts["mismatch/kernel/abs_diff_max"] == pytest.approx(0.05, abs=1e-6)   # |−1.2 − (−1.25)|, |−2.5 + 2.45|
    assert parts["mismatch/lag/abs_diff_max"] == pytest.approx(0.5, abs=1e-6)       # |−3.0 − (−2.5)|
    assert not any("_len_" in k for k in parts)


def test_per_rank_lagged_weights_are_read_back_only_by_as_many_ranks(tmp_path):
    """A sharded checkpoint keeps each rank's extra (its shards of the lagged weights) with the number of
    ranks that wrote it; read by another number of ranks it is one error naming both, not a wrong ring."""
    import torch
    import torch.distributed as dist

    from dapo.train.checkpoint import SHARDS, CheckpointError, load_extra
    ckpt = tmp_path / "step_000001"
    (ckpt / SHARDS).mkdir(parents=True)
    ring = {"lagged": {"versions": torch.tensor([0]), "weights": [{"w": torch.ones(2)}]}}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.save({"rng": {}, "extra": ring, "world": 1}, ckpt / "rng_rank0.pt")
        assert torch.equal(load_extra(ckpt)["lagged"]["weights"][0]["w"], torch.ones(2))
        torch.save({"rng": {}, "extra": ring, "world": 2}, ckpt / "rng_rank0.pt")
        with pytest.raises(CheckpointError, match="written by 2 processes; resume it with 2, not 1"):
            load_extra(ckpt)
    finally:
        dist.destroy_process_group()
