"""The resumable prompt sampler: shuffled batches, epoch by epoch, restartable exactly.

Epoch ``e`` is a shuffle seeded by (seed, e) only, so after a restart the sampler rebuilds
it from its saved (epoch, cursor) and the batches continue as if never interrupted; the
saved state also fingerprints the data and the seed, checked on load. With ``drop_solved``
the prompts every response solved leave the pool from the next epoch on; that set is part of the
saved state too. Plain Python.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dapo.data.prompts import Example, prompt_key

__all__ = ["PromptSampler", "batches"]


def _fingerprint(examples: Sequence[Example]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(prompt_key(ex.prompt).encode("utf-8"))
        h.update(b"\x00")
        h.update(ex.answer.encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()[:16]


class PromptSampler:
    """Shuffled prompt batches, epoch by epoch, resumable exactly.

    Epoch ``e`` visits the examples in ``permutation(e)``, a shuffle seeded by
    (seed, e) only, so it can be rebuilt after a restart. ``cursor`` is the position in the
    current epoch. A batch never spans two epochs: when fewer than ``n`` examples remain,
    ``drop_last=True`` (default) skips them and starts the next epoch (every batch full, no
    prompt twice in a batch); ``drop_last=False`` returns the short tail batch first.

    ``state_dict()`` / ``load_state_dict()`` save and restore (epoch, cursor); after loading,
    the sequence of batches continues exactly as if never interrupted. The state also holds
    the seed, the number of examples and a fingerprint of the data, checked on load.

    ``drop_solved=True``: :meth:`mark_solved` records a prompt whose G responses were all correct; it
    stays in the current epoch's order (every prompt is drawn once per epoch anyway) and leaves the pool
    from the next epoch on: epoch ``e`` visits ``permutation(e)`` without the prompts solved before it
    began. The state then also holds the solved prompts and those left out of the current epoch.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        batch_size: int,
        seed: int,
        *,
        drop_last: bool = True,
        epoch: int = 0,
        cursor: int = 0,
        drop_solved: bool = False,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be > 0")
        if not examples:
            raise ValueError("PromptSampler needs at least one example")
        if drop_last and batch_size > len(examples):
            raise ValueError(
                f"batch_size={batch_size} > {len(examples)} examples with drop_last=True"
            )
        self.examples = list(examples)
        self.batch_size = batch_size
        self.seed = int(seed)
        self.drop_last = drop_last
        self._fingerprint = _fingerprint(self.examples)
        self._perm: list[int] = []
        self._perm_epoch = -1
        self.drop_solved = drop_solved
        self._row = {(ex.source, ex.index): i for i, ex in enumerate(self.examples)}
        self._solved: set[int] = set()         # example indices solved so far
        self._left_out: frozenset[int] = frozenset()   # the solved ones as of the current epoch's start
        self.epoch = epoch
        self.cursor = cursor
        self._check_position()

    def __len__(self) -> int:
        """Full batches in the current epoch's pool (plus one short one when drop_last=False)."""
        n, b = self.pool_size, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def permutation(self, epoch: int) -> list[int]:
        """Order of example indices in ``epoch``; depends only on (seed, epoch, len)."""
        perm = list(range(len(self.examples)))
        random.Random(f"dapo-prompt-sampler:{self.seed}:{epoch}").shuffle(perm)
        return perm

    def _current_perm(self) -> list[int]:
        """The current epoch's order: ``permutation(epoch)`` without the prompts left out of it."""
        if self._perm_epoch != self.epoch:
            self._perm = [i for i in self.permutation(self.epoch) if i not in self._left_out]
            self._perm_epoch = self.epoch
        return self._perm

    @property
    def pool_size(self) -> int:
        """Prompts in the current epoch's pool (all of them without drop_solved)."""
        return len(self.examples) - len(self._left_out)

    def mark_solved(self, example: Example) -> None:
        """Record that every response to ``example`` was correct: with drop_solved, it is not drawn again
        from the next epoch on (without drop_solved this does nothing)."""
        if self.drop_solved:
            self._solved.add(self._row[(example.source, example.index)])

    def pool_stats(self) -> dict[str, float]:
        """``sampling/pool_prompts`` (the current epoch's pool) and ``sampling/solved_prompts`` (solved so
        far: out of the pool from the next epoch on)."""
        return {"sampling/pool_prompts": float(self.pool_size), "sampling/solved_prompts": float(len(self._solved))}

    def _new_epoch(self) -> None:
        """Advance to the next epoch; the prompts solved so far leave its pool."""
        self.epoch, self.cursor = self.epoch + 1, 0
        self._left_out = frozenset(self._solved)
        need = self.batch_size if self.drop_last else 1
        if self.pool_size < need:
            raise ValueError(f"data.drop_solved: {len(self._solved)} of {len(self.examples)} training prompts are "
                             f"solved, leaving {self.pool_size} for epoch {self.epoch}, fewer than one batch of "
                             f"{self.batch_size}; train fewer steps, on more data, or without data.drop_solved")

    def next_batch(self, n: int | None = None) -> list[Example]:
        """The next ``n`` (default ``batch_size``) examples; advances the cursor."""
        n = self.batch_size if n is None else n
        if n <= 0 or (self.drop_last and n > len(self.examples)):
            raise ValueError(f"batch of {n} from {len(self.examples)} examples (drop_last={self.drop_last})")
        remaining = self.pool_size - self.cursor
        if remaining <= 0 or (self.drop_last and remaining < n):
            self._new_epoch()
        perm = self._current_perm()
        idx = perm[self.cursor : self.cursor + n]
        self.cursor += len(idx)
        return [self.examples[i] for i in idx]

    def __iter__(self) -> Iterator[list[Example]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        state = {
            "version": 1,
            "seed": self.seed,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "num_examples": len(self.examples),
            "fingerprint": self._fingerprint,
        }
        if self.drop_solved:   # only then: every other run's state stays as it was
            state.update(solved=sorted(self._solved), left_out=sorted(self._left_out))
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Restore (epoch, cursor). ``strict`` also requires the same seed and data."""
        missing = {"epoch", "cursor"} - set(state)
        if missing:
            raise ValueError(f"sampler state lacks {sorted(missing)}")
        if strict:
            mine = self.state_dict()
            for key in ("seed", "num_examples", "fingerprint"):
                if key in state and state[key] != mine[key]:
                    raise ValueError(
                        f"sampler state {key}={state[key]!r} does not match this sampler's "
                        f"{mine[key]!r}; the data or seed changed (load with strict=False to ignore)"
                    )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._solved = {int(i) for i in state.get("solved", ())}
        self._left_out = frozenset(int(i) for i in state.get("left_out", ()))
        self._perm_epoch = -1   # rebuilt from (seed, epoch, left_out)
        self._check_position()

    def _check_position(self) -> None:
        if self.epoch < 0 or not 0 <= self.cursor <= self.pool_size:
            raise ValueError(
                f"sampler position epoch={self.epoch} cursor={self.cursor} is out of range "
                f"for {len(self.examples)} examples"
            )


def batches(
    examples: Sequence[Example],
    batch_size: int,
    seed: int,
    epoch_start: int = 0,
    cursor: int = 0,
    *,
    drop_last: bool = True,
) -> Iterator[list[Example]]:
    """Endless batches from ``PromptSampler(...)`` starting at (epoch_start, cursor)."""
    return iter(PromptSampler(examples, batch_size, seed, drop_last=drop_last,
                              epoch=epoch_start, cursor=cursor))
