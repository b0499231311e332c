"""The one training loop every job of every sweep runs: ``dapo train EXP.yaml [k=v ...]``.

Read :func:`_train` top to bottom: it is the paper's Algorithm 1 (steps: docs/METRICS.md), one named
call per step, each in its own module:

    sample prompts → generate G responses each → score → dynamic sampling (keep 0 < #correct < G,
    refill)                                                                    dapo/train/rollout.py
    → group advantages                                                         dapo/algo/advantages.py
    → the behaviour policy: π_old, π_rollout, loss mask, token weights         dapo/train/behaviour.py
    → μ mini-batch updates (token-level loss, AdamW, warm-up, grad clip)       dapo/train/update.py
    → weight sync into the engine                                              dapo/engines/weight_sync.py
    → eval (avg@k, pass@k, cons@k)                                             dapo/train/evaluate.py
    → log (MLflow, exactly once)                                               dapo/tracking/tracker.py
    → checkpoint                                                               dapo/train/checkpoint.py

What a run holds between steps, and how it starts and ends (processes, policy, data, resume, MLflow,
engine; the summary): dapo/train/run.py.

Notation as in dapo.algo: B prompts, G responses, N = B·G sequences, L response tokens.
The loop knows nothing about Slurm; the launcher knows nothing about losses.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import torch

from dapo import algo, eval_records, faults
from dapo.config import Config
from dapo.dist.distributed import barrier, broadcast_object
from dapo.dist.preemption import StepBoundarySignal
from dapo.engines.weight_sync import push_weights, release_engine
from dapo.run_dir import hold_run_dir, run_dir_for
from dapo.tracking.tracker import mark_run_ended
from dapo.train.behaviour import Behaviour, Inputs, behaviour_policy
from dapo.train.checkpoint import save_checkpoint
from dapo.train.evaluate import eval_seed, evaluate
from dapo.train.logprobs import old_logprobs
from dapo.train.rollout import rollout_with_retry, round_seed
from dapo.train.run import Run, finish_run, fmt_eval, new_engine, start_run
from dapo.train.update import NonFiniteError, mean_metrics, update_policy

__all__ = ["train", "run_dir_for", "Timer"]


class Timer:
    """Wall time of the named phases of one rollout step: ``with timer("rollout"): ...``."""

    def __init__(self):
        self.start, self.s = time.time(), {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t = time.time()
        try:
            yield
        finally:
            self.s[phase] = self.s.get(phase, 0.0) + time.time() - t

    def metrics(self) -> dict[str, float]:
        """{"time/<phase>_s": seconds} and the whole step as ``time/step_s``."""
        return {**{f"time/{k}_s": v for k, v in self.s.items()}, "time/step_s": time.time() - self.start}


# =========================================================================== the loop
def train(cfg: Config, run_dir: str | os.PathLike | None = None, *, tags: dict[str, str] | None = None,
          new_mlflow_run: bool = False) -> dict[str, Any]:
    """Run (or resume) one training run; returns a summary dict (also saved as summary.json).
    ``new_mlflow_run``: a resumed run logs its remaining steps to a new MLflow run (``dapo train
    --new-mlflow-run``: its store was lost), tagged ``dapo.history_from_step``.

    If the run raises, its MLflow run (if one was created) is ended FAILED (KILLED for an
    interrupt or exit) with the reason in the ``dapo.error`` tag, so no crashed run is left
    showing RUNNING; resuming the run dir sets it RUNNING again. Checkpoints are untouched.
    """
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(cfg)
    main_rank = int(os.environ.get("RANK", "0") or 0) == 0
    # RunDirBusy (another process trains here): nothing touched. USR2 (preemption) with
    # checkpoint.on_preempt=step_boundary: a checkpoint at the end of the rollout step, then the signal's
    # previous handling (submitit: requeue), see dapo.dist.preemption; immediate: submitit's handling at once
    boundary = StepBoundarySignal() if cfg.checkpoint.on_preempt == "step_boundary" else contextlib.nullcontext()
    with hold_run_dir(run_dir, enabled=main_rank), boundary as preemption:
        try:
            return _train(cfg, run_dir, tags=tags, preemption=preemption, new_mlflow_run=new_mlflow_run)
        except BaseException as exc:
            if main_rank:
                mark_run_ended(run_dir, exc)
            raise


def _train(cfg: Config, run_dir: Path, *, tags: dict[str, str] | None,
           preemption: StepBoundarySignal | None = None, new_mlflow_run: bool = False) -> dict[str, Any]:
    from tqdm.auto import tqdm
    run = start_run(cfg, run_dir, tags, new_mlflow_run)   # processes, policy, data, resume, tracking, engine
    policy, state = run.policy, run.state
    _evaluate_at_start(run)                       # grad step 0: the model before training
    total = cfg.train.rollout_steps
    bar = tqdm(total=total, initial=state["rollout_step"], desc="rollout steps", unit="step",
               disable=not (run.is_main and cfg.logging.progress), dynamic_ncols=True)
    run.wall_prev, run.t_loop = state.get("wall_s", 0.0), time.time()
    while state["rollout_step"] < total:
        r = state["rollout_step"] + 1
        timer = Timer()
        # 1-3. sample prompts, generate G each, score, shape, dynamic sampling: B kept groups, N = B·G
        with timer("rollout"):
            offpolicy = _push_lagged(run, r)      # train.staleness = k: the engine samples with θ of update r-1-k
            batch = _rollouts(run, r)
        # 4. group advantages from the shaped reward: [N]
        adv = algo.group_advantages(batch.rewards, eps=cfg.algo.adv_eps, std=cfg.algo.advantage.std,
                                    baseline=cfg.algo.advantage.baseline).reshape(-1)
        # 5. the behaviour policy (dapo.train.behaviour): π_old and π_rollout [N, L] (π_old None: the update's own
        #    forward), the loss mask and the token weights [N, L], and their metrics
        with timer("old_logprob"):
            beh = _behaviour(run, batch, adv, r)
        # 6. μ optimizer steps (mini-batches × ppo_epochs), micro-batch accumulation: [μ] StepStats
        with timer("train"):
            steps = _update(run, batch, beh, adv, r)
        behaviour_metrics = beh.after_update(policy.world)   # π_old the update's own forward: its mismatch
        state["grad_step"] += len(steps)
        if run.lagged is not None:
            run.lagged.record(r, policy.module)
        faults.kill_point("KILL_AT_STEP", r)      # test hook: die after the update, before the checkpoint
        # 7. weight sync into the rollout engine (with staleness only before an evaluation: the next
        #    rollouts get their lagged weights at the step's start)
        evaluating = bool(cfg.eval.every and r % cfg.eval.every == 0) or r == total
        with timer("sync"):
            if run.engine is not None and (run.lagged is None or evaluating):
                push_weights(policy, run.engine)
        # 8. evaluation every eval.every rollout steps and at the end
        with timer("eval"):
            ev = _evaluate(run, r) if evaluating else {}
        # 9. log (buffered; sent to MLflow right after the next checkpoint)
        metrics = {**batch.stats, **ev, **mean_metrics(steps), **behaviour_metrics, **offpolicy,
                   "train/grad_steps": len(steps), **timer.metrics()}
        _log_step(run, r, batch, beh.resp_mask, metrics, ev, bar)
        # 10. checkpoint, then flush the buffered metrics (exactly-once logging); also when a rank got USR2
        _checkpoint_step(run, r, preemption)
    bar.close()
    _publish_pending(run)                         # checkpoint.async_save: the last one, before the summary
    return finish_run(run)


# =========================================================================== the phases
def _rollouts(run: Run, r: int):
    """Steps 1-3 on every rank (with engine retries): all ranks draw the same prompts, each engine
    generates its share of every round, the completions are gathered, each rank scores its share
    and the scores are gathered, so every rank keeps the same groups in the same order. Then the
    engine is released for the update (vLLM sleep mode on GPUs)."""
    run.engine.take_counts()                      # count this step's rollout prompts only (not eval's)
    batch, run.engine = rollout_with_retry(run.engine, run.sampler, run.prompt_tokens, run.cfg, r,
                                           lambda: new_engine(run), rank=run.policy.rank, world=run.policy.world)
    shares = run.engine.take_counts()
    if run.policy.world > 1:
        run.log(f"step {r}: prompts generated per engine ({run.engine.tp} rank(s) each): {shares}")
    release_engine(run.engine)
    return batch


def _push_lagged(run: Run, r: int) -> dict[str, float]:
    """Before step r's rollouts with train.staleness = k: push the weights of update r-1-k; the lag, logged."""
    if run.lagged is None:
        return {}
    from dapo.train.staleness import swapped_weights
    v, weights = run.lagged.for_step(r)
    with swapped_weights(run.policy.module, weights):    # every rank its own shards; the stream gathers them
        push_weights(run.policy, run.engine)
    return {"offpolicy/staleness": float(r - 1 - v)}


