"""Rollouts: sample prompts, generate G responses each, score them, keep informative groups.

One rollout step (steps 1-3 of the loop in docs/METRICS.md, Algorithm 1 of the paper):

    sample B' prompts → generate G each (one *round*, :func:`generate_round`) → score ±1
    (+ soft overlong penalty) → dynamic sampling keeps groups with 0 < #correct < G and
    refills with further rounds until B groups are kept (:func:`collect_rollouts`).

Notation as in dapo.algo: B prompts, G responses, N = B·G sequences, L response tokens.
Also here: creating the rollout engine and retrying a step whose engine died.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from dapo import algo, faults
from dapo.config import Config
from dapo.data.rewards import get_scorer
from dapo.data.run_data import example_key
from dapo.dist.distributed import all_gather_strided, rollout_group, split_for_rank

__all__ = ["RolloutBatch", "collect_rollouts", "generate_round", "score_round", "DynamicSamplingExhausted", "round_seed",
           "make_rollout_engine", "rollout_with_retry"]


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling could not fill the batch within ``max_gen_rounds``."""


@dataclass
class RolloutBatch:
    """The kept groups of one rollout step, flattened group-major (sequence i = b·G + g)."""
    prompt_ids: list[list[int]]      # N prompts (each repeated G times)
    response_ids: list[list[int]]    # N responses (EOS included when generated)
    finished: torch.Tensor           # [N] bool, stopped on EOS (not truncated)
    correct: torch.Tensor            # [B, G] bool
    rewards: torch.Tensor            # [B, G] shaped reward (±1 + soft overlong penalty)
    penalty: torch.Tensor            # [B, G] soft overlong penalty part
    stats: dict[str, float] = field(default_factory=dict)
    rollout_logprobs: list[list[float]] | None = None   # N lists aligned with response_ids: log π_rollout
                                                         # (None when the engine returned none)
    in_loss: torch.Tensor | None = None   # [B] bool: groups that enter the loss (dynamic sampling mode=mask);
                                          # None = every group

    @property
    def num_groups(self) -> int:
        return int(self.correct.shape[0])


def round_seed(seed: int, rollout_step: int, round_idx: int, salt: int = 0) -> int:
    """The sampling seed of one generation round (also eval: salt 99, the update's shuffle: salt 7)."""
    return (seed * 1_000_003 + rollout_step * 7919 + round_idx * 104_729 + salt) % (2 ** 31 - 1)


def generate_round(engine, prompts: list[list[int]], spec) -> list[list[Any]]:
    """One generation round: ``spec.n`` completions for each prompt, in prompt order.

    prompts: [P] token id lists -> [P][G] completions (``Completion``: token_ids, text, finished).
    """
    return engine.generate(prompts, spec)


def score_round(examples, outs: list[list[Any]], *, rank: int = 0, world: int = 1) -> torch.Tensor:
    """[P, G] bool: each completion scored correct by its example's scorer (correctness, not the shaped
    reward), scored ONCE over the ranks: rank k scores completions k, k + world, ... of the round
    (flattened prompt-major) and the shares are gathered (on the rollout's group), so every rank holds
    the same values even where a scorer is not deterministic (math-verify's wall-clock limit: a rank
    under load would score a slow answer wrong alone, keep other groups, or refill alone and hang).
    A collective with ``world`` > 1: every rank calls it with the same round."""
    flat = [(ex, c) for ex, comps in zip(examples, outs) for c in comps]
    mine = split_for_rank(len(flat), rank, world)
    local = torch.tensor([get_scorer(flat[i][0].scorer)(flat[i][1].text, flat[i][0].answer) > 0 for i in mine],
                         dtype=torch.bool)
    full = all_gather_strided(local, len(flat), rank, world, group=rollout_group())
    return full.reshape(len(outs), -1) if outs else torch.zeros(0, 0, dtype=torch.bool)


