"""The one training loop every job of every sweep runs: ``dapo train EXP.yaml [k=v ...]``.

Read :func:`train` top to bottom; each step of the algorithm (DESIGN.md §2) is one
visible block:

    sample prompts → generate G responses each (vLLM) → score ±1 + soft overlong penalty
    → mark truncated → dynamic sampling (keep 0 < #correct < G, refill) → group advantages
    → old logprobs (trainer's model) → mini-batch updates with micro-batch accumulation,
    token-level loss over the global token count → AdamW + warm-up + grad clip
    → weight sync into the engine → eval (avg@k, pass@k, cons@k) → log → checkpoint.

Notation as in dapo.algo: B prompts, G responses, N = B·G sequences, L response tokens.
The loop knows nothing about Slurm; the launcher knows nothing about losses.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo import algo, faults
from dapo.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from dapo.config import Config, config_hash, flatten, load_config, to_dict
from dapo.rewards import extract_answer, get_scorer

__all__ = ["train", "RolloutBatch", "collect_rollouts", "update_policy", "evaluate",
           "DynamicSamplingExhausted", "NonFiniteError", "run_dir_for", "main"]


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling could not fill the batch within ``max_gen_rounds``."""


class NonFiniteError(RuntimeError):
    """A NaN/inf loss or gradient with ``train.nonfinite = stop``."""


# =========================================================================== batches
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

    @property
    def num_groups(self) -> int:
        return int(self.correct.shape[0])


def run_dir_for(cfg: Config) -> Path:
    """``<output_dir>/runs/<name>-<hash>``: the same resolved config → the same directory."""
    return Path(cfg.output_dir) / "runs" / f"{cfg.name}-{config_hash(cfg)}"


def _round_seed(seed: int, rollout_step: int, round_idx: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + rollout_step * 7919 + round_idx * 104_729 + salt) % (2 ** 31 - 1)


# =========================================================================== rollout
def collect_rollouts(engine, sampler, prompt_tokens, cfg: Config, rollout_step: int) -> RolloutBatch:
    """Generate and score groups until B informative groups are kept (dynamic sampling).

    Without dynamic sampling: one round of B prompts, every group kept. With it: rounds of
    ``cfg.gen_batch_prompts`` prompts, keep groups with 0 < #correct < G (correctness, not
    the shaped reward), stop at B kept or after ``max_gen_rounds`` (then error or proceed).
    """
    from dapo.engines import SamplingSpec
    G, B = cfg.rollout.n, cfg.train.batch_prompts
    ds, ov = cfg.algo.dynamic_sampling, cfg.algo.overlong
    kept: list[tuple[list[int], list[Any], Any]] = []   # (prompt ids, completions, example)
    seen_groups = all_correct = all_wrong = 0
    gen_tokens = 0
    rounds = 0
    max_rounds = ds.max_gen_rounds if ds.enabled else 1
    while rounds < max_rounds and len(kept) < B:
        examples = sampler.next_batch()  # batch size fixed at cfg.gen_batch_prompts
        prompts = [prompt_tokens[_key(ex)] for ex in examples]
        spec = SamplingSpec(n=G, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_tokens=cfg.rollout.max_new_tokens,
                            seed=_round_seed(cfg.train.seed, rollout_step, rounds))
        outs = engine.generate(prompts, spec)
        rounds += 1
        for ex, p, comps in zip(examples, prompts, outs):
            scorer = get_scorer(ex.scorer)
            corr = torch.tensor([scorer(c.text, ex.answer) > 0 for c in comps])   # [G]
            gen_tokens += sum(len(c.token_ids) for c in comps)
            seen_groups += 1
            all_correct += int(corr.all())
            all_wrong += int(~corr.any())
            if not ds.enabled or bool(algo.informative_groups(corr[None])[0]):
                kept.append((p, comps, ex, corr))
    if ds.enabled and len(kept) < B:
        msg = (f"rollout step {rollout_step}: dynamic sampling kept {len(kept)}/{B} groups after {rounds} "
               f"rounds = algo.dynamic_sampling.max_gen_rounds of {cfg.gen_batch_prompts} prompts "
               f"({seen_groups} groups: {all_correct} all-correct, {all_wrong} all-wrong)")
        if ds.on_exhausted == "error":
            raise DynamicSamplingExhausted(
                f"{msg}; raise algo.dynamic_sampling.max_gen_rounds or algo.dynamic_sampling.gen_batch_prompts, "
                f"or set algo.dynamic_sampling.on_exhausted=proceed to train on what was kept")
        # proceed: train on what was kept; with nothing kept, this step makes no update
        print(f"[dapo] warning: {msg}; algo.dynamic_sampling.on_exhausted=proceed: training on {len(kept)} "
              f"groups" + ("" if kept else " = no update this step (sampling/skipped_update = 1)"), flush=True)
    kept = kept[:B]
    prompt_ids, response_ids, finished, lengths = [], [], [], []
    for p, comps, _, _ in kept:
        for c in comps:
            prompt_ids.append(p)
            response_ids.append(list(c.token_ids))
            finished.append(bool(c.finished))
            lengths.append(len(c.token_ids))
    correct = torch.stack([k[3] for k in kept]) if kept else torch.zeros(0, G, dtype=torch.bool)
    score = correct.float() * 2 - 1                                                    # [B, G] ±1
    if ov.soft_punish:
        penalty = algo.soft_overlong_penalty(torch.tensor(lengths), max_len=ov.max_len,
                                             cache_len=ov.cache_len, factor=ov.factor).view_as(score)
    else:
        penalty = torch.zeros_like(score)
    finished_t = torch.tensor(finished, dtype=torch.bool)
    stats = {
        "sampling/gen_rounds": rounds,
        "sampling/kept_groups": len(kept),
        "sampling/discarded_groups": seen_groups - len(kept),
        "sampling/all_correct_frac": all_correct / max(seen_groups, 1),
        "sampling/all_wrong_frac": all_wrong / max(seen_groups, 1),
        "sampling/gen_tokens": gen_tokens,
        "sampling/skipped_update": 0.0 if kept else 1.0,
        "rollout/acc_mean": correct.float().mean().item() if kept else math.nan,   # nan: nothing kept
        "rollout/reward_mean": (score + penalty).mean().item() if kept else math.nan,
        "rollout/overlong_penalty_mean": penalty.mean().item() if kept else math.nan,
        "rollout/response_len_mean": float(np.mean(lengths)) if lengths else math.nan,
        "rollout/response_len_max": float(np.max(lengths)) if lengths else math.nan,
        "rollout/truncated_frac": (~finished_t).float().mean().item() if kept else math.nan,
    }
    return RolloutBatch(prompt_ids, response_ids, finished_t, correct, score + penalty, penalty, stats)


