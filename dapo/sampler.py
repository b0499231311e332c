"""The resumable prompt sampler: shuffled batches, epoch by epoch, restartable exactly.

Epoch ``e`` is a shuffle seeded by (seed, e) only, so after a restart the sampler rebuilds
it from its saved (epoch, cursor) and the batches continue as if never interrupted; the
saved state also fingerprints the data and the seed, checked on load. Plain Python.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dapo.prompts import Example, prompt_key

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
        self.epoch = epoch
        self.cursor = cursor
        self._check_position()

    def __len__(self) -> int:
        """Full batches per epoch (plus one short one when drop_last=False)."""
        n, b = len(self.examples), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def permutation(self, epoch: int) -> list[int]:
        """Order of example indices in ``epoch``; depends only on (seed, epoch, len)."""
        perm = list(range(len(self.examples)))
        random.Random(f"dapo-prompt-sampler:{self.seed}:{epoch}").shuffle(perm)
        return perm

    def _current_perm(self) -> list[int]:
        if self._perm_epoch != self.epoch:
            self._perm, self._perm_epoch = self.permutation(self.epoch), self.epoch
        return self._perm

    def next_batch(self, n: int | None = None) -> list[Example]:
        """The next ``n`` (default ``batch_size``) examples; advances the cursor."""
        n = self.batch_size if n is None else n
        if n <= 0 or (self.drop_last and n > len(self.examples)):
            raise ValueError(f"batch of {n} from {len(self.examples)} examples (drop_last={self.drop_last})")
        remaining = len(self.examples) - self.cursor
        if remaining <= 0 or (self.drop_last and remaining < n):
            self.epoch, self.cursor = self.epoch + 1, 0
        perm = self._current_perm()
        idx = perm[self.cursor : self.cursor + n]
        self.cursor += len(idx)
        return [self.examples[i] for i in idx]

    def __iter__(self) -> Iterator[list[Example]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "seed": self.seed,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "num_examples": len(self.examples),
            "fingerprint": self._fingerprint,
        }

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
        self._check_position()

    def _check_position(self) -> None:
        if self.epoch < 0 or not 0 <= self.cursor <= len(self.examples):
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
