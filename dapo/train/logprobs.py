"""The trainer's view of a rollout batch: packing, forwards, per-token log-probs and masks.

Every forward of the policy (old log-probs, the update, the reference model) goes through
:func:`response_forward`, in one of two layouts:

- padded (:func:`pack`, :func:`response_logits`): one row per sequence, prompts left-padded and
  responses right-padded so that each response starts at the same column;
- packed (``train.packed``, :func:`pack_flat`): the sequences concatenated without padding
  between them, position ids restarting at 0 per sequence and no attention mask. transformers
  (5.x, ``masking_utils.find_packed_sequence_indices``) reads the restarts as sequence boundaries
  and keeps attention causal within each sequence: a block-diagonal causal mask for
  sdpa/eager/flex (built row by row, so rows as long as the longest sequence keep the dense
  kernels' masked-out work no larger than padded rows'), ``cu_seqlens`` for flash-attention's
  varlen kernels (one row: that path reads packed position ids only for a batch of one). Only the
  columns that predict a response token go through the vocabulary projection.

Either way the per-token results come back in the padded [n, L] layout (:class:`ResponseLogits`),
so the loss code sees one layout. Micro-batches and their assignment to ranks:
:func:`rank_micro_batches`. Notation as in dapo.algo: N sequences, P prompt columns, L response
tokens, V vocabulary.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch.utils.checkpoint import checkpoint

from dapo import algo
from dapo.config import Config, default_chunk_rows

if TYPE_CHECKING:
    from dapo.train.rollout import RolloutBatch

__all__ = ["pack", "pack_flat", "ffd_rows", "layer_costs", "packed_row_len", "ROW_CAP_FACTORS", "response_logits", "ResponseLogits", "response_forward", "ROWWISE_ATTENTION", "filler_forward",
           "logit_temperature", "logit_options", "token_logprobs", "token_entropy", "length_sorted", "micro_cost",
           "micro_batches", "balance_by_tokens", "rank_micro_batches", "FILLER", "response_mask",
           "response_loss_mask", "single_step_on_policy", "old_logprobs", "ENTROPY_MODES"]


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


def ffd_rows(lens: list[int], cap: int) -> list[list[int]]:
    """First-fit decreasing: the indices of sequences of ``lens`` tokens per row, each row holding at
    most max(cap, longest) tokens; longest first (ties: lower index), each into the first row it fits."""
    cap = max([cap, *lens])
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(lens)), key=lambda i: (-lens[i], i)):
        k = next((k for k, f in enumerate(fill) if f + lens[i] <= cap), len(rows))
        if k == len(rows):
            rows.append([])
            fill.append(0)
        rows[k].append(i)
        fill[k] += lens[i]
    return rows


#: Row caps tried by :func:`packed_row_len`, in multiples of the longest sequence.
ROW_CAP_FACTORS = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)


def layer_costs(config) -> Optional[tuple[float, float]]:
    """(a, b): forward FLOPs of one decoder layer per row token, a = 2 · its matmul parameters, and per
    token pair of a row, b = 4 · heads · head_dim (QKᵀ and AV of a dense kernel, which computes the
    masked-out pairs too). None where the config lacks the sizes (then rows stay at the longest sequence)."""
    try:
        h, i, heads = int(config.hidden_size), int(config.intermediate_size), int(config.num_attention_heads)
        kv = int(getattr(config, "num_key_value_heads", None) or heads)
        hd = int(getattr(config, "head_dim", None) or h // heads)
    except (AttributeError, TypeError, ValueError):
        return None
    return 2.0 * (2 * h * heads * hd + 2 * h * kv * hd + 3 * h * i), 4.0 * heads * hd


def packed_row_len(prompt_lens: list[int], response_lens: list[int], costs: Optional[tuple[float, float]]) -> int:
    """The row cap for a row-wise attention kernel: c · the longest sequence, c from
    :data:`ROW_CAP_FACTORS`, the one whose rows (:func:`ffd_rows`, R rows of width W) cost least,
    R · W · (a + b · W) with (a, b) = :func:`layer_costs`, among those whose attention work R · W² stays
    within the padded layout's, n · (longest prompt + longest response)². Wider rows leave less padding
    (a row filled by one long sequence cannot take another) but cost more attention per token; with
    small models and short sequences padding dominates, with long sequences attention does, and c = 1."""
    lens = [p + r for p, r in zip(prompt_lens, response_lens)]
    longest = max(lens, default=1)
    if costs is None or not lens:
        return longest
    a, b = costs
    padded_pairs = len(lens) * (max(prompt_lens) + max(max(response_lens), 1)) ** 2
    best = (float("inf"), longest)
    for c in ROW_CAP_FACTORS:
        cap = int(c * longest)
        rows = ffd_rows(lens, cap)
        W = max(sum(lens[i] for i in row) for row in rows)
        if c > 1 and len(rows) * W * W > padded_pairs:
            continue
        best = min(best, (len(rows) * W * (a + b * W), cap))
    return best[1]


def pack_flat(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int, device,
              row_len: Optional[int] = None):
    """Concatenate the n sequences (prompt + response, no padding between them) into rows.

    ``row_len`` None: one row. Else rows of at most max(row_len, longest sequence) tokens, filled
    first-fit in decreasing length, each right-padded to the longest row (``pad_id``, positions
    continuing: causal attention keeps every real token from seeing them).
    Returns input_ids [R, W], position_ids [R, W] (0, 1, ... restarting at each sequence),
    keep [U] (the columns whose logits are computed: every column that predicts a response token
    in some row), targets [R, U], where = (r, u, i, j) [K] each: position (r, u) of [R, U] holds
    response token j of sequence i (the padded [n, L] layout), resp_mask [n, L].
    K = Σ max(r_i, 1): a sequence with an empty response keeps the position after its prompt
    (target ``pad_id``, masked), as column 0 of the padded layout.
    """
    n = len(prompt_ids)
    L = max(max((len(r) for r in response_ids), default=0), 1)
    lens = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    if not all(prompt_ids):
        i = next(i for i, p in enumerate(prompt_ids) if not p)
        raise ValueError(f"pack_flat: sequence {i} has an empty prompt (a packed response needs the token before it)")
    rows = ffd_rows(lens, sum(lens) if row_len is None else row_len)   # sequence indices per row
    W = max((sum(lens[i] for i in row) for row in rows), default=1)
    ids = torch.full((len(rows), W), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), W), dtype=torch.long)
    need: list[tuple[int, int, int, int, int]] = []             # (r, column, i, j, target)
    for r, row in enumerate(rows):
        o = 0
        for i in sorted(row):
            p, resp = prompt_ids[i], response_ids[i]
            ids[r, o:o + lens[i]] = torch.tensor(list(p) + list(resp), dtype=torch.long)
            pos[r, o:o + lens[i]] = torch.arange(lens[i])
            need += [(r, o + len(p) - 1 + j, i, j, resp[j] if resp else pad_id) for j in range(max(len(resp), 1))]
            o += lens[i]
        pos[r, o:] = lens[sorted(row)[-1]] + torch.arange(W - o)        # continuing the row's last sequence
    keep = sorted({c for _, c, *_ in need})
    u_of = {c: u for u, c in enumerate(keep)}
    targets = torch.full((len(rows), len(keep)), pad_id, dtype=torch.long)
    r_, u_, i_, j_ = ([x[0] for x in need], [u_of[x[1]] for x in need], [x[2] for x in need], [x[3] for x in need])
    targets[r_, u_] = torch.tensor([x[4] for x in need], dtype=torch.long)
    resp_mask = torch.zeros(n, L)
    for i, resp in enumerate(response_ids):
        resp_mask[i, :len(resp)] = 1.0

    def t(x):
        return torch.as_tensor(x, dtype=torch.long).to(device)
    return (ids.to(device), pos.to(device), t(keep), targets.to(device), (t(r_), t(u_), t(i_), t(j_)),
            resp_mask.to(device))


@dataclass(frozen=True)
class ResponseLogits:
    """One forward's logits at the positions that predict response tokens.

    Padded: logits [n, L, V], targets [n, L]. Packed: logits [R, U, V], targets [R, U] and ``where``
    (see :func:`pack_flat`). resp_mask [n, L] either way. :meth:`logprobs` / :meth:`entropy` return
    [n, L] float32 in both (0 where no position was computed, i.e. the padded layout's padding).
    """
    logits: torch.Tensor
    targets: torch.Tensor
    resp_mask: torch.Tensor
    where: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def layout(self, x: torch.Tensor) -> torch.Tensor:
        """Per-position values ([n, L] padded, [R, U] packed) -> [n, L] (differentiable)."""
        if self.where is None:
            return x
        r, u, i, j = self.where
        return x.new_zeros(self.resp_mask.shape).index_put((i, j), x[r, u])

    def logprobs(self, temperature: float = 1.0, chunk_tokens: Optional[int] = None) -> torch.Tensor:
        """log π(target) at each response position: [n, L] float32 (see `token_logprobs`)."""
        return self.layout(token_logprobs(self.logits, self.targets, temperature, chunk_tokens))

    def entropy(self, temperature: float = 1.0, chunk_tokens: Optional[int] = None) -> torch.Tensor:
        """Entropy of π at each response position: [n, L] float32 (see `token_entropy`)."""
        return self.layout(token_entropy(self.logits, temperature, chunk_tokens))


#: Attention implementations whose masks transformers builds from packed position ids row by row
#: (masking_utils): a packed micro-batch may use several rows. Any other (flash-attention's varlen
#: path reads packed position ids only for a batch of one row) gets one row.
ROWWISE_ATTENTION = ("sdpa", "eager", "flex_attention")


def response_forward(model, prompt_ids, response_ids, pad_id, device, autocast: bool,
                     packed: bool = False, one_row: Optional[bool] = None) -> ResponseLogits:
    """The forward of n sequences in the padded (:func:`response_logits`) or packed (:func:`pack_flat`) layout.

    Packed: ``attention_mask=None`` and position ids that restart per sequence, which is
    transformers' packed-sequence input (block-causal attention per sequence, see the module doc).
    ``one_row`` None: one row unless the model's attention is in :data:`ROWWISE_ATTENTION`; then
    rows capped by :func:`packed_row_len` (the longest sequence, or a few times it where that leaves
    less padding for less cost), so the attention does no more work than padded rows (a dense kernel
    computes the masked-out scores too: one long row would cost T² instead of Σ rows · W²).
    ``logits_to_keep`` is the tensor of the columns that predict response tokens.
    """
    if not packed:
        return ResponseLogits(*response_logits(model, prompt_ids, response_ids, pad_id, device, autocast))
    config = getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)  # DDP: .module
    if one_row is None:
        one_row = getattr(config, "_attn_implementation", None) not in ROWWISE_ATTENTION
    row_len = None if one_row else packed_row_len([len(p) for p in prompt_ids], [len(r) for r in response_ids],
                                                  layer_costs(config))
    ids, pos, keep, targets, where, resp_mask = pack_flat(prompt_ids, response_ids, pad_id, device, row_len=row_len)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False,
                       logits_to_keep=keep).logits                                    # [R, U, V]
    return ResponseLogits(logits, targets, resp_mask, where)


def filler_forward(model, pad_id: int, device, autocast: bool) -> torch.Tensor:
    """A one-token forward (input ``[[pad_id]]``): the pass a rank with no sequences left runs so
    that a sharded model's collectives stay in step with the other ranks. Returns logits [1, 1, V]."""
    ids = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(input_ids=ids, use_cache=False).logits


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

    Computed in float32 ``chunk_tokens`` tokens at a time (None: ~16 MiB of float32, see
    `dapo.config.default_chunk_rows`), see `_by_positions`.
    """
    return _by_positions(_logprob_chunk, logits, targets, temperature=temperature, chunk_tokens=chunk_tokens)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_tokens: Optional[int] = None) -> torch.Tensor:
    """Entropy of softmax(logits / T) at each position. logits: [n, L, V] -> [n, L] float32 (chunked likewise)."""
    return _by_positions(_entropy_chunk, logits, temperature=temperature, chunk_tokens=chunk_tokens)


def _logprob_chunk(z: torch.Tensor, ids: torch.Tensor, temperature: float, rows: Optional[int]) -> torch.Tensor:
    z = z.float()                                                                      # [n, c, V] float32
    return algo.logprobs_from_logits(z if temperature == 1.0 else z / temperature, ids, chunk_size=rows)


def _entropy_chunk(z: torch.Tensor, temperature: float, rows: Optional[int]) -> torch.Tensor:
    z = z.float()                                                                      # [n, c, V] float32
    return algo.token_entropy(z if temperature == 1.0 else z / temperature, chunk_size=rows)


def _by_positions(fn, logits: torch.Tensor, *extra: torch.Tensor, temperature: float,
                  chunk_tokens: Optional[int]) -> torch.Tensor:
    """fn over chunks of c = chunk_tokens // n positions: logits [n, L, V], extra [n, L] -> [n, L].

    One level of chunks: the chunks are these positions and each is computed whole (dapo.algo's row
    chunks off: nested checkpointed chunks recomputed every chunk twice and zero-filled a float32
    gradient of the outer chunk for each inner one, issue 38); ``chunk_tokens`` None is
    `dapo.config.default_chunk_rows` tokens (~16 MiB of float32; at least one position of all n rows).
    Only one chunk's float32 copy [n, c, V] exists at a time (the logits stay in the model's dtype:
    handing all of them to dapo.algo made one float32 copy of the whole [n, L, V] first, which bf16
    logits then held beside themselves), and with autograd each chunk is checkpointed: the
    backward recomputes it instead of keeping a float32 [n, c, V] alive. The chunks are
    ``torch.split`` views, whose backward concatenates their gradients once (a slice's backward
    zero-fills the whole [n, L, V] per chunk). Positions are independent, so the result does not depend on c.
    """
    n, L = logits.shape[0], logits.shape[1]
    if chunk_tokens is None:   # dapo.algo's row chunk (~16 MiB of float32), never a float32 copy of all logits
        chunk_tokens = default_chunk_rows(logits.shape[-1])
    c = max(1, chunk_tokens // max(n, 1))
    grad = torch.is_grad_enabled() and logits.requires_grad
    outs = []
    for z, *e in zip(torch.split(logits, c, dim=1), *(torch.split(x, c, dim=1) for x in extra)):
        rows = max(1, z.shape[0] * z.shape[1])                                         # the whole chunk at once
        outs.append(checkpoint(fn, z, *e, temperature, rows, use_reentrant=False) if grad
                    else fn(z, *e, temperature, rows))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def length_sorted(idx: list[int], batch: RolloutBatch, packed: bool = False) -> list[int]:
    """``idx`` ordered by response length, then prompt length (longest first), so that each
    micro-batch pads to similar lengths; ``packed``: by whole length (prompt + response), what a packed
    row holds. Sums over a mini-batch do not depend on the order."""
    if packed:
        return sorted(idx, key=lambda i: (-len(batch.prompt_ids[i]) - len(batch.response_ids[i]), i))
    return sorted(idx, key=lambda i: (-len(batch.response_ids[i]), -len(batch.prompt_ids[i]), i))


def micro_cost(idx: list[int], batch: RolloutBatch, packed: bool = False) -> int:
    """Tokens one forward of sequences ``idx`` processes: packed Σ (prompt + response); padded
    n · (longest prompt + longest response, at least 1)."""
    if not idx:
        return 0
    if packed:
        return sum(len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in idx)
    return len(idx) * (max(len(batch.prompt_ids[i]) for i in idx) + max(max(len(batch.response_ids[i]) for i in idx), 1))


def micro_batches(idx: list[int], batch: RolloutBatch, cfg: Config) -> list[list[int]]:
    """Split ``idx`` (length-sorted, see `length_sorted`) into consecutive forward/backward micro-batches.

    ``train.max_tokens_per_micro_batch`` unset: ``train.micro_batch_seqs`` sequences each. Set: each
    micro-batch takes sequences while its size (:func:`micro_cost`: padded n · (longest prompt +
    longest response), or with ``train.packed`` the sum of the sequences' tokens) stays within the
    budget (a sequence longer than the budget goes alone), so memory follows tokens, not sequence
    counts, and length sorting keeps the padding small.
    """
    budget = cfg.train.max_tokens_per_micro_batch
    if budget is None:
        mb = cfg.train.micro_batch_seqs
        return [idx[s:s + mb] for s in range(0, len(idx), mb)]
    packed = cfg.train.packed
    out: list[list[int]] = []
    cur: list[int] = []
    P = L = S = 0              # the current micro-batch's longest prompt / response, its token sum
    for i in idx:
        p, l = len(batch.prompt_ids[i]), max(len(batch.response_ids[i]), 1)
        size = S + p + len(batch.response_ids[i]) if packed else (len(cur) + 1) * (max(P, p) + max(L, l))
        if cur and size > budget:
            out.append(cur)
            cur, P, L, S = [], 0, 0, 0
        cur.append(i)
        P, L, S = max(P, p), max(L, l), S + p + len(batch.response_ids[i])
    return out + [cur] if cur else out


#: A micro-batch with no sequences: the rank runs :func:`filler_forward` (one token), results dropped.
FILLER: list[int] = []


def balance_by_tokens(idx: list[int], batch: RolloutBatch, world: int) -> list[list[int]]:
    """Deal sequences ``idx`` to ``world`` ranks by tokens (prompt + response): longest first, each to
    the rank with the fewest tokens so far (ties: the lower rank). Greedy LPT: no rank ends more
    than one sequence above the mean load. Returns each rank's share, in dealing order."""
    tokens = {i: len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in idx}
    heap = [(0, r) for r in range(world)]
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(idx, key=lambda i: (-tokens[i], i)):
        load, r = heapq.heappop(heap)
        shares[r].append(i)
        heapq.heappush(heap, (load + tokens[i], r))
    return shares


def rank_micro_batches(idx: list[int], batch: RolloutBatch, cfg: Config, world: int) -> list[list[list[int]]]:
    """Every rank's micro-batches of sequences ``idx``: ``out[rank]``, the same count M on every rank.

    A pure function of the batch (identical on every rank, no collective): sequences are dealt by
    tokens (:func:`balance_by_tokens`), each share is length-sorted and split by :func:`micro_batches`;
    M is the largest count. A rank with fewer micro-batches halves its costliest one (of ≥ 2
    sequences; :func:`micro_cost`) until it has M, so the ranks' k-th passes are of similar size
    (sharded passes run in lockstep); one with fewer than M sequences ends with :data:`FILLER`
    passes (one token each). With one rank: ``micro_batches(length_sorted(idx))``, as before.
    """
    packed = cfg.train.packed
    plans = [micro_batches(length_sorted(share, batch, packed), batch, cfg)
             for share in balance_by_tokens(idx, batch, world)]
    M = max(len(m) for m in plans)
    for micro in plans:
        while len(micro) < M:
            splittable = [k for k, mb in enumerate(micro) if len(mb) > 1]
            if not splittable:
                micro.extend([FILLER] * (M - len(micro)))
                break
            k = max(splittable, key=lambda k: (micro_cost(micro[k], batch, packed), -k))
            mb = micro[k]
            micro[k:k + 1] = [mb[:len(mb) // 2], mb[len(mb) // 2:]]
    return plans


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


#: What :func:`old_logprobs` returns of π_old's entropy: ``rows`` every row on every rank (the top-entropy
#: selection needs them), ``local`` this rank's rows only (0 elsewhere; it feeds a metric, summed over the
#: ranks by :func:`dapo.train.update.old_policy_metrics`), ``none`` none (None; not computed).
ENTROPY_MODES = ("rows", "local", "none")


@torch.no_grad()
def old_logprobs(model, batch: RolloutBatch, cfg: Config, pad_id: int, device, autocast: bool,
                 rank: int = 0, world: int = 1, entropy: str = "rows"):
    """π_old log-probs and entropy of every response token, at the rollout temperature.

    Returns logp [N, L] (the same on every rank), entropy [N, L] (:data:`ENTROPY_MODES`: every rank's rows,
    this rank's, or None), resp_mask [N, L] (:func:`response_mask`); on the CPU, padded to the batch's max L,
    0 at padding. With ``world`` > 1 each rank computes its share (:func:`rank_micro_batches`, which every
    rank knows for every rank) and the real tokens' values are all-gathered as one tensor (the log-probs,
    and the entropy only with ``rows``) on the default group; a rank's :data:`FILLER` passes (one-token
    forwards, results dropped) keep a sharded model's collectives in step.
    """
    from dapo.dist.distributed import all_gather_uneven
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy must be one of {ENTROPY_MODES}, got {entropy!r}")
    N = len(batch.response_ids)
    lens = [len(r) for r in batch.response_ids]
    mask = response_mask(batch)                                                        # [N, L]
    logp = torch.zeros(mask.shape)
    ent = None if entropy == "none" else torch.zeros(mask.shape)
    opts = logit_options(cfg)
    plans = rank_micro_batches(list(range(N)), batch, cfg, world)
    order = [[i for idx in plans[r] for i in idx] for r in range(world)]              # each rank's rows, in turn
    was_training = model.training
    model.eval()
    mine = []                                                                          # [1 or 2, tokens] per pass
    for idx in plans[rank]:
        if idx == FILLER:
            filler_forward(model, pad_id, device, autocast)
            continue
        fw = response_forward(model, [batch.prompt_ids[i] for i in idx], [batch.response_ids[i] for i in idx],
                              pad_id, device, autocast, packed=cfg.train.packed)
        vals = torch.stack([fw.logprobs(**opts)] + ([] if ent is None else [fw.entropy(**opts)]))  # [k, n, l]
        mine.append(torch.cat([vals[:, j, :lens[i]] for j, i in enumerate(idx)], dim=1))
    model.train(was_training)
    k = 1 if ent is None else 2
    flat = torch.cat(mine, dim=1) if mine else torch.zeros(k, 0, device=device)       # [k, this rank's tokens]
    send = flat if entropy == "rows" else flat[:1]
    parts = all_gather_uneven(send.contiguous(), [sum(lens[i] for i in o) for o in order], world)
    for r, part in enumerate(parts):
        _scatter_rows(part.cpu(), order[r], lens, logp, ent if entropy == "rows" else None)
    if entropy == "local":
        _scatter_rows(flat[1:].cpu(), order[rank], lens, ent, None)
    return logp, ent, mask


def _scatter_rows(flat: torch.Tensor, rows: list[int], lens: list[int], first: torch.Tensor,
                  second: Optional[torch.Tensor]) -> None:
    """Rows ``rows`` (in order, ``lens`` real tokens each) of ``flat`` [1 or 2, Σ lens] into first [N, L]
    (and second [N, L], from flat[1])."""
    off = 0
    for i in rows:
        first[i, :lens[i]] = flat[0, off:off + lens[i]]
        if second is not None:
            second[i, :lens[i]] = flat[1, off:off + lens[i]]
        off += lens[i]
