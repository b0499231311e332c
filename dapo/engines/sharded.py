"""One generation call split over the ranks of a job, each rank on its own colocated engine.

:class:`RankShardedEngine` wraps this rank's engine and keeps the :class:`RolloutEngine`
contract for the whole job: every rank calls ``generate`` with the SAME prompts and spec
and gets back the SAME full result, in prompt order. Inside, the prompts are dealt out
round-robin over the engine groups (a tensor-parallel engine spans ``tensor_parallel_size``
consecutive ranks, which all get the same share), each group generates its share, and the
shares are all-gathered and put back in order.

Seeds: prompt i of a call is sampled with seed ``per_prompt_seeds(spec.seed, P, salt=engine
seed)[i]`` whichever rank generates it: the whole call's seeds are computed on every rank
and each engine gets its slice. A one-process run draws exactly these seeds too, so the
samples (and so the kept batch) do not depend on the number of ranks.
"""

from __future__ import annotations

from typing import Any

from dapo.distributed import all_gather_object, split_for_rank
from dapo.engines.base import Completion, SamplingSpec, per_prompt_seeds

__all__ = ["RankShardedEngine"]


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
        parts = all_gather_object(local, self.world)
        out: list[Any] = [None] * n
        for g in range(self.groups):
            part = parts[g * self.tp]                          # the first rank of each engine group
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