def _behaviour(run: Run, batch, adv: torch.Tensor, r: int) -> Behaviour:
    """Step 5 (:func:`dapo.train.behaviour.behaviour_policy`) for step r's batch, adv [N]: the trainer's forwards
    are those of its model as it is and, with train.staleness, with the weights that sampled (:func:`_lag_logprobs`)."""
    lag = None if run.lagged is None else (lambda: _lag_logprobs(run, batch, r))
    return behaviour_policy(Inputs(run.cfg, batch, adv, lambda entropy: _trainer_logprobs(run, batch, entropy),
                                   lag, run.policy.world))


def _trainer_logprobs(run: Run, batch, entropy: str):
    """:func:`dapo.train.logprobs.old_logprobs` of the trainer's model: (logp [N, L], entropy [N, L] or None
    (``entropy``: one of its ENTROPY_MODES), resp_mask [N, L])."""
    p = run.policy
    return old_logprobs(p.module, batch, run.cfg, p.pad_id, p.device, p.autocast, p.rank, p.world, entropy=entropy)


def _lag_logprobs(run: Run, batch, r: int) -> torch.Tensor:
    """train.staleness = k: [N, L] log-probs of one more forward of the trainer with the weights that sampled
    step r's rollouts (update r-1-k, still kept: the update of step r is recorded after it)."""
    from dapo.train.staleness import swapped_weights
    _, weights = run.lagged.for_step(r)
    with swapped_weights(run.policy.module, weights):
        return _trainer_logprobs(run, batch, "none")[0]