def _key(ex) -> tuple:
    return (ex.source, ex.index)


# =========================================================================== forward
def _pack(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int, device):
    """Left-pad prompts to P and right-pad responses to L so responses start at column P.

    Returns input_ids [n, P+L], attention_mask [n, P+L], position_ids [n, P+L],
    targets [n, L] (response tokens), resp_mask [n, L] (1 on real response tokens), P.
    """
    n = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    L = max(max((len(r) for r in response_ids), default=0), 1)
    ids = torch.full((n, P + L), pad_id, dtype=torch.long)
    att = torch.zeros((n, P + L), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        ids[i, P - len(p):P] = torch.tensor(p)
        att[i, P - len(p):P] = 1
        if r:
            ids[i, P:P + len(r)] = torch.tensor(r)
            att[i, P:P + len(r)] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    targets = ids[:, P:]
    resp_mask = att[:, P:].float()
    return ids.to(device), att.to(device), pos.to(device), targets.to(device), resp_mask.to(device), P


def response_logits(model, prompt_ids, response_ids, pad_id, device, autocast: bool):
    """Forward → logits at the positions that predict each response token.

    Returns logits [n, L, V] (float32), targets [n, L], resp_mask [n, L].
    """
    ids, att, pos, targets, resp_mask, P = _pack(prompt_ids, response_ids, pad_id, device)
    L = targets.shape[1]
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        # only the L+1 last positions (P-1 .. P+L-1) need the vocabulary projection
        logits = model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False,
                       logits_to_keep=L + 1).logits
    return logits[:, :L].float(), targets, resp_mask


def length_sorted(idx: list[int], batch: RolloutBatch) -> list[int]:
    """``idx`` ordered by response length, then prompt length (longest first), so that each
    micro-batch pads to similar lengths. Sums over a mini-batch do not depend on the order."""
    return sorted(idx, key=lambda i: (-len(batch.response_ids[i]), -len(batch.prompt_ids[i]), i))


def response_mask(batch: RolloutBatch) -> torch.Tensor:
    """[N, L] with 1 on each response's real tokens (L = the batch's longest response)."""
    N = len(batch.response_ids)
    L = max(max((len(r) for r in batch.response_ids), default=0), 1)
    mask = torch.zeros(N, L)
    for i, r in enumerate(batch.response_ids):
        mask[i, :len(r)] = 1.0
    return mask


def single_step_on_policy(cfg: Config, num_groups: int) -> bool:
    """True when a rollout batch feeds exactly one optimizer step (one epoch, one mini-batch):
    π_old is then the policy being differentiated, so old log-probs are the update's own
    log-probs, detached (ratio ≡ 1) and the separate no-grad forward can be skipped."""
    return cfg.train.ppo_epochs == 1 and cfg.train.mini_batch_prompts >= num_groups


@torch.no_grad()
def old_logprobs(model, batch: RolloutBatch, cfg: Config, pad_id: int, device, autocast: bool):
    """π_old log-probs, entropy and token probability of every response token.

    Returns logp [N, L], entropy [N, L], resp_mask [N, L] (padded to the batch's max L).
    """
    N = len(batch.response_ids)
    L = max(max((len(r) for r in batch.response_ids), default=0), 1)
    logp = torch.zeros(N, L)
    ent = torch.zeros(N, L)
    mask = torch.zeros(N, L)
    mb = cfg.train.micro_batch_seqs
    was_training = model.training
    model.eval()
    order = length_sorted(list(range(N)), batch)
    for s in range(0, N, mb):
        idx = order[s:s + mb]
        logits, tgt, m = response_logits(model, [batch.prompt_ids[i] for i in idx],
                                         [batch.response_ids[i] for i in idx], pad_id, device, autocast)
        lp = algo.logprobs_from_logits(logits, tgt)
        l = lp.shape[1]
        logp[idx, :l] = lp.cpu()
        ent[idx, :l] = algo.token_entropy(logits).cpu()
        mask[idx, :l] = m.cpu()
    model.train(was_training)
    return logp, ent, mask