def collect_rollouts(engine, sampler, prompt_tokens, cfg: Config, rollout_step: int, *, rank: int = 0,
                     world: int = 1) -> RolloutBatch:
    """Generate and score groups until B informative groups are kept (dynamic sampling).

    Without dynamic sampling: one round of B prompts, every group kept. With it (mode refill): rounds
    of ``cfg.gen_batch_prompts`` prompts, keep groups in the band (0 < #correct < G by default;
    correctness, not the shaped reward), stop at B kept or after ``max_gen_rounds`` (then error or
    proceed). Modes filter and mask: one round of B prompts; filter drops the groups outside the band,
    mask keeps them with loss weight 0 (``RolloutBatch.in_loss``); see `algo.dynamic_sampling_keep`.
    With ``data.drop_solved`` every all-correct group's prompt is marked solved in the sampler.
    With several ranks (``rank`` of ``world``) each round is scored once, split over the ranks
    (:func:`score_round`), so every rank keeps the same groups, marks the same prompts solved and runs
    the same rounds.
    """
    from dapo.engines import SamplingSpec
    G, B = cfg.rollout.n, cfg.train.batch_prompts
    ds = cfg.algo.dynamic_sampling
    kept: list[tuple[list[int], list[Any], torch.Tensor]] = []   # (prompt ids, completions, correct [G])
    seen: list[torch.Tensor] = []                                # correct [G] of every generated group
    gen_tokens = rounds = 0
    refill = ds.enabled and ds.mode == "refill"
    max_rounds = ds.max_gen_rounds if refill else 1
    while rounds < max_rounds and len(kept) < B:
        examples = sampler.next_batch()  # batch size fixed at cfg.gen_batch_prompts
        prompts = [prompt_tokens[example_key(ex)] for ex in examples]
        spec = SamplingSpec(n=G, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_tokens=cfg.rollout.max_new_tokens,
                            seed=round_seed(cfg.train.seed, rollout_step, rounds))
        outs = generate_round(engine, prompts, spec)                             # [B'][G]
        rounds += 1
        scores = score_round(examples, outs, rank=rank, world=world)            # [B', G]
        for ex, p, comps, corr in zip(examples, prompts, outs, scores):
            gen_tokens += sum(len(c.token_ids) for c in comps)
            seen.append(corr)
            if cfg.data.drop_solved and bool(corr.all()):
                sampler.mark_solved(ex)
            if not ds.enabled or bool(algo.dynamic_sampling_keep(corr[None], ds.mode, ds.min_acc, ds.max_acc)[0][0]):
                kept.append((p, comps, corr))
    groups = algo.group_stats(torch.stack(seen) if seen else torch.zeros(0, G, dtype=torch.bool))
    if refill and len(kept) < B:
        _exhausted(cfg, rollout_step, len(kept), rounds, len(seen), groups)
    kept = kept[:B]
    stats = {"sampling/gen_rounds": rounds,
             "sampling/kept_groups": len(kept),
             "sampling/discarded_groups": len(seen) - len(kept),
             "sampling/all_correct_frac": groups["all_correct_frac"],
             "sampling/all_wrong_frac": groups["all_wrong_frac"],
             "sampling/gen_tokens": gen_tokens}
    if cfg.data.drop_solved:
        stats.update(sampler.pool_stats())
    return _assemble(kept, cfg, stats)


