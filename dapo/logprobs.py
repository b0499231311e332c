"""The trainer's view of a rollout batch: packing, forwards, per-token log-probs and masks.

Every forward of the policy (old log-probs, the update, the reference model) goes through
:func:`response_logits`, which packs prompts and responses so that each response starts at
the same column. Notation as in dapo.algo: N sequences, P prompt columns, L response tokens,
V vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch.utils.checkpoint import checkpoint

from dapo import algo
from dapo.config import Config

if TYPE_CHECKING:
    from dapo.rollout import RolloutBatch

__all__ = ["pack", "response_logits", "logit_temperature", "logit_options", "token_logprobs", "token_entropy", "length_sorted",
           "micro_batches", "response_mask", "response_loss_mask", "single_step_on_policy", "old_logprobs"]


def pack(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int, device):
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

    Returns logits [n, L, V] in the model's output dtype (bf16 under autocast; a view, no copy),
    targets [n, L], resp_mask [n, L]. Read them with `token_logprobs` / `token_entropy`.
    """
    ids, att, pos, targets, resp_mask, P = pack(prompt_ids, response_ids, pad_id, device)
    L = targets.shape[1]
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        # only the L+1 last positions (P-1 .. P+L-1) need the vocabulary projection
        logits = model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False,
                       logits_to_keep=L + 1).logits
    return logits[:, :L], targets, resp_mask


def logit_temperature(cfg: Config) -> float:
    """T of π(·) = softmax(logits / T): the rollouts' sampling temperature, so that the trainer's
    log-probs are those of the distribution the responses were sampled from (verl does the same).
    Greedy rollouts (T = 0) have no such distribution; their log-probs are taken at T = 1."""
    t = cfg.rollout.temperature
    return t if t > 0 else 1.0


def logit_options(cfg: Config) -> dict[str, Any]:
    """The keyword arguments of `token_logprobs` / `token_entropy` a config asks for."""
    return {"temperature": logit_temperature(cfg), "chunk_tokens": cfg.train.logits_chunk_tokens}


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   chunk_tokens: Optional[int] = None) -> torch.Tensor:
    """log softmax(logits / T)[target]. logits: [n, L, V] (any float dtype); targets: [n, L] -> [n, L] float32.

    Computed in float32 ``chunk_tokens`` positions at a time (None: all at once), see `_by_positions`.
    """
    return _by_positions(_logprob_chunk, logits, targets, temperature=temperature, chunk_tokens=chunk_tokens)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_tokens: Optional[int] = None) -> torch.Tensor:
    """Entropy of softmax(logits / T) at each position. logits: [n, L, V] -> [n, L] float32 (chunked likewise)."""
    return _by_positions(_entropy_chunk, logits, temperature=temperature, chunk_tokens=chunk_tokens)