def response_loss_mask(resp_mask: torch.Tensor, finished: torch.Tensor, overlong_filter: bool) -> torch.Tensor:
    """Tokens the loss sees. resp_mask: [N, L]; finished: [N] bool (stopped on EOS).

    With overlong filtering, truncated responses (not finished) are masked out entirely.
    """
    if not overlong_filter:
        return resp_mask
    return resp_mask * algo.overlong_mask(~finished)[:, None]                            # [N, L]


# =========================================================================== update
def update_policy(model, optimizer, scheduler, batch: RolloutBatch, old_logp: torch.Tensor | None,
                  advantages: torch.Tensor, loss_mask: torch.Tensor, cfg: Config, *, pad_id: int,
                  device, autocast: bool, rank: int = 0, world: int = 1, ref_model=None,
                  shuffle_seed: int = 0) -> list[dict[str, float]]:
    """Several optimizer steps over one rollout batch; returns one metrics dict per step.

    old_logp, loss_mask: [N, L]; advantages: [N]. Groups are split into mini-batches of
    ``mini_batch_prompts`` groups (``ppo_epochs`` passes, shuffled by ``shuffle_seed``);
    inside a mini-batch this rank takes every ``world``-th sequence and accumulates over
    micro-batches. The loss of each micro-batch is divided by the token (or sequence)
    count of the whole mini-batch across ranks, so the summed gradient does not depend
    on how the step is split; DDP's averaging is undone by scaling with ``world``.

    ``old_logp=None`` (only when `single_step_on_policy`): π_old is the current policy, so the
    update's own log-probs, detached, stand in for it; each step's metrics then also carry
    ``train/entropy`` and ``train/token_prob_mean`` over the response tokens.
    """
    G = cfg.rollout.n
    Bk = batch.num_groups
    mbp = cfg.train.mini_batch_prompts
    gen = torch.Generator().manual_seed(shuffle_seed)
    out = []
    for _epoch in range(cfg.train.ppo_epochs):
        order = torch.randperm(Bk, generator=gen).tolist()
        for s in range(0, Bk, mbp):
            groups = order[s:s + mbp]
            seqs = [b * G + g for b in groups for g in range(G)]                  # global indices
            num_tokens = float(loss_mask[seqs].sum().item())                        # whole mini-batch
            num_seqs = float(len(seqs))
            mine = length_sorted(seqs[rank::world], batch)
            optimizer.zero_grad(set_to_none=True)
            acc: dict[str, float] = {}
            mb = cfg.train.micro_batch_seqs
            n_micro = 0
            for m0 in range(0, len(mine), mb):
                idx = mine[m0:m0 + mb]
                logits, tgt, rmask = response_logits(model, [batch.prompt_ids[i] for i in idx],
                                                     [batch.response_ids[i] for i in idx], pad_id, device, autocast)
                l = tgt.shape[1]
                logp = algo.logprobs_from_logits(logits, tgt)                          # [n, l]
                m = loss_mask[idx, :l].to(device)
                if old_logp is None:   # on-policy single step: π_old = this very forward
                    old = logp.detach()
                    with torch.no_grad():
                        rm = rmask.to(logp.dtype)
                        acc["entropy_sum"] = acc.get("entropy_sum", 0.0) + float((algo.token_entropy(logits.detach()) * rm).sum())
                        acc["prob_sum"] = acc.get("prob_sum", 0.0) + float((old.exp() * rm).sum())
                        acc["resp_tokens"] = acc.get("resp_tokens", 0.0) + float(rm.sum())
                else:
                    old = old_logp[idx, :l].to(device)
                loss, met = algo.policy_loss(
                    logp, old, advantages[idx].to(device), m,
                    eps_low=cfg.algo.clip.eps_low, eps_high=cfg.algo.clip.eps_high,
                    dual_clip_c=cfg.algo.clip.dual_clip_c, agg=cfg.algo.loss_agg,
                    num_tokens=num_tokens, num_seqs=num_seqs)
                if cfg.algo.kl.coef > 0 and ref_model is not None:
                    with torch.no_grad():
                        rl, rt, _ = response_logits(ref_model, [batch.prompt_ids[i] for i in idx],
                                                    [batch.response_ids[i] for i in idx], pad_id, device, autocast)
                        ref_logp = algo.logprobs_from_logits(rl, rt)
                    kl = algo.kl_penalty(logp, ref_logp, kind=cfg.algo.kl.estimator)
                    kl_term = algo.aggregate(kl, m, cfg.algo.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs)
                    loss = loss + cfg.algo.kl.coef * kl_term
                    met["kl"] = float(kl_term.detach()) * num_tokens / max(float(m.sum()), 1.0)
                if cfg.algo.entropy_coef > 0:
                    ent = algo.aggregate(algo.token_entropy(logits), m, cfg.algo.loss_agg,
                                         num_tokens=num_tokens, num_seqs=num_seqs)
                    loss = loss - cfg.algo.entropy_coef * ent
                (loss * world).backward()
                w = float(m.sum())                                                      # token weight
                for k, v in met.items():
                    if isinstance(v, (int, float)) and k.endswith(("frac_high", "frac_low", "approx_kl",
                                                                    "ratio_mean", "dual_clip_frac", "kl")):
                        acc[k] = acc.get(k, 0.0) + v * w
                if "up_clipped_count" in met:
                    acc["up_clipped_count"] = acc.get("up_clipped_count", 0.0) + met["up_clipped_count"]
                    acc["up_clipped_prob_sum"] = acc.get("up_clipped_prob_sum", 0.0) + \
                        met.get("up_clipped_prob_mean", 0.0) * met["up_clipped_count"]
                acc["loss"] = acc.get("loss", 0.0) + float(loss.detach())
                acc["tokens"] = acc.get("tokens", 0.0) + w
                n_micro += 1
            acc = _all_reduce_sum(acc, world)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            finite = math.isfinite(float(grad_norm)) and math.isfinite(acc.get("loss", 0.0))
            if finite:
                optimizer.step()
            elif cfg.train.nonfinite == "stop":
                raise NonFiniteError(f"non-finite loss {acc.get('loss')} / grad norm {float(grad_norm)}; "
                                     f"train.nonfinite=stop (skip would drop such gradient steps); "
                                     f"the last checkpoint is untouched")
            else:
                optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            tok = max(acc.get("tokens", 0.0), 1.0)
            step_metrics = {
                "train/loss": acc.get("loss", 0.0),
                "train/grad_norm": float(grad_norm),
                "train/lr": scheduler.get_last_lr()[0],
                "train/clip_frac_high": acc.get("clip_frac_high", 0.0) / tok,
                "train/clip_frac_low": acc.get("clip_frac_low", 0.0) / tok,
                "train/approx_kl": acc.get("approx_kl", 0.0) / tok,
                "train/ratio_mean": acc.get("ratio_mean", 0.0) / tok,
                "train/up_clipped_prob_mean": (acc["up_clipped_prob_sum"] / acc["up_clipped_count"]
                                               if acc.get("up_clipped_count") else 0.0),
                "train/skipped_step": 0.0 if finite else 1.0,
            }
            if "kl" in acc:
                step_metrics["train/kl"] = acc["kl"] / tok
            if "resp_tokens" in acc:
                step_metrics["train/entropy"] = acc["entropy_sum"] / max(acc["resp_tokens"], 1.0)
                step_metrics["train/token_prob_mean"] = acc["prob_sum"] / max(acc["resp_tokens"], 1.0)
            out.append(step_metrics)
    return out