def _exhausted(cfg: Config, rollout_step: int, n_kept: int, rounds: int, n_seen: int, groups: dict) -> None:
    """Too few informative groups after ``max_gen_rounds``: raise, or warn and go on (``on_exhausted``)."""
    ds, B = cfg.algo.dynamic_sampling, cfg.train.batch_prompts
    n_correct, n_wrong = round(groups["all_correct_frac"] * n_seen), round(groups["all_wrong_frac"] * n_seen)
    msg = (f"rollout step {rollout_step}: dynamic sampling kept {n_kept}/{B} groups after {rounds} "
           f"rounds = algo.dynamic_sampling.max_gen_rounds of {cfg.gen_batch_prompts} prompts "
           f"({n_seen} groups: {n_correct} all-correct, {n_wrong} all-wrong)")
    if ds.on_exhausted == "error":
        raise DynamicSamplingExhausted(
            f"{msg}; raise algo.dynamic_sampling.max_gen_rounds or algo.dynamic_sampling.gen_batch_prompts, "
            f"or set algo.dynamic_sampling.on_exhausted=proceed to train on what was kept")
    # proceed: train on what was kept; with nothing kept, this step makes no update
    print(f"[dapo] warning: {msg}; algo.dynamic_sampling.on_exhausted=proceed: training on {n_kept} "
          f"groups" + ("" if n_kept else " = no update this step (sampling/skipped_update = 1)"), flush=True)


def _assemble(kept: list[tuple[list[int], list[Any], torch.Tensor]], cfg: Config, stats: dict) -> RolloutBatch:
    """Flatten the kept groups group-major, shape the rewards (±1 + soft overlong penalty), add the rollout stats."""
    G, ov = cfg.rollout.n, cfg.algo.overlong
    prompt_ids, response_ids, finished, lengths, lps = [], [], [], [], []
    for p, comps, _ in kept:
        for c in comps:
            prompt_ids.append(p)
            response_ids.append(list(c.token_ids))
            lps.append(getattr(c, "logprobs", None))
            finished.append(bool(c.finished))
            lengths.append(len(c.token_ids))
    correct = torch.stack([k[2] for k in kept]) if kept else torch.zeros(0, G, dtype=torch.bool)   # [B, G]
    score = correct.float() * 2 - 1                                                                  # [B, G] ±1
    if ov.soft_punish:
        penalty = algo.soft_overlong_penalty(torch.tensor(lengths), max_len=ov.max_len,
                                             cache_len=ov.cache_len, factor=ov.factor).view_as(score)
    else:
        penalty = torch.zeros_like(score)
    finished_t = torch.tensor(finished, dtype=torch.bool)                                            # [N]
    ds = cfg.algo.dynamic_sampling
    in_loss = None
    if ds.enabled and ds.mode == "mask":                                                             # [B] bool
        in_loss = algo.dynamic_sampling_keep(correct, ds.mode, ds.min_acc, ds.max_acc)[1]
        stats = {**stats, "sampling/masked_groups": float((~in_loss).sum())}
    stats = {**stats,
             "sampling/skipped_update": 0.0 if kept else 1.0,
             "rollout/acc_mean": correct.float().mean().item() if kept else math.nan,   # nan: nothing kept
             "rollout/reward_mean": (score + penalty).mean().item() if kept else math.nan,
             "rollout/overlong_penalty_mean": penalty.mean().item() if kept else math.nan,
             "rollout/response_len_mean": float(np.mean(lengths)) if lengths else math.nan,
             "rollout/response_len_max": float(np.max(lengths)) if lengths else math.nan,
             "rollout/reward_std": (score + penalty).std(unbiased=False).item() if kept else math.nan,
             "rollout/finished_len_mean": (float(np.mean([n for n, f in zip(lengths, finished) if f]))
                                           if any(finished) else math.nan),
             "rollout/truncated_frac": (~finished_t).float().mean().item() if kept else math.nan}
    rollout_lp = lps if lps and all(lp is not None and len(lp) == len(r) for lp, r in zip(lps, response_ids)) \
        else None
    return RolloutBatch(prompt_ids, response_ids, finished_t, correct, score + penalty, penalty, stats, rollout_lp,
                        in_loss)