def _update(run: Run, batch, beh: Behaviour, adv: torch.Tensor, r: int):
    """Step 6 with its fault hooks: π_old, the loss mask, the token weights and the buffer for the update's own
    log-probs from ``beh``; ``train.nonfinite=stop`` ends the MLflow run with the reason."""
    try:
        with faults.during_update(run.policy.model, run.policy.optimizer, r):   # test hooks; inert otherwise
            return update_policy(run.policy, batch, beh.old_lp, adv, beh.loss_mask, run.cfg,
                                 shuffle_seed=round_seed(run.cfg.train.seed, r, 0, salt=7), own_logp=beh.own_lp,
                                 token_weight=beh.weight)
    except NonFiniteError as exc:
        if run.is_main:
            run.tracker.set_tags({"dapo.status": "failed", "dapo.error": f"rollout step {r}: {exc}"})
            run.tracker.finish("FAILED")
        raise


def _evaluate_at_start(run: Run) -> None:
    """Grad step 0 (``eval.at_start``, a fresh run whose MLflow run has no point 0 yet): every rank evaluates."""
    eval0 = broadcast_object(run.is_main and not run.tracker.has_point(0), run.policy.world)
    if run.state["rollout_step"] == 0 and run.cfg.eval.at_start and eval0:
        t = time.time()
        ev = _evaluate(run, 0)
        run.tracker.record({**ev, "time/eval_s": time.time() - t}, rollout_step=0, grad_step=0)
        run.log("eval @0: " + fmt_eval(ev))


def _evaluate(run: Run, r: int) -> dict[str, float]:
    """avg/pass/cons@k on every eval set; every rank calls it (generation is split over the ranks);
    rank 0 keeps the per-sample records."""
    ev, records = evaluate(run.engine, run.eval_sets, run.prompt_tokens, run.cfg,
                           seed=eval_seed(run.cfg.train.seed, r), rank=run.policy.rank, world=run.policy.world)
    if run.is_main:
        _save_eval_records(run, r, records)
    return ev


def _save_eval_records(run: Run, r: int, records: list[dict[str, Any]]) -> None:
    """An evaluation's records (dapo.eval_records) into ``<run dir>/eval_records/eval-step<r>.jsonl.gz``,
    atomically (rollout step r evaluated again after a resume replaces its file: no sample twice),
    and into MLflow: the file under ``eval_records/``, and a table for the UI."""
    for rec in records:
        rec.update(step=r, grad_step=run.state["grad_step"])
    path = eval_records.write_records(eval_records.records_path(run.run_dir, r), records)
    run.tracker.log_artifact(path, eval_records.DIRNAME)
    run.tracker.log_table(eval_records.table_columns(records), f"{eval_records.DIRNAME}/step{r:05d}.json")


def _tokens(batch, resp_mask: torch.Tensor, cfg: Config) -> tuple[int, int]:
    """(generated tokens, every round of the step; trained prompt + response tokens × ppo_epochs)."""
    trained = int(resp_mask.sum()) + sum(len(p) for p in batch.prompt_ids)
    return int(batch.stats["sampling/gen_tokens"]), trained * cfg.train.ppo_epochs