def _all_reduce_sum(d: dict[str, float], world: int) -> dict[str, float]:
    if world == 1:
        return d
    import torch.distributed as dist
    keys = sorted(["loss", "tokens", "clip_frac_high", "clip_frac_low", "approx_kl", "ratio_mean",
                   "up_clipped_count", "up_clipped_prob_sum", "kl", "dual_clip_frac",
                   "entropy_sum", "prob_sum", "resp_tokens"])
    t = torch.tensor([d.get(k, 0.0) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) for k, v in zip(keys, t.tolist()) if k in d or float(v) != 0.0}


# =========================================================================== evaluation
def evaluate(engine, eval_sets: dict[str, list], prompt_tokens, cfg: Config, seed: int) -> dict[str, float]:
    """avg@k, pass@k, cons@k per eval set, from k samples per problem.

    avg@k = mean correctness over all k·P samples; pass@k = fraction of problems with at
    least one correct sample; cons@k = fraction whose majority-vote answer is correct.
    """
    from dapo.engines import SamplingSpec
    k = cfg.eval.k
    out: dict[str, float] = {}
    for name, examples in eval_sets.items():
        spec = SamplingSpec(n=k, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                            max_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, seed=seed)
        outs = engine.generate([prompt_tokens[_key(ex)] for ex in examples], spec)
        avg, pas, cons, lens = [], [], [], []
        for ex, comps in zip(examples, outs):
            scorer = get_scorer(ex.scorer)
            corr = [scorer(c.text, ex.answer) > 0 for c in comps]
            answers = [extract_answer(c.text) for c in comps]
            vote = algo.majority_vote(answers)
            rep = next((c for c, a in zip(comps, answers) if a == vote and vote is not None), None)
            avg.append(float(np.mean(corr)))
            pas.append(float(any(corr)))
            cons.append(float(rep is not None and scorer(rep.text, ex.answer) > 0))
            lens.extend(len(c.token_ids) for c in comps)
        short = name.replace("/", "_")
        out[f"eval/{short}/avg_at_{k}"] = float(np.mean(avg))
        out[f"eval/{short}/pass_at_{k}"] = float(np.mean(pas))
        out[f"eval/{short}/cons_at_{k}"] = float(np.mean(cons))
        out[f"eval/{short}/response_len_mean"] = float(np.mean(lens))
    return out


