"""The policy update: μ optimizer steps over one rollout batch (step 6 of the loop, docs/METRICS.md).

:class:`Policy` holds what the update needs (model, optimizer, scheduler, precision,
rank/world); :func:`update_policy` splits the batch into mini-batches (one optimizer step
each) and micro-batches (gradient accumulation), and returns one :class:`StepStats` per
optimizer step. Notation as in dapo.algo: N sequences, L response tokens, G responses per group.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import numpy as np
import torch

from dapo import algo, hardware
from dapo.config import Config
from dapo.dist.distributed import clip_grad_norm
from dapo.train.logprobs import FILLER, filler_forward, logit_options, rank_micro_batches, response_forward

__all__ = ["Policy", "build_policy", "update_policy", "StepStats", "NonFiniteError", "mean_metrics",
           "old_policy_metrics", "bf16_autocast"]


class NonFiniteError(RuntimeError):
    """A NaN/inf loss or gradient with ``train.nonfinite = stop``."""


@dataclass
class Policy:
    """The trained model and everything an update step needs besides the batch."""
    model: Any                        # what forwards and backward go through (FSDP2-sharded when world > 1)
    optimizer: Any
    scheduler: Any
    device: torch.device
    autocast: bool = False            # bf16 autocast of the forwards
    pad_id: int = 0
    rank: int = 0
    world: int = 1
    ref_model: Any = None             # frozen π_ref (only with algo.kl.coef > 0)
    module: Any = None                # the unwrapped model: state_dict, checkpoints, engine (default: model)

    def __post_init__(self):
        if self.module is None:
            self.module = self.model


def bf16_autocast(cfg: Config, device: torch.device) -> bool:
    """``model.autocast_bf16`` where the hardware has bf16 (CUDA, or a CPU with AVX512-BF16/AMX)."""
    if not cfg.model.autocast_bf16:
        return False
    if device.type == "cuda":
        return True
    return hardware.has_bf16()


def build_policy(cfg: Config, model_path, dist_info, pad_id: int) -> Policy:
    """Load the model (and π_ref with a KL term), AdamW with linear warm-up.

    One process (``dist_info.world == 1``): the plain model. Several: FSDP2-sharded over all
    ranks (`dapo.dist.distributed.load_sharded_causal_lm`: fp32 master shards, bf16 compute and fp32
    gradient reduce when autocast is on, no full copy beyond rank 0's host-memory load); π_ref too.
    """
    from dapo.dist.distributed import load_sharded_causal_lm
    from dapo.models import load_model
    device, sharded = dist_info.device, dist_info.world > 1
    autocast = bf16_autocast(cfg, device)

    def load(checkpointing: bool):
        if sharded:
            return load_sharded_causal_lm(model_path, dtype=cfg.model.train_dtype, dist_info=dist_info,
                                          bf16=autocast, gradient_checkpointing=checkpointing)
        m = load_model(model_path, dtype=cfg.model.train_dtype).to(device)
        if checkpointing:
            m.gradient_checkpointing_enable()
        return m

    model = load(cfg.model.gradient_checkpointing)
    model.train()
    ref_model = None
    if cfg.algo.kl.coef > 0:
        ref_model = load(False).eval()
        ref_model.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, betas=cfg.train.betas,
                                  weight_decay=cfg.train.weight_decay)
    warm = cfg.train.warmup_grad_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    return Policy(model, optimizer, scheduler, device, autocast=autocast, pad_id=pad_id,
                  rank=dist_info.rank, world=dist_info.world, ref_model=ref_model)


# =========================================================================== metrics
def _stat(reduce: Optional[str] = None, per: Optional[str] = None, optional: bool = False):
    """A StepStats field. reduce: None (one value per step), "sum" (summed over micro-batches and
    ranks), "mean" (a weighted sum over micro-batches and ranks divided by the summed weight
    ``per``) or "max" (the largest over micro-batches and ranks; over the optimizer steps of a rollout
    step too, :func:`mean_metrics`). ``optional``: absent (None) unless some micro-batch computed it."""
    return field(default=None, metadata={"reduce": reduce, "per": per, "optional": optional})


@dataclass(frozen=True)
class StepStats:
    """The metrics of one optimizer step, logged as ``train/<field>``. This field list is the
    only list of update metric names: the cross-rank sums and the logged dict derive from it."""
    loss: float = _stat("sum")                             # the step's loss (sum of its micro-batch losses)
    grad_norm: float = _stat()                             # global gradient norm before clipping
    lr: float = _stat()                                    # the learning rate this optimizer step used
    clip_frac_high: float = _stat("mean", "tokens")        # tokens clipped at 1 + ε_high (A > 0)
    clip_frac_low: float = _stat("mean", "tokens")         # tokens clipped at 1 − ε_low (A < 0)
    approx_kl: float = _stat("mean", "tokens")             # k3 estimate of KL(π_old ‖ π_θ)
    ratio_mean: float = _stat("mean", "tokens")
    ratio_max: float = _stat("max")                        # largest π_θ/π_old over the loss tokens (0: none)
    up_clipped_prob_mean: float = _stat("mean", "up_clipped_count")   # π_θ of the tokens clipped high
    skipped_step: float = _stat()                          # 1: non-finite loss/gradient, step skipped
    kl: Optional[float] = _stat("mean", "tokens", optional=True)     # KL(π_θ ‖ π_ref), with algo.kl.coef > 0
    entropy: Optional[float] = _stat("mean", "resp_tokens", optional=True)          # only when the update
    token_prob_mean: Optional[float] = _stat("mean", "resp_tokens", optional=True)  # is π_old (single step)
    # the policy-loss variants' own (algo.policy_loss; dapo.algo.VARIANT_METRICS), only with that variant
    seq_clip_frac: Optional[float] = _stat("mean", "tokens", optional=True)     # gspo: sequence ratio clipped
    weight_clip_frac: Optional[float] = _stat("mean", "tokens", optional=True)  # cispo: importance weight clipped
    cov_selected_frac: Optional[float] = _stat("mean", "tokens", optional=True)  # clip_cov / kl_cov: tokens selected
    dual_clip_frac: Optional[float] = _stat("mean", "tokens", optional=True)   # algo.clip.dual_clip_c set: Â < 0 capped
    entropy_kept_frac: Optional[float] = _stat(optional=True)   # algo.top_entropy_quantile < 1: loss tokens kept

    @staticmethod
    def metric(name: str) -> str:
        """The logged name of field ``name``."""
        if name not in _FIELDS:
            raise KeyError(f"{name!r} is not a StepStats field")
        return f"train/{name}"

    def metrics(self) -> dict[str, float]:
        """{"train/<field>": value} for every field that was computed."""
        return {self.metric(f): getattr(self, f) for f in _FIELDS if getattr(self, f) is not None}

    @classmethod
    def from_sums(cls, sums: dict[str, float], **values: float) -> "StepStats":
        """Reduce the summed micro-batch totals (keys: :data:`SUM_KEYS`) + per-step ``values``."""
        out = dict(values)
        for f in fields(cls):
            reduce, per = f.metadata["reduce"], f.metadata["per"]
            if reduce in ("sum", "max"):
                out[f.name] = sums.get(f.name, 0.0)
            elif reduce == "mean" and (not f.metadata["optional"] or f.name in sums):
                out[f.name] = sums.get(f.name, 0.0) / max(sums.get(per, 0.0), 1.0)
        return cls(**out)


_FIELDS = tuple(f.name for f in fields(StepStats))
# what micro-batches add up (and ranks all-reduce): the summed/averaged fields and the weights
SUM_KEYS = tuple(sorted({f.name for f in fields(StepStats) if f.metadata["reduce"] in ("sum", "mean")}
                        | {f.metadata["per"] for f in fields(StepStats) if f.metadata["per"]}))
# what micro-batches and ranks reduce by their maximum
MAX_KEYS = tuple(sorted(f.name for f in fields(StepStats) if f.metadata["reduce"] == "max"))


def mean_metrics(steps: list[StepStats]) -> dict[str, float]:
    """Each metric over the optimizer steps of one rollout step: the mean, or for a "max" field
    (``ratio_max``) the largest."""
    ds = [s.metrics() for s in steps]
    if not ds:
        return {}
    top = {StepStats.metric(k) for k in MAX_KEYS}
    return {k: float((np.max if k in top else np.mean)([d[k] for d in ds if k in d])) for k in ds[0]}


def old_policy_metrics(old_logp: torch.Tensor, entropy: torch.Tensor, resp_mask: torch.Tensor,
                       world: int = 1) -> dict[str, float]:
    """Entropy and mean token probability of π_old over the response tokens (all [N, L]). ``world`` > 1:
    ``entropy`` holds each rank's own rows only (`dapo.train.logprobs.old_logprobs`, ``entropy="local"``), and
    their sums are added over the ranks (a collective)."""
    from dapo.dist.distributed import all_reduce_sum
    n_tok = float(resp_mask.sum())
    total = (entropy * resp_mask).sum()
    if world > 1:
        total = torch.tensor(all_reduce_sum({"entropy": float(total)}, world)["entropy"])
    return {StepStats.metric("entropy"): float(total / max(n_tok, 1.0)),
            StepStats.metric("token_prob_mean"): float((old_logp.exp() * resp_mask).sum() / max(n_tok, 1.0))}


# =========================================================================== the update
def update_policy(policy: Policy, batch, old_logp: torch.Tensor | None, advantages: torch.Tensor,
                  loss_mask: torch.Tensor, cfg: Config, shuffle_seed: int = 0,
                  own_logp: torch.Tensor | None = None,
                  token_weight: torch.Tensor | None = None) -> list[StepStats]:
    """Several optimizer steps over one rollout batch; returns one StepStats per step.

    old_logp, loss_mask: [N, L]; advantages: [N]. Groups are split into mini-batches of
    ``mini_batch_prompts`` groups (``ppo_epochs`` passes, shuffled by ``shuffle_seed``);
    inside a mini-batch this rank takes its share, balanced by tokens (`dapo.train.logprobs.rank_micro_batches`),
    and accumulates over micro-batches. The loss of each micro-batch is divided by the token (or sequence: those
    with ≥ 1 loss token, so overlong-filtered ones do not count) count of the whole
    mini-batch across ranks, so the summed gradient does not depend
    on how the step is split; DDP's averaging is undone by scaling with ``world``.

    ``old_logp=None`` (only when `single_step_on_policy`): π_old is the current policy, so the
    update's own log-probs, detached, stand in for it; each step's stats then also carry
    ``entropy`` and ``token_prob_mean`` over the response tokens. ``own_logp`` ([N, L], zeros; only with
    ``old_logp=None``): this rank's rows of that forward are written into it (the others stay 0), so
    the caller can compare π_old with π_rollout after the update (`dapo.train.loop`, mismatch metrics).
    ``token_weight`` ([N, L] or None): a rollout correction's weights, multiplying each token's loss
    (`dapo.algo.corrections.apply`).
    """
    G, Bk, mbp = cfg.rollout.n, batch.num_groups, cfg.train.mini_batch_prompts
    gen = torch.Generator().manual_seed(shuffle_seed)
    pick = torch.Generator().manual_seed(shuffle_seed + 1) if cfg.algo.policy_loss == "clip_cov" else None  # its draws
    out = []
    for _epoch in range(cfg.train.ppo_epochs):
        order = torch.randperm(Bk, generator=gen).tolist()
        for s in range(0, Bk, mbp):
            seqs = [b * G + g for b in order[s:s + mbp] for g in range(G)]            # global indices
            out.append(_optimizer_step(policy, batch, seqs, old_logp, advantages, loss_mask, cfg, pick, own_logp,
                                       token_weight))
    return out


def loss_options(cfg: Config, generator: Optional[torch.Generator] = None) -> dict[str, Any]:
    """``algo.policy_loss`` and its own keys, as keyword arguments of :func:`dapo.algo.policy_loss`."""
    kind = cfg.algo.policy_loss
    options = {} if kind == "ppo_clip" else dataclasses.asdict(getattr(cfg.algo, kind))
    if kind == "clip_cov":
        options["generator"] = generator
    return {"kind": kind, "options": options}


def group_counts(loss_mask: torch.Tensor, seqs: list[int], G: int) -> dict[str, Any]:
    """``group_token_mean``'s counts over a mini-batch of whole groups (``seqs``, global indices of
    groups of G consecutive rows): T_g of every row's group, [N], and K, the groups with a loss token."""
    per_group = loss_mask.sum(-1).reshape(-1, G).sum(-1)                              # [B]
    mine = sorted({i // G for i in seqs})
    return {"group_tokens": per_group.repeat_interleave(G),
            "num_groups": float((per_group[mine] > 0).sum().item())}


def _optimizer_step(p: Policy, batch, seqs: list[int], old_logp, advantages, loss_mask, cfg: Config,
                    pick: Optional[torch.Generator] = None, own_logp: Optional[torch.Tensor] = None,
                    token_weight: Optional[torch.Tensor] = None) -> StepStats:
    """One mini-batch (sequences ``seqs``, all ranks together) → gradient accumulation → clip → AdamW."""
    num_tokens = float(loss_mask[seqs].sum().item())                                   # whole mini-batch
    num_seqs = float((loss_mask[seqs].sum(-1) > 0).sum().item())                      # filtered rows excluded
    groups = group_counts(loss_mask, seqs, cfg.rollout.n) if cfg.algo.loss_agg == "group_token_mean" else None
    p.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = defaultdict(float)
    for idx in rank_micro_batches(seqs, batch, cfg, p.world)[p.rank]:   # as many passes on every rank
        if idx == FILLER:
            _filler_step(p)
            continue
        totals = _micro_step(p, batch, idx, old_logp, advantages, loss_mask, cfg, num_tokens, num_seqs,
                             groups=groups, pick=pick, own_logp=own_logp, token_weight=token_weight)
        for k, v in totals.items():
            sums[k] = max(sums[k], v) if k in MAX_KEYS else sums[k] + v
    sums = _all_reduce_totals(dict(sums), p.world)
    grad_norm = clip_grad_norm(p.model.parameters(), cfg.train.grad_clip)   # global: over all shards and ranks
    finite = math.isfinite(float(grad_norm)) and math.isfinite(sums.get("loss", 0.0))
    if finite:
        p.optimizer.step()
    elif cfg.train.nonfinite == "stop":
        raise NonFiniteError(f"non-finite loss {sums.get('loss')} / grad norm {float(grad_norm)}; "
                             f"train.nonfinite=stop (skip would drop such gradient steps); "
                             f"the last checkpoint is untouched")
    p.optimizer.zero_grad(set_to_none=True)   # freed now: generation and the next old-log-prob pass need no gradients
    lr = float(p.optimizer.param_groups[0]["lr"])                  # the rate this step used, before scheduling the next
    p.scheduler.step()
    return StepStats.from_sums(sums, grad_norm=float(grad_norm), lr=lr,
                               skipped_step=0.0 if finite else 1.0)


def _filler_step(p: Policy) -> None:
    """A rank with no sequences left for this pass: a one-token forward (and π_ref's) + a zero
    backward, so that sharded ranks run the same collectives; adds nothing to gradients or sums."""
    logits = filler_forward(p.model, p.pad_id, p.device, p.autocast)
    if p.ref_model is not None:
        with torch.no_grad():
            filler_forward(p.ref_model, p.pad_id, p.device, p.autocast)
    (logits.float().sum() * 0.0).backward()


def _micro_step(p: Policy, batch, idx: list[int], old_logp, advantages, loss_mask, cfg: Config,
                num_tokens: float, num_seqs: float, groups: Optional[dict] = None,
                pick: Optional[torch.Generator] = None, own_logp: Optional[torch.Tensor] = None,
                token_weight: Optional[torch.Tensor] = None) -> dict[str, float]:
    """Forward + backward of sequences ``idx``; returns their totals (keys in SUM_KEYS, MAX_KEYS).
    ``groups``: :func:`group_counts` of the mini-batch (``group_token_mean``); ``pick``: Clip-Cov's draws;
    ``own_logp``: with ``old_logp=None``, receives this forward's log-probs in rows ``idx`` (:func:`update_policy`)."""
    prompts, responses = [batch.prompt_ids[i] for i in idx], [batch.response_ids[i] for i in idx]
    opts = logit_options(cfg)                  # π = softmax(z / rollout.temperature), chunked over positions
    fw = response_forward(p.model, prompts, responses, p.pad_id, p.device, p.autocast, packed=cfg.train.packed)
    rmask = fw.resp_mask
    l = rmask.shape[1]
    logp = fw.logprobs(**opts)                                                         # [n, l]
    m = loss_mask[idx, :l].to(p.device)                                                # [n, l]
    old = logp.detach() if old_logp is None else old_logp[idx, :l].to(p.device)      # [n, l]
    if old_logp is None and own_logp is not None:
        own_logp[idx, :l] = old.float().cpu() * rmask.cpu()
    agg, counts = cfg.algo.loss_agg, dict(num_tokens=num_tokens, num_seqs=num_seqs,   # whole mini-batch
                                          norm_const=cfg.rollout.max_new_tokens)   # C of seq_mean_token_sum_const
    if groups is not None:                                                             # group_token_mean: T_g, K
        counts.update(group_tokens=groups["group_tokens"][idx].to(p.device), num_groups=groups["num_groups"])
    adv = advantages[idx].to(p.device)                                                # [n] or [n, L]
    adv = adv[:, :l] if adv.dim() == 2 else adv
    w = None if token_weight is None else token_weight[idx, :l].to(p.device)          # [n, l] a correction's w
    loss, met = algo.policy_loss(logp, old, adv, m, eps_low=cfg.algo.clip.eps_low,
                                 eps_high=cfg.algo.clip.eps_high, dual_clip_c=cfg.algo.clip.dual_clip_c,
                                 agg=agg, **counts, **loss_options(cfg, pick), token_weight=w)
    if cfg.algo.clip.dual_clip_c is None:
        met.pop("dual_clip_frac", None)        # logged only when the dual clip is on
    if cfg.algo.kl.coef > 0 and p.ref_model is not None:
        with torch.no_grad():
            ref_logp = response_forward(p.ref_model, prompts, responses, p.pad_id, p.device, p.autocast,
                                        packed=cfg.train.packed).logprobs(**opts)
        kl_term = algo.aggregate(algo.kl_penalty(logp, ref_logp, kind=cfg.algo.kl.estimator), m, agg, **counts)
        loss = loss + cfg.algo.kl.coef * kl_term
        met["kl"] = float(kl_term.detach()) * num_tokens / max(float(m.sum()), 1.0)
    if cfg.algo.entropy_coef > 0:
        loss = loss - cfg.algo.entropy_coef * algo.aggregate(fw.entropy(**opts), m, agg, **counts)
    (loss * p.world).backward()   # × world: FSDP/DDP average the gradient over ranks
    out = _totals(met, float(loss.detach()), float(m.sum()))
    if old_logp is None:   # on-policy single step: π_old = this very forward; its entropy and probability
        with torch.no_grad():
            rm = rmask.to(logp.dtype)
            out.update(entropy=float((fw.entropy(**opts) * rm).sum()),
                       token_prob_mean=float((logp.detach().exp() * rm).sum()), resp_tokens=float(rm.sum()))
    return out


def _totals(met: dict[str, float], loss: float, w: float) -> dict[str, float]:
    """One micro-batch's contribution to the step's totals: each "mean" StepStats field times its weight
    (w = loss tokens, or the clipped-token count); each "max" field as it is."""
    out = {"loss": loss, "tokens": w, "up_clipped_count": met["up_clipped_count"]}
    for f in fields(StepStats):
        per = f.metadata["per"]
        if per in ("tokens", "up_clipped_count") and f.name in met:
            out[f.name] = met[f.name] * (w if per == "tokens" else met[per])
        elif f.metadata["reduce"] == "max" and f.name in met:
            out[f.name] = met[f.name]
    return out


def _all_reduce_totals(d: dict[str, float], world: int) -> dict[str, float]:
    """Reduce the totals over ranks: SUM_KEYS summed, MAX_KEYS by their maximum (a key any rank has is kept)."""
    if world == 1:
        return d
    import torch.distributed as dist
    out = {}
    for keys, op in ((SUM_KEYS, dist.ReduceOp.SUM), (MAX_KEYS, dist.ReduceOp.MAX)):
        t = torch.tensor([d.get(k, 0.0) for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        out.update({k: float(v) for k, v in zip(keys, t.tolist()) if k in d or float(v) != 0.0})
    return out
