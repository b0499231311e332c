"""What one training run holds between its steps (:class:`Run`), and how it starts and ends: processes and
seeds, the policy, the data, the resume point, the MLflow run and the rollout engine (:func:`start_run`);
a fresh engine after a failure (:func:`new_engine`); the summary, the final model and the MLflow run's end
(:func:`finish_run`). The loop itself is :mod:`dapo.train.loop`.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from dapo.base_model import resolve_policy_path
from dapo.config import Config, config_hash, flatten, to_dict
from dapo.data.run_data import load_run_data
from dapo.dist.distributed import destroy_distributed, final_state_dict, init_distributed, set_cpu_threads
from dapo.engines.weight_sync import push_weights
from dapo.train.checkpoint import latest_checkpoint, load_latest, save_final_model
from dapo.train.rollout import make_rollout_engine
from dapo.train.update import Policy, build_policy

__all__ = ["Run", "start_run", "new_engine", "finish_run", "RESUME_KEYS"]


@dataclass
class Run:
    """What one training run holds between rollout steps (built by :func:`start_run`)."""
    cfg: Config
    run_dir: Path
    dist: Any                             # dapo.dist.distributed.DistInfo: rank, world, device
    policy: Policy
    tokenizer: Any
    model_path: Any
    sampler: Any
    prompt_tokens: dict[tuple, list[int]]
    eval_sets: dict[str, list]
    state: dict[str, Any]
    tracker: Any
    uri: str
    log: Callable[..., None]
    engine: Any = None                    # this rank's engine, driven as the job's (RankShardedEngine)
    lagged: Any = None                    # dapo.train.staleness.LaggedWeights with train.staleness > 0
    pending_checkpoint: Any = None        # (PendingCheckpoint, its rollout step) with checkpoint.async_save
    t_start: float = field(default_factory=time.time)
    t_loop: float = 0.0                   # when this attempt's loop started
    wall_prev: float = 0.0                # loop seconds of the attempts before it (from the checkpoint)

    @property
    def is_main(self) -> bool:
        return self.policy.rank == 0

    def wall_s(self) -> float:
        """Seconds spent in the loop over every attempt of this run (resumes included)."""
        return self.wall_prev + time.time() - self.t_loop



def start_run(cfg: Config, run_dir: Path, tags: dict[str, str] | None, new_mlflow_run: bool = False) -> Run:
    """Processes and seeds, the policy, the data, the resume point, MLflow and the rollout engine."""
    from dapo.models import load_tokenizer
    t_start = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    set_cpu_threads(cfg.train.threads)                      # train.threads, OMP_NUM_THREADS, or CPUs / local ranks
    dist_info = init_distributed(cfg.launch.pg_timeout_s,   # several processes: gloo/NCCL group, with a timeout,
                                 cfg.launch.rollout_timeout_s)   # and the rollout gathers' gloo group
    is_main = dist_info.is_main
    random.seed(cfg.train.seed); np.random.seed(cfg.train.seed); torch.manual_seed(cfg.train.seed)
    log = (lambda *a: print("[dapo]", *a, flush=True)) if is_main else (lambda *a: None)
    if is_main:   # atomically: `dapo train` of the same run dir reads it (dapo.run_dir.check_run_dir)
        tmp = run_dir / f".config.yaml.{os.getpid()}.tmp"
        tmp.write_text(_yaml(to_dict(cfg)))
        os.replace(tmp, run_dir / "config.yaml")
    model_path = resolve_policy_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    policy = build_policy(cfg, model_path, dist_info, pad_id)
    sampler, prompt_tokens, eval_sets, data_tags = load_run_data(cfg, tokenizer, log)
    state = _resume(run_dir, policy, sampler, log)
    tracker, uri = _start_tracking(cfg, run_dir, state, is_main, {**data_tags, **(tags or {})}, new_mlflow_run)
    run = Run(cfg, run_dir, dist_info, policy, tokenizer, model_path, sampler, prompt_tokens, eval_sets,
              state, tracker, uri, log, t_start=t_start)
    # every rank builds its engine at the same time (vLLM's groups span all ranks)
    if cfg.train.staleness:
        run.lagged = _lagged_weights(cfg, run_dir, state, policy)
    run.engine = make_rollout_engine(cfg, model_path, policy.device, policy.module, rank=policy.rank,
                                     world=policy.world)
    if state["rollout_step"] > 0 or cfg.rollout.engine == "vllm":
        push_weights(policy, run.engine)
    if cfg.rollout.top_p < 1:
        log(f"rollout.top_p = {cfg.rollout.top_p} < 1: the engine's log-probs are renormalised over the nucleus and "
            f"the trainer's pi_old is not, so mismatch/* include that gap (docs/METRICS.md)")
    return run


def new_engine(run: Run):
    """A fresh rollout engine holding the current weights (after an engine failure; one process only:
    with several, vLLM's groups span all ranks and one rank cannot rebuild its engine alone)."""
    if run.policy.world > 1:
        raise RuntimeError(f"the rollout engine of rank {run.policy.rank} failed; with {run.policy.world} "
                           f"processes it cannot be rebuilt on one rank alone")
    engine = make_rollout_engine(run.cfg, run.model_path, run.policy.device, run.policy.module)
    push_weights(run.policy, engine)
    return engine


RESUME_KEYS = ("rollout_step", "grad_step", "sampler")   # what a checkpoint's state.json must hold to resume


def _resume(run_dir: Path, policy: Policy, sampler, log) -> dict[str, Any]:
    """The loop state of the last checkpoint (weights, optimizer, scheduler and sampler restored), or a fresh one."""
    state = {"rollout_step": 0, "grad_step": 0, "mlflow_run_id": None, "pending": [], "wall_s": 0.0,
             "gen_tokens": 0, "trained_tokens": 0}
    # the newest intact checkpoint: a damaged newer one is moved aside with one line (dapo.train.checkpoint.load_latest)
    ckpt, loaded = load_latest(run_dir, model=policy.module, optimizer=policy.optimizer, scheduler=policy.scheduler,
                               required=RESUME_KEYS, log=log)
    if ckpt is not None:
        state = loaded
        sampler.load_state_dict(state["sampler"])
        log(f"resuming from {ckpt} (rollout step {state['rollout_step']}, grad step {state['grad_step']})")
    return state


def _start_tracking(cfg: Config, run_dir: Path, state: dict, is_main: bool, tags: dict,
                    new_mlflow_run: bool = False) -> tuple[Any, str]:
    """The run's MLflow run (created, or the one this run dir already has; a new one with ``new_mlflow_run``),
    its params and tags; sends the points the last attempt checkpointed but did not send."""
    from dapo.tracking.tracker import Tracker, default_tracking_uri, environment_tags, git_commit, run_name
    uri = cfg.logging.tracking_uri or default_tracking_uri(cfg.output_dir)
    id_file = run_dir / "mlflow_run.json"   # written at once, so a crash before the first
    if not state.get("mlflow_run_id") and id_file.exists():   # checkpoint still resumes this run
        state["mlflow_run_id"] = json.loads(id_file.read_text()).get("run_id")
    if new_mlflow_run and state.get("mlflow_run_id"):
        if is_main:
            print(f"[dapo] --new-mlflow-run: MLflow run {state['mlflow_run_id']} (steps up to "
                  f"{state['rollout_step']}) is left behind; the remaining steps go to a new MLflow run in {uri}",
                  flush=True)
        tags = {**tags, "dapo.history_from_step": state["rollout_step"], "dapo.history_lost": state["mlflow_run_id"]}
        state["mlflow_run_id"] = None
    name = run_name(cfg.logging.sweep, cfg.logging.arm, cfg.train.seed, run_dir.name)
    tracker = Tracker(uri, cfg.logging.experiment, name, run_uuid=state.get("mlflow_run_id"), enabled=is_main)
    if is_main:
        id_file.write_text(json.dumps({"run_id": tracker.run_uuid, "tracking_uri": uri}))
        tracker.buffer = list(state.get("pending", []))
        tracker.flush()  # points checkpointed but not yet logged when the last run died
        tracker.set_tags({"dapo.sweep": cfg.logging.sweep, "dapo.arm": cfg.logging.arm,
                          "dapo.seed": cfg.train.seed, "dapo.run_id": run_dir.name,
                          "dapo.config_hash": config_hash(cfg), "dapo.git_commit": git_commit(),
                          "dapo.status": "running", "dapo.run_dir": str(run_dir.resolve()),
                          **({"dapo.declaration": cfg.logging.declaration} if cfg.logging.declaration else {}),
                          **environment_tags(), **tags})
        tracker.log_params(flatten(to_dict(cfg)))
        tracker.log_artifact(run_dir / "config.yaml")
    return tracker, uri


def finish_run(run: Run) -> dict[str, Any]:
    """Final summary (summary.json), optional final model, MLflow run ended FINISHED, engine closed."""
    state, tracker = run.state, run.tracker
    summary = {"run_dir": str(run.run_dir.resolve()), "rollout_steps": state["rollout_step"],
               "grad_steps": state["grad_step"], "mlflow_uri": run.uri, "mlflow_run_id": tracker.run_uuid,
               "wall_s": run.wall_s(), "total_s": time.time() - run.t_start,
               "gen_tokens": state.get("gen_tokens"), "trained_tokens": state.get("trained_tokens"),
               "checkpoint": str(latest_checkpoint(run.run_dir))}
    final_sd = final_state_dict(run.policy.module) if run.cfg.checkpoint.save_final_model else None  # all ranks
    if run.is_main:
        final = tracker.last_eval()
        summary["final_eval"] = final
        if final_sd is not None:
            save_final_model(run.policy.module, final_sd, run.run_dir / "final_model",
                             run.cfg.checkpoint.final_model_dtype)
            run.tokenizer.save_pretrained(run.run_dir / "final_model")
        tracker.set_tags({"dapo.status": "finished"})
        tracker.finish()
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        run.log(f"done: {state['rollout_step']} rollout steps, {state['grad_step']} grad steps in "
                f"{summary['wall_s']:.0f}s | run dir {run.run_dir} | checkpoints {run.run_dir / 'checkpoints'} | "
                f"MLflow {run.uri} run {tracker.run_uuid}" + (" | final " + fmt_eval(final) if final else ""))
    if run.engine is not None:
        run.engine.close()
    destroy_distributed(run.policy.world)
    return summary


def _lagged_weights(cfg: Config, run_dir: Path, state: dict, policy: Policy):
    """train.staleness = k: the kept weights, from the checkpoint resumed (else the initial ones, version 0)."""
    from dapo.train.checkpoint import load_extra
    from dapo.train.staleness import LaggedWeights
    lagged = LaggedWeights(cfg.train.staleness)
    ckpt = latest_checkpoint(run_dir) if state["rollout_step"] > 0 else None
    if ckpt is not None:
        lagged.load_state_dict(load_extra(ckpt)["lagged"])
    else:
        lagged.record(0, policy.module)
    return lagged


def fmt_eval(ev: dict[str, float]) -> str:
    return " ".join(f"{k.split('/', 1)[1]}={v:.3f}" for k, v in ev.items() if "len" not in k)


def _yaml(d: dict) -> str:
    import yaml
    return yaml.safe_dump(d, sort_keys=False)