# =========================================================================== the loop
def train(cfg: Config, run_dir: str | os.PathLike | None = None, *, tags: dict[str, str] | None = None,
          fault: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run (or resume) one training run; returns a summary dict (also saved as summary.json).

    ``fault`` is for tests only: {"kill_at_rollout_step": s} makes the process SIGKILL
    itself right after step s's updates, before its checkpoint.

    If the run raises, its MLflow run (if one was created) is ended FAILED (KILLED for an
    interrupt or exit) with the reason in the ``dapo.error`` tag, so no crashed run is left
    showing RUNNING; resuming the run dir sets it RUNNING again. Checkpoints are untouched.
    """
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(cfg)
    try:
        return _train(cfg, run_dir, tags=tags, fault=fault)
    except BaseException as exc:
        if int(os.environ.get("RANK", "0") or 0) == 0:
            mark_run_ended(run_dir, exc)
        raise


def mark_run_ended(run_dir: Path, exc: BaseException) -> bool:
    """Best effort: end the MLflow run recorded in ``run_dir/mlflow_run.json`` as FAILED
    (KILLED for KeyboardInterrupt/SystemExit) with ``dapo.status``/``dapo.error`` tags.
    Returns True if a run was marked. Never raises: the original error is what matters."""
    try:
        info = json.loads((Path(run_dir) / "mlflow_run.json").read_text())
        from mlflow.tracking import MlflowClient
        client = MlflowClient(tracking_uri=info["tracking_uri"])
        if client.get_run(info["run_id"]).info.status != "RUNNING":
            return False   # already ended by the loop itself (e.g. train.nonfinite=stop), with its reason
        killed = not isinstance(exc, Exception)
        reason = f"{type(exc).__name__}: {exc}"[:4000]
        client.set_tag(info["run_id"], "dapo.status", "killed" if killed else "failed")
        client.set_tag(info["run_id"], "dapo.error", reason)
        client.set_terminated(info["run_id"], status="KILLED" if killed else "FAILED")
        return True
    except Exception:
        return False


def _train(cfg: Config, run_dir: Path, *, tags: dict[str, str] | None, fault: dict[str, Any] | None) -> dict[str, Any]:
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    from dapo.data import load_dataset
    from dapo.prompts import render_prompt
    from dapo.sampler import PromptSampler
    from dapo.engines import make_engine
    from dapo.models import load_model, load_tokenizer
    from dapo.tracking import Tracker, default_tracking_uri, environment_tags, git_commit

    # ---- setup: seeds, threads, processes -------------------------------------------------
    t_start = time.time()
    kill_at = (fault or {}).get("kill_at_rollout_step") or int(os.environ.get("DAPO_FAULT_KILL_AT_STEP", "0") or 0)
    run_dir.mkdir(parents=True, exist_ok=True)
    threads = cfg.train.threads or os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))   # vLLM otherwise drops torch to 1 thread
    torch.set_num_threads(threads)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, world, is_main = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
    device = accelerator.device
    random.seed(cfg.train.seed); np.random.seed(cfg.train.seed); torch.manual_seed(cfg.train.seed)
    autocast = cfg.model.autocast_bf16 and (device.type == "cuda" or _cpu_has_bf16())
    log = (lambda *a: print("[dapo]", *a, flush=True)) if is_main else (lambda *a: None)
    (run_dir / "config.yaml").write_text(_yaml(to_dict(cfg)))

    # ---- model, tokenizer, optimizer ----------------------------------------------------------
    model_path = resolve_policy_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = load_model(model_path, dtype=cfg.model.train_dtype).to(device)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    ref_model = None
    if cfg.algo.kl.coef > 0:
        ref_model = load_model(model_path, dtype=cfg.model.train_dtype).to(device).eval()
        ref_model.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, betas=cfg.train.betas,
                                  weight_decay=cfg.train.weight_decay)
    warm = cfg.train.warmup_grad_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    policy = accelerator.unwrap_model(model)

    # ---- data: training prompts, eval sets, token ids ----------------------------------------
    use_chat = {"auto": "auto", "yes": True, "no": False}[cfg.data.use_chat_template]
    template = None if cfg.data.template == "default" else cfg.data.template
    skip = cfg.data.train_skip
    train_examples, report = load_dataset(cfg.data.train, on_bad=cfg.data.on_bad, template=template,
                                          limit=None if cfg.data.train_limit is None else skip + cfg.data.train_limit)
    train_examples = train_examples[skip:]
    log(f"train data {cfg.data.train}: {report.summary()}")
    eval_sets = {}
    for es in cfg.eval.datasets:
        ex, rep = load_dataset(es.name, limit=es.limit, on_bad=cfg.data.on_bad)
        log(f"eval data {es.name}: {rep.summary()}")
        eval_sets[Path(es.name).stem if os.sep in es.name else es.name] = ex
    train_keys = {_key(e) for e in train_examples}
    overlap = {k: sum(_key(e) in train_keys for e in v) for k, v in eval_sets.items()}
    for k, n in overlap.items():
        if n:
            log(f"WARNING: {n} of the {len(eval_sets[k])} problems of eval set {k!r} are also training "
                f"problems (same file and row); set data.train_skip to hold them out")
    prompt_tokens: dict[tuple, list[int]] = {}
    too_long = 0
    for ex in train_examples + [e for v in eval_sets.values() for e in v]:
        ids = tokenizer(render_prompt(ex, tokenizer, use_chat), add_special_tokens=False)["input_ids"]
        if len(ids) > cfg.data.max_prompt_tokens:
            too_long += 1
            if cfg.data.on_bad == "fail":
                raise ValueError(f"{ex.source} row {ex.index}: prompt has {len(ids)} tokens > "
                                 f"data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
            continue
        prompt_tokens[_key(ex)] = ids
    if too_long:
        log(f"dropped {too_long} prompts longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    train_examples = [e for e in train_examples if _key(e) in prompt_tokens]
    eval_sets = {k: [e for e in v if _key(e) in prompt_tokens] for k, v in eval_sets.items()}
    if not train_examples:
        raise ValueError(f"data.train={cfg.data.train!r}: no usable training rows")
    sampler = PromptSampler(train_examples, batch_size=cfg.gen_batch_prompts, seed=cfg.train.seed)

    # ---- resume -------------------------------------------------------------------------------
    state = {"rollout_step": 0, "grad_step": 0, "mlflow_run_id": None, "pending": [], "wall_s": 0.0}
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt, model=policy, optimizer=optimizer, scheduler=scheduler)
        sampler.load_state_dict(state["sampler"])
        log(f"resuming from {ckpt} (rollout step {state['rollout_step']}, grad step {state['grad_step']})")
    elif (run_dir / "summary.json").exists():
        pass

    # ---- tracking -------------------------------------------------------------------------------
    uri = cfg.logging.tracking_uri or default_tracking_uri(cfg.output_dir)
    id_file = run_dir / "mlflow_run.json"   # written at once, so a crash before the first
    if not state.get("mlflow_run_id") and id_file.exists():   # checkpoint still resumes this run
        state["mlflow_run_id"] = json.loads(id_file.read_text()).get("run_id")
    tracker = Tracker(uri, cfg.logging.experiment, run_dir.name, run_uuid=state.get("mlflow_run_id"),
                      enabled=is_main)
    if is_main:
        id_file.write_text(json.dumps({"run_id": tracker.run_uuid, "tracking_uri": uri}))
    if is_main:
        tracker.buffer = list(state.get("pending", []))
        tracker.flush()  # points checkpointed but not yet logged when the last run died
        tracker.set_tags({"dapo.sweep": cfg.logging.sweep, "dapo.arm": cfg.logging.arm,
                          "dapo.seed": cfg.train.seed, "dapo.run_id": run_dir.name,
                          "dapo.config_hash": config_hash(cfg), "dapo.git_commit": git_commit(),
                          "dapo.status": "running", "dapo.run_dir": str(run_dir.resolve()),
                          "dapo.data.train": report.summary(), "dapo.data.too_long_prompts": too_long,
                          "dapo.data.train_eval_overlap": sum(overlap.values()),
                          **environment_tags(), **(tags or {})})
        tracker.log_params(flatten(to_dict(cfg)))
        tracker.log_artifact(run_dir / "config.yaml")

    # ---- rollout engine (main process only; batches are broadcast) ------------------------------
    engine = None
    if is_main:
        rdtype = cfg.model.rollout_dtype if cfg.model.rollout_dtype != "auto" else (
            "bfloat16" if device.type == "cuda" else cfg.model.train_dtype)
        engine = _make_engine_with_retry(make_engine, cfg, model_path, rdtype, policy)
        if state["rollout_step"] > 0 or cfg.rollout.engine == "vllm":
            engine.update_weights(list(policy.state_dict().items()))   # full state_dict: tied lm_head too

    def run_eval(step_seed: int) -> tuple[dict[str, float], float]:
        t = time.time()
        res = evaluate(engine, eval_sets, prompt_tokens, cfg, seed=step_seed) if is_main else {}
        return res, time.time() - t

    # ---- evaluation before training (grad step 0) ----------------------------------------------
    if state["rollout_step"] == 0 and cfg.eval.at_start and is_main and not _has_point(tracker, 0):
        ev, t_ev = run_eval(_round_seed(cfg.train.seed, 0, 0, salt=99))
        tracker.record({**ev, "time/eval_s": t_ev}, rollout_step=0, grad_step=0)
        log("eval @0: " + _fmt(ev))

    total = cfg.train.rollout_steps
    bar = tqdm(total=total, initial=state["rollout_step"], desc="rollout steps", unit="step",
               disable=not (is_main and cfg.logging.progress), dynamic_ncols=True)
    wall_prev = state.get("wall_s", 0.0)
    t_loop = time.time()
    while state["rollout_step"] < total:
        r = state["rollout_step"] + 1
        t0 = time.time()
        # 1-3. sample prompts, generate G each, score, shape, dynamic sampling --------------------
        if is_main:
            batch, engine = _rollout_with_retry(
                engine, sampler, prompt_tokens, cfg, r,
                lambda: _make_engine_with_retry(make_engine, cfg, model_path, rdtype, policy), policy)
        else:
            batch = None
        batch, sampler_state = _broadcast((batch, sampler.state_dict()), world)
        if not is_main:
            sampler.load_state_dict(sampler_state)
        t_roll = time.time() - t0
        # 4. group advantages (from the shaped reward), loss mask (overlong filter) ---------------
        adv = algo.group_advantages(batch.rewards, eps=cfg.algo.adv_eps).reshape(-1)        # [N]
        # 5. old log-probs from the trainer's model (skipped when one optimizer step uses the batch:
        #    π_old is then the update's own forward, see single_step_on_policy) -------------------
        t1 = time.time()
        on_policy = single_step_on_policy(cfg, batch.num_groups)
        if on_policy:
            old_lp, ent, resp_mask = None, None, response_mask(batch)
        else:
            old_lp, ent, resp_mask = old_logprobs(policy, batch, cfg, pad_id, device, autocast)
        loss_mask = response_loss_mask(resp_mask, batch.finished, cfg.algo.overlong.filter)
        t_old = time.time() - t1
        # 6. several mini-batch updates ---------------------------------------------------------------
        t2 = time.time()
        try:
            with faults.during_update(model, optimizer, r):   # test hooks (DAPO_FAULT_*); inert otherwise
                steps = update_policy(model, optimizer, scheduler, batch, old_lp, adv, loss_mask, cfg,
                                      pad_id=pad_id, device=device, autocast=autocast, rank=rank, world=world,
                                      ref_model=ref_model, shuffle_seed=_round_seed(cfg.train.seed, r, 0, salt=7))
        except NonFiniteError as exc:   # train.nonfinite=stop: say why on the MLflow run, then stop
            if is_main:
                tracker.set_tags({"dapo.status": "failed", "dapo.error": f"rollout step {r}: {exc}"})
                tracker.finish("FAILED")
            raise
        state["grad_step"] += len(steps)
        t_train = time.time() - t2
        if kill_at == r:  # fault injection (tests): die after the update, before the checkpoint
            os.kill(os.getpid(), 9)
        # 7. weight sync into the rollout engine --------------------------------------------------------
        t3 = time.time()
        if is_main:
            engine.update_weights(list(policy.state_dict().items()))
        t_sync = time.time() - t3
        # 8. evaluation every k rollout steps ----------------------------------------------------------
        ev, t_ev = {}, 0.0
        if (cfg.eval.every and r % cfg.eval.every == 0) or r == total:
            ev, t_ev = run_eval(_round_seed(cfg.train.seed, r, 0, salt=99))
        # 9. log ---------------------------------------------------------------------------------------
        n_tok = float(resp_mask.sum())
        train_tok = n_tok + sum(len(p) for p in batch.prompt_ids)
        if not on_policy:
            metrics_old = {"train/entropy": float((ent * resp_mask).sum() / max(n_tok, 1.0)),
                           "train/token_prob_mean": float((old_lp.exp() * resp_mask).sum() / max(n_tok, 1.0))}
        else:
            metrics_old = {}   # computed inside the single update step (in `steps`)
        metrics = {**batch.stats, **ev, **_mean_dicts(steps), **metrics_old,
                   "train/grad_steps": len(steps),
                   "time/rollout_s": t_roll, "time/old_logprob_s": t_old, "time/train_s": t_train,
                   "time/sync_s": t_sync, "time/eval_s": t_ev, "time/step_s": time.time() - t0,
                   "perf/rollout_tokens_per_s": batch.stats["sampling/gen_tokens"] / max(t_roll, 1e-9),
                   "perf/train_tokens_per_s": train_tok * cfg.train.ppo_epochs / max(t_train, 1e-9)}
        state["rollout_step"] = r
        tracker.record(metrics, rollout_step=r, grad_step=state["grad_step"])
        bar.update(1)
        log(f"step {r}/{total} grad {state['grad_step']} reward {metrics['rollout/reward_mean']:+.3f} "
            f"acc {metrics['rollout/acc_mean']:.3f} ent {metrics.get('train/entropy', float('nan')):.3f} "
            f"len {metrics['rollout/response_len_mean']:.1f} kept {batch.num_groups} "
            f"rounds {batch.stats['sampling/gen_rounds']} {metrics['time/step_s']:.1f}s"
            + (" | " + _fmt(ev) if ev else ""))
        # 10. checkpoint (then flush the buffered metrics: exactly-once logging) --------------------
        if (cfg.checkpoint.every and r % cfg.checkpoint.every == 0) or r == total:
            if is_main:
                state.update(mlflow_run_id=tracker.run_uuid, pending=tracker.buffer,
                             sampler=sampler.state_dict(), wall_s=wall_prev + time.time() - t_loop)
                save_checkpoint(run_dir, r, model=policy, optimizer=optimizer, scheduler=scheduler,
                                state=state, keep_last=cfg.checkpoint.keep_last)
                faults.kill_point("KILL_AFTER_CHECKPOINT", r)   # test hook: checkpointed, not yet flushed
                tracker.flush()
                state["pending"] = []
            accelerator.wait_for_everyone()
    bar.close()

    # ---- finish --------------------------------------------------------------------------------------
    summary = {"run_dir": str(run_dir.resolve()), "rollout_steps": state["rollout_step"],
               "grad_steps": state["grad_step"], "mlflow_uri": uri, "mlflow_run_id": tracker.run_uuid,
               "wall_s": wall_prev + time.time() - t_loop, "total_s": time.time() - t_start,
               "checkpoint": str(latest_checkpoint(run_dir))}
    if is_main:
        final = _final_eval(tracker)
        summary["final_eval"] = final
        if cfg.checkpoint.save_final_model:
            policy.save_pretrained(run_dir / "final_model")
            tokenizer.save_pretrained(run_dir / "final_model")
        tracker.set_tags({"dapo.status": "finished"})
        tracker.finish()
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        log(f"done: {state['rollout_step']} rollout steps, {state['grad_step']} grad steps in "
            f"{summary['wall_s']:.0f}s | run dir {run_dir} | checkpoints {run_dir / 'checkpoints'} | "
            f"MLflow {uri} run {tracker.run_uuid}" + (" | final " + _fmt(final) if final else ""))
        if engine is not None:
            engine.close()
    return summary


# =========================================================================== helpers
def resolve_policy_path(name: str) -> Path | str:
    """``mini-base`` / ``mini-base:STEPS`` → the tiny supervised base model (built once,
    cached by recipe hash); anything else → :func:`dapo.models.resolve_model`."""
    if name == "mini-base" or name.startswith("mini-base:"):
        from dapo.base_model import build_base_model
        kw = {"steps": int(name.split(":", 1)[1])} if ":" in name else {}
        rec = build_base_model(**kw)
        return Path(rec["model_path"])
    from dapo.models import resolve_model
    return resolve_model(name, allow_hub=True)


def _cpu_has_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text() or "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _make_engine_with_retry(make_engine, cfg, model_path, rdtype, policy):
    kw = {}
    if cfg.rollout.engine == "vllm":
        kw = {"kv_cache_space_gib": cfg.rollout.vllm_kv_cache_gib,
              "gpu_memory_utilization": cfg.rollout.gpu_memory_utilization,
              "max_model_len": cfg.data.max_prompt_tokens + max(cfg.rollout.max_new_tokens,
                                                                 cfg.eval.max_new_tokens or 0)}
    return make_engine(cfg.rollout.engine, model_path, dtype=rdtype, seed=cfg.train.seed,
                       trainer_model=policy, **kw)


def _rollout_with_retry(engine, sampler, prompt_tokens, cfg, r, new_engine, policy):
    """collect_rollouts, retried ``rollout.retries`` times on an engine failure; returns (batch, engine).

    Before a retry the engine is closed and re-created by ``new_engine()`` (a dead vLLM engine
    cannot be reused) and given the current weights, and the sampler is rewound, so the step
    sees the same prompts and seeds as if nothing had failed.
    """
    snap = sampler.state_dict()
    for attempt in range(cfg.rollout.retries + 1):
        try:
            return collect_rollouts(faults.engine_for_step(engine, r), sampler, prompt_tokens, cfg, r), engine
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
            engine.update_weights(list(policy.state_dict().items()))
    raise AssertionError("unreachable")


def _broadcast(obj, world: int):
    if world == 1:
        return obj
    from accelerate.utils import broadcast_object_list
    box = [obj]
    broadcast_object_list(box, from_process=0)
    return box[0]


def _mean_dicts(ds: list[dict[str, float]]) -> dict[str, float]:
    if not ds:
        return {}
    return {k: float(np.mean([d[k] for d in ds if k in d])) for k in ds[0]}


def _has_point(tracker, rollout_step: int) -> bool:
    return any(p["rollout_step"] == rollout_step for p in tracker.buffer) or \
        rollout_step in tracker.logged_rollout_steps()


def _final_eval(tracker) -> dict[str, float]:
    for p in reversed(tracker.buffer):
        ev = {k: v for k, v in p["metrics"].items() if k.startswith("eval/")}
        if ev:
            return ev
    if not tracker.enabled:
        return {}
    run = tracker.client.get_run(tracker.run_uuid)
    return {k: v for k, v in run.data.metrics.items() if k.startswith("eval/")}


def _fmt(ev: dict[str, float]) -> str:
    return " ".join(f"{k.split('/', 1)[1]}={v:.3f}" for k, v in ev.items() if "len" not in k)


def _yaml(d: dict) -> str:
    import yaml
    return yaml.safe_dump(d, sort_keys=False)


# =========================================================================== CLI
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="dapo train",
        description="Run (or resume) one training run: rollouts, rewards, dynamic sampling, "
                    "policy updates, evaluation, MLflow logging and checkpoints.",
        epilog="Example: dapo train experiments/tiny-dapo.yaml train.rollout_steps=5 algo.clip.eps_high=0.2\n"
               "Running again with the same config resumes from the run directory's last checkpoint.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help="experiment YAML (see experiments/)")
    p.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides, e.g. algo.clip.eps_high=0.28")
    p.add_argument("--run-dir", help="run directory (default: <output_dir>/runs/<name>-<config hash>)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    a = p.parse_args(argv)
    from dapo.config import ConfigError
    try:
        cfg = load_config(a.experiment, a.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.print_config:
        print(_yaml(to_dict(cfg)))
        return 0
    train(cfg, a.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