# =========================================================================== the engine
def make_rollout_engine(cfg: Config, model_path, device: torch.device, trainer_model, *, rank: int = 0,
                        world: int = 1):
    """This rank's engine of ``cfg.rollout.engine`` on ``model_path`` (rollout dtype: bf16 on CUDA unless
    set), driven as the job's one engine (`RankShardedEngine`): each call's prompts are dealt out over
    the engines (``rollout.tensor_parallel_size`` ranks each) and the completions gathered in order.
    With several ranks every rank calls this at the same time (vLLM builds its groups over all ranks)."""
    from dapo.engines import make_engine
    from dapo.engines.sharded import RankShardedEngine
    rdtype = cfg.model.rollout_dtype if cfg.model.rollout_dtype != "auto" else (
        "bfloat16" if device.type == "cuda" else cfg.model.train_dtype)
    kw = {}
    if cfg.rollout.engine == "vllm":
        kw = {"kv_cache_space_gib": cfg.rollout.vllm_kv_cache_gib,
              "gpu_memory_utilization": cfg.rollout.gpu_memory_utilization,
              "max_model_len": cfg.data.max_prompt_tokens + max(cfg.rollout.max_new_tokens,
                                                                 cfg.eval.max_new_tokens or 0),
              "tensor_parallel_size": cfg.rollout.tensor_parallel_size, "external_launcher": world > 1,
              "sleep_mode": cfg.rollout.sleep_mode, "enforce_eager": cfg.rollout.enforce_eager,
              "load_format": "dummy"}   # every caller pushes the trainer's weights before generating
        if cfg.rollout.max_num_seqs is not None:
            kw["max_num_seqs"] = cfg.rollout.max_num_seqs
    elif world > 1:
        raise ValueError(f"rollout.engine={cfg.rollout.engine!r} cannot split generation over {world} processes "
                         f"(it generates with the sharded trainer model); use rollout.engine=vllm")
    # with train.staleness the transformers engine keeps its own copy (it samples with lagged weights)
    engine = make_engine(cfg.rollout.engine, model_path, dtype=rdtype, seed=cfg.train.seed,
                         trainer_model=None if cfg.train.staleness else trainer_model, **kw)
    return RankShardedEngine(engine, rank=rank, world=world,
                             tensor_parallel_size=cfg.rollout.tensor_parallel_size if world > 1 else 1)


def rollout_with_retry(engine, sampler, prompt_tokens, cfg: Config, r: int, new_engine: Callable[[], Any], *,
                       rank: int = 0, world: int = 1):
    """collect_rollouts (this ``rank`` of ``world``), retried ``rollout.retries`` times on an engine
    failure; returns (batch, engine).

    Before a retry the engine is closed and re-created by ``new_engine()`` (a dead vLLM engine
    cannot be reused; it must return an engine holding the current weights), and the sampler is
    rewound, so the step sees the same prompts and seeds as if nothing had failed.
    """
    snap = sampler.state_dict()
    for attempt in range(cfg.rollout.retries + 1):
        try:
            return collect_rollouts(faults.engine_for_step(engine, r), sampler, prompt_tokens, cfg, r,
                                    rank=rank, world=world), engine
        except DynamicSamplingExhausted:
            raise
        except Exception as exc:  # the engine died mid-generation
            if type(exc).__module__.startswith("submitit"):  # preemption/requeue from a signal
                raise                                          # handler: not an engine failure
            if attempt == cfg.rollout.retries:
                raise RuntimeError(f"rollout step {r}: generation failed {attempt + 1} times "
                                   f"(rollout.retries = {cfg.rollout.retries}); the run is resumable from "
                                   f"its last checkpoint: {exc}") from exc
            print(f"[dapo] rollout step {r}: engine failure ({exc!r}); re-creating the engine and "
                  f"retrying ({attempt + 1}/{cfg.rollout.retries})", flush=True)
            sampler.load_state_dict(snap)
            try:
                engine.close()
            except Exception as close_exc:  # noqa: BLE001 - a dead engine may not close cleanly
                print(f"[dapo] closing the failed engine: {close_exc!r}", flush=True)
            engine = new_engine()
    raise AssertionError("unreachable")
