"""One generation call split over the ranks of a job, each rank on its own colocated engine.

:class:`RankShardedEngine` wraps this rank's engine and keeps the :class:`RolloutEngine`
contract for the whole job: every rank calls ``generate`` with the SAME prompts and spec
and gets back the SAME full result, in prompt order. Inside, the prompts are dealt out
round-robin over the engine groups (a tensor-parallel engine spans ``tensor_parallel_size``
consecutive ranks, which all get the same share), each group generates its share, and the
shares are gathered and put back in order.

The gather: only the first rank of each engine group sends (:func:`contributing_ranks`; the
others of a tensor-parallel engine hold the same completions), its share packed into one byte
tensor (:func:`pack_completions`: token ids as int32, log-probs as float32, texts as UTF-8,
an int64 header) and broadcast to every rank at its own size; every rank, the senders
included, unpacks the same bytes, so every rank holds identical completions. It runs on the
rollout's gloo group (``launch.rollout_timeout_s``: ranks wait there for the slowest engine).

Seeds: prompt i of a call is sampled with seed ``per_prompt_seeds(spec.seed, P, salt=engine
seed)[i]`` whichever rank generates it: the whole call's seeds are computed on every rank
and each engine gets its slice. A one-process run draws exactly these seeds too, so the
samples (and so the kept batch) do not depend on the number of ranks.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import torch

from dapo.dist.distributed import broadcast_bytes_from, rollout_group, split_for_rank
from dapo.engines.base import Completion, SamplingSpec, per_prompt_seeds

__all__ = ["RankShardedEngine", "contributing_ranks", "pack_completions", "unpack_completions"]

_META = 4   # header int64s per completion: tokens, text bytes, finished, has log-probs


def contributing_ranks(world: int, tensor_parallel_size: int) -> list[int]:
    """The ranks whose completions are gathered: the first of each engine group of
    ``tensor_parallel_size`` consecutive ranks (group g: ranks g·tp .. g·tp + tp - 1)."""
    return list(range(0, world, tensor_parallel_size))


def pack_completions(groups: list[list[Completion]]) -> torch.Tensor:
    """[P][G_i] completions → one uint8 tensor: an int64 header (P, each G_i, then per completion
    its token count, text bytes, finished, has log-probs), the token ids (int32), the log-probs of
    those that have them (float32), the texts (UTF-8). Sections in that order keep each one aligned."""
    comps = [c for g in groups for c in g]
    texts = [c.text.encode("utf-8", "surrogatepass") for c in comps]
    head = [len(groups), *(len(g) for g in groups)]
    for c, t in zip(comps, texts):
        head += [len(c.token_ids), len(t), int(bool(c.finished)), int(c.logprobs is not None)]
    ids = torch.tensor(list(chain.from_iterable(c.token_ids for c in comps)), dtype=torch.int32)
    lps = torch.tensor(list(chain.from_iterable(c.logprobs for c in comps if c.logprobs is not None)),
                       dtype=torch.float32)
    text = torch.frombuffer(bytearray(b"".join(texts)), dtype=torch.uint8) if any(texts) else \
        torch.zeros(0, dtype=torch.uint8)
    return torch.cat([torch.tensor(head, dtype=torch.int64).view(torch.uint8), ids.view(torch.uint8),
                      lps.view(torch.uint8), text])


def unpack_completions(buf: torch.Tensor) -> list[list[Completion]]:
    """The inverse of :func:`pack_completions` (log-probs come back as the float32 values they were
    sent as: the engines' own precision)."""
    n_groups = int(buf[:8].view(torch.int64)[0])
    sizes = buf[8:8 * (1 + n_groups)].view(torch.int64).tolist()
    n = sum(sizes)
    off = 8 * (1 + n_groups)
    meta = buf[off:off + 8 * _META * n].view(torch.int64).reshape(n, _META).tolist()
    off += 8 * _META * n
    n_ids = sum(m[0] for m in meta)
    n_lps = sum(m[0] for m in meta if m[3])
    ids = buf[off:off + 4 * n_ids].view(torch.int32).tolist()
    off += 4 * n_ids
    lps = buf[off:off + 4 * n_lps].view(torch.float32).tolist()
    off += 4 * n_lps
    text = bytes(buf[off:].numpy())
    comps, i, j, t = [], 0, 0, 0
    for n_tok, n_bytes, finished, has_lp in meta:
        comps.append(Completion(token_ids=ids[i:i + n_tok], text=text[t:t + n_bytes].decode("utf-8", "surrogatepass"),
                                finished=bool(finished), logprobs=lps[j:j + n_tok] if has_lp else None))
        i, t, j = i + n_tok, t + n_bytes, j + (n_tok if has_lp else 0)
    out, k = [], 0
    for size in sizes:
        out.append(comps[k:k + size])
        k += size
    return out


class RankShardedEngine:
    """``engine`` (this rank's) driven as one engine of ``world`` ranks (see module docstring).

    ``generated`` counts, per engine group, the prompts generated since :meth:`take_counts`.
    """

    def __init__(self, engine: Any, *, rank: int, world: int, tensor_parallel_size: int = 1):
        if world % tensor_parallel_size:
            raise ValueError(f"rollout.tensor_parallel_size={tensor_parallel_size} must divide the "
                             f"number of processes ({world})")
        self.engine = engine
        self.rank, self.world, self.tp = rank, world, tensor_parallel_size
        self.groups = world // tensor_parallel_size          # engines that generate different prompts
        self.group = rank // tensor_parallel_size
        self.seed = getattr(engine, "seed", 0)
        self.generated = [0] * self.groups

    def generate(self, prompt_token_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[int] | None = None) -> list[list[Completion]]:
        """``seeds``: one per prompt, overriding the ones derived from ``spec.seed`` (a slice of a
        longer call's, e.g. ``dapo eval --chunk``)."""
        n = len(prompt_token_ids)
        if self.groups == 1:           # one engine: the whole call, seeded by the engine as usual
            self.generated[0] += n
            return (self.engine.generate(prompt_token_ids, spec) if seeds is None else
                    self.engine.generate(prompt_token_ids, spec, seeds=seeds))
        if seeds is None and spec.seed is not None:
            seeds = per_prompt_seeds(spec.seed, n, salt=self.seed)
        mine = split_for_rank(n, self.group, self.groups)
        local = self.engine.generate([prompt_token_ids[i] for i in mine], spec,
                                     seeds=[seeds[i] for i in mine] if seeds is not None else None) if mine else []
        sources = contributing_ranks(self.world, self.tp)
        bufs = broadcast_bytes_from(pack_completions(local) if self.rank in sources else None, sources,
                                    self.rank, self.world, group=rollout_group())
        out: list[Any] = [None] * n
        for g, buf in enumerate(bufs):
            part = unpack_completions(buf)
            idx = split_for_rank(n, g, self.groups)
            if len(part) != len(idx):
                raise RuntimeError(f"RankShardedEngine: engine group {g} returned {len(part)} groups "
                                   f"for {len(idx)} prompts")
            for i, comps in zip(idx, part):
                out[i] = comps
            self.generated[g] += len(idx)
        return out

    def take_counts(self) -> list[int]:
        """Prompts each engine group generated since the last call (then reset)."""
        counts, self.generated = self.generated, [0] * self.groups
        return counts

    def update_weights(self, named_tensors) -> None:
        self.engine.update_weights(named_tensors)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def close(self) -> None:
        self.engine.close()

    def __getattr__(self, name: str) -> Any:   # dtype, tokenizer, ... of the wrapped engine
        return getattr(self.engine, name)