def _logprob_chunk(z: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    z = z.float()                                                                      # [n, c, V] float32
    return algo.logprobs_from_logits(z if temperature == 1.0 else z / temperature, ids)


def _entropy_chunk(z: torch.Tensor, temperature: float) -> torch.Tensor:
    z = z.float()                                                                      # [n, c, V] float32
    return algo.token_entropy(z if temperature == 1.0 else z / temperature)


def _by_positions(fn, logits: torch.Tensor, *extra: torch.Tensor, temperature: float,
                  chunk_tokens: Optional[int]) -> torch.Tensor:
    """fn over chunks of c = chunk_tokens // n positions: logits [n, L, V], extra [n, L] -> [n, L].

    Only one chunk's float32 copy [n, c, V] exists at a time (the logits stay in the model's dtype),
    and with autograd each chunk is checkpointed: the backward recomputes it instead of keeping a
    float32 [n, L, V] alive. Positions are independent, so the result does not depend on c.
    """
    n, L = logits.shape[0], logits.shape[1]
    c = L if chunk_tokens is None else max(1, chunk_tokens // max(n, 1))
    if c >= L:
        return fn(logits, *extra, temperature)
    grad = torch.is_grad_enabled() and logits.requires_grad
    outs = []
    for s in range(0, L, c):
        args = (logits[:, s:s + c], *(e[:, s:s + c] for e in extra))
        outs.append(checkpoint(fn, *args, temperature, use_reentrant=False) if grad else fn(*args, temperature))
    return torch.cat(outs, dim=1)


def length_sorted(idx: list[int], batch: RolloutBatch) -> list[int]:
    """``idx`` ordered by response length, then prompt length (longest first), so that each
    micro-batch pads to similar lengths. Sums over a mini-batch do not depend on the order."""
    return sorted(idx, key=lambda i: (-len(batch.response_ids[i]), -len(batch.prompt_ids[i]), i))


def micro_batches(idx: list[int], batch: RolloutBatch, cfg: Config) -> list[list[int]]:
    """Split ``idx`` (length-sorted, see `length_sorted`) into consecutive forward/backward micro-batches.

    ``train.max_tokens_per_micro_batch`` unset: ``train.micro_batch_seqs`` sequences each. Set: each
    micro-batch takes sequences while its padded size n · (longest prompt + longest response) stays
    within the budget (a sequence longer than the budget goes alone), so memory follows tokens, not
    sequence counts, and length sorting keeps the padding small.
    """
    budget = cfg.train.max_tokens_per_micro_batch
    if budget is None:
        mb = cfg.train.micro_batch_seqs
        return [idx[s:s + mb] for s in range(0, len(idx), mb)]
    out: list[list[int]] = []
    cur: list[int] = []
    P = L = 0                                  # the current micro-batch's padded prompt / response length
    for i in idx:
        p, l = len(batch.prompt_ids[i]), max(len(batch.response_ids[i]), 1)
        if cur and (len(cur) + 1) * (max(P, p) + max(L, l)) > budget:
            out.append(cur)
            cur, P, L = [], 0, 0
        cur.append(i)
        P, L = max(P, p), max(L, l)
    return out + [cur] if cur else out


def response_mask(batch: RolloutBatch) -> torch.Tensor:
    """[N, L] with 1 on each response's real tokens (L = the batch's longest response)."""
    N = len(batch.response_ids)
    L = max(max((len(r) for r in batch.response_ids), default=0), 1)
    mask = torch.zeros(N, L)
    for i, r in enumerate(batch.response_ids):
        mask[i, :len(r)] = 1.0
    return mask


def rollout_logprobs(batch: RolloutBatch) -> torch.Tensor | None:
    """[N, L] log π_rollout of each response token as the engine returned it (0 on padding), in
    :func:`response_mask`'s layout; None when the batch has none."""
    if batch.rollout_logprobs is None:
        return None
    out = torch.zeros_like(response_mask(batch))
    for i, lp in enumerate(batch.rollout_logprobs):
        out[i, :len(lp)] = torch.tensor(lp, dtype=out.dtype)
    return out


def response_loss_mask(resp_mask: torch.Tensor, finished: torch.Tensor, overlong_filter: bool) -> torch.Tensor:
    """Tokens the loss sees. resp_mask: [N, L]; finished: [N] bool (stopped on EOS).

    With overlong filtering, truncated responses (not finished) are masked out entirely.
    """
    if not overlong_filter:
        return resp_mask
    return resp_mask * algo.overlong_mask(~finished)[:, None]                            # [N, L]


def single_step_on_policy(cfg: Config, num_groups: int) -> bool:
    """True when a rollout batch feeds exactly one optimizer step (one epoch, one mini-batch):
    π_old is then the policy being differentiated, so old log-probs are the update's own
    log-probs, detached (ratio ≡ 1) and the separate no-grad forward can be skipped."""
    return cfg.train.ppo_epochs == 1 and cfg.train.mini_batch_prompts >= num_groups


@torch.no_grad()
def old_logprobs(model, batch: RolloutBatch, cfg: Config, pad_id: int, device, autocast: bool,
                 rank: int = 0, world: int = 1):
    """π_old log-probs and entropy of every response token, at the rollout temperature.

    Returns logp [N, L], entropy [N, L], resp_mask [N, L] (padded to the batch's max L), the same
    on every rank. With ``world`` > 1 each rank computes every ``world``-th sequence (of the
    length-sorted order) and the rows are all-gathered; a rank with fewer micro-batches than the
    busiest runs extra passes (results dropped), as a sharded model's forwards are collectives.
    """
    from dapo.distributed import all_gather_object, pad_to_busiest
    N = len(batch.response_ids)
    L = max(max((len(r) for r in batch.response_ids), default=0), 1)
    logp = torch.zeros(N, L)
    ent = torch.zeros(N, L)
    mask = torch.zeros(N, L)
    opts = logit_options(cfg)
    was_training = model.training
    model.eval()
    micro = micro_batches(length_sorted(list(range(N)), batch)[rank::world], batch, cfg)
    real = pad_to_busiest(micro, [0], world) if N else 0           # extra passes: results dropped
    rows = []
    for k, idx in enumerate(micro):
        logits, tgt, m = response_logits(model, [batch.prompt_ids[i] for i in idx],
                                         [batch.response_ids[i] for i in idx], pad_id, device, autocast)
        if k < real:
            rows.append((idx, token_logprobs(logits, tgt, **opts).cpu(), token_entropy(logits, **opts).cpu(),
                         m.cpu()))
    model.train(was_training)
    for part in all_gather_object(rows, world):
        for idx, lp, en, m in part:
            l = lp.shape[1]
            logp[idx, :l], ent[idx, :l], mask[idx, :l] = lp, en, m
    return logp, ent, mask