def _throughput(metrics: dict[str, float], gen_tok: int, train_tok: int) -> dict[str, float]:
    """Generated tokens per rollout second; trained tokens per update second."""
    return {"perf/rollout_tokens_per_s": gen_tok / max(metrics["time/rollout_s"], 1e-9),
            "perf/train_tokens_per_s": train_tok / max(metrics["time/train_s"], 1e-9)}


def _log_step(run: Run, r: int, batch, resp_mask: torch.Tensor, metrics: dict[str, float], ev: dict[str, float],
              bar) -> None:
    """Step 9: the throughput into ``metrics``, the run's token totals (summary.json; checkpointed, so resumes
    add up), the point buffered (sent to MLflow right after the next checkpoint), the progress bar and line."""
    state = run.state
    gen_tok, train_tok = _tokens(batch, resp_mask, run.cfg)
    metrics.update(_throughput(metrics, gen_tok, train_tok))
    state["gen_tokens"] = state.get("gen_tokens", 0) + gen_tok
    state["trained_tokens"] = state.get("trained_tokens", 0) + train_tok
    state["rollout_step"] = r
    run.tracker.record(metrics, rollout_step=r, grad_step=state["grad_step"])
    bar.update(1)
    run.log(_step_line(r, run.cfg.train.rollout_steps, state["grad_step"], metrics, batch, ev))


def _checkpoint_step(run: Run, r: int, preemption: StepBoundarySignal | None) -> None:
    """Step 10: a checkpoint every checkpoint.every rollout steps, at the last, and when a rank got USR2
    (checkpoint.on_preempt=step_boundary: then published and the signal handed over)."""
    every = run.cfg.checkpoint.every
    preempted = preemption is not None and preemption.pending(run.policy.world)
    if (every and r % every == 0) or r == run.cfg.train.rollout_steps or preempted:
        _checkpoint(run, r)
    if preempted:
        _publish_pending(run)
        run.log(f"preemption signal: checkpointed at rollout step {r}; handing over (requeue or exit)")
        preemption.hand_over()


def _checkpoint(run: Run, r: int) -> None:
    """Step 10: the checkpoint holds the metrics not yet sent; they are flushed once it is published.
    Sharded (several processes): every rank writes its own shards; rank 0 publishes.
    ``checkpoint.async_save``: the previous checkpoint (written in the background since its step) is
    published first and the metrics it covers flushed; this one's files are then written in the
    background, to be published at the next checkpoint or at the end (:func:`_publish_pending`)."""
    p = run.policy
    _publish_pending(run)
    run.state.update(mlflow_run_id=run.tracker.run_uuid, pending=list(run.tracker.buffer),
                     sampler=run.sampler.state_dict(), wall_s=run.wall_s())
    if run.is_main or p.world > 1:
        saved = save_checkpoint(run.run_dir, r, model=p.module, optimizer=p.optimizer, scheduler=p.scheduler,
                                state=run.state, keep_last=run.cfg.checkpoint.keep_last,
                                extra={"lagged": run.lagged.state_dict()} if run.lagged is not None else None,
                                async_save=run.cfg.checkpoint.async_save)
        if run.cfg.checkpoint.async_save:
            run.pending_checkpoint = (saved, r)
            return
    if run.is_main:
        faults.kill_point("KILL_AFTER_CHECKPOINT", r)   # test hook: checkpointed, not yet flushed
    run.tracker.flush()                                   # ranks > 0: a disabled tracker drops its copy
    run.state["pending"] = []
    barrier(p.world)


def _publish_pending(run: Run) -> None:
    """``checkpoint.async_save``: wait for the checkpoint being written, publish it, then send the
    metrics of the rollout steps it covers (the later ones stay buffered for the next checkpoint)."""
    if run.pending_checkpoint is None:
        return
    pending, r = run.pending_checkpoint
    run.pending_checkpoint = None
    pending.finish()
    if run.is_main:
        faults.kill_point("KILL_AFTER_CHECKPOINT", r)   # test hook: published, not yet flushed
    run.tracker.flush(up_to=r)
    barrier(run.policy.world)


# =========================================================================== helpers
def _step_line(r: int, total: int, grad_step: int, m: dict[str, float], batch, ev: dict[str, float]) -> str:
    return (f"step {r}/{total} grad {grad_step} reward {m['rollout/reward_mean']:+.3f} "
            f"acc {m['rollout/acc_mean']:.3f} ent {m.get('train/entropy', float('nan')):.3f} "
            f"len {m['rollout/response_len_mean']:.1f} kept {batch.num_groups} "
            f"rounds {batch.stats['sampling/gen_rounds']} {m['time/step_s']:.1f}s" + (" | " + fmt_eval(ev) if ev else ""))
