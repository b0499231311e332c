"""The rollout-engine interface: prompts as token ids in, sampled completions out.

Two engines implement it: ``"vllm"`` (:mod:`dapo.engines.vllm_engine`, the only module
in the project that imports vllm) and ``"hf"`` (:mod:`dapo.engines.hf_engine`, plain
transformers ``generate``; machines without vLLM, and the oracle in tests).

Output contract, shared by both engines:

- ``generate(prompts, spec)[i][j]`` is sample ``j`` (of ``spec.n``) for prompt ``i``.
- ``Completion.token_ids`` are the generated tokens only (no prompt, no padding),
  at most ``spec.max_tokens`` of them. When the model stopped on EOS the EOS token is
  the LAST element of ``token_ids`` (the trainer trains on producing it) and
  ``finished`` is True; a completion cut at ``max_tokens`` (or, in vLLM, at the
  model's context length) has ``finished`` False (DAPO's "truncated", the target of
  overlong filtering/punishment).
- ``Completion.text`` is ``token_ids`` decoded without special tokens (no EOS text).
- ``temperature == 0`` means greedy decoding (``top_p`` ignored).
- ``update_weights`` takes the trainer model's FULL ``state_dict().items()``, not
  ``named_parameters()``: with tied embeddings ``lm_head.weight`` is not a parameter,
  and an engine that owns its own copy would silently keep a stale output layer.
  It also takes a :class:`WeightStream` (names known up front, tensors produced one at
  a time, e.g. gathered from shards): the engine checks the names, then consumes the
  stream once, so at most one full tensor exists beside the engine's own weights.
- ``generate(prompts, spec, seeds=None)``: ``seeds`` (one per prompt) override the
  seeds an engine derives from ``spec.seed``; see :func:`per_prompt_seeds`.
- ``sleep()`` / ``wake_up(tags)``: free / re-allocate the engine's accelerator memory
  between phases (vLLM sleep mode on CUDA); no-ops where unsupported.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "SamplingSpec",
    "Completion",
    "RolloutEngine",
    "WeightStream",
    "ENGINES",
    "make_engine",
    "per_prompt_seeds",
    "split_at_eos",
    "check_full_state_dict",
    "strip_wrapper_prefixes",
]


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample completions for each prompt."""

    n: int  # completions per prompt (G in the paper)
    temperature: float  # 0 = greedy; the paper samples at 1.0
    top_p: float  # nucleus mass in (0, 1]; 1.0 = full distribution
    max_tokens: int  # generation cap per completion (L_max); longer ones are truncated
    seed: int | None = None  # None = engine RNG state; an int makes the call reproducible

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and self.n >= 1):
            raise ValueError(f"SamplingSpec.n must be an int >= 1, got {self.n!r}")
        if not self.temperature >= 0:
            raise ValueError(f"SamplingSpec.temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingSpec.top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ValueError(f"SamplingSpec.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"SamplingSpec.seed must be an int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Completion:
    """One sampled response."""

    token_ids: list[int]  # generated tokens; ends with EOS iff finished
    text: str  # token_ids decoded, special tokens (EOS) skipped
    finished: bool  # True = stopped on EOS; False = cut at max_tokens
    logprobs: list[float] | None = None  # [len(token_ids)] log π_rollout of each token, after temperature (and
                                         # top_p: renormalised over the kept set); None if the engine gave none


@dataclass(frozen=True)
class WeightStream:
    """Named tensors produced lazily, with every name known before the first tensor.

    ``names``: the full state-dict names the stream will yield, in order. ``open()``
    returns a fresh iterator of ``(name, tensor)``; producing each tensor may be a
    collective (every rank consumes its own stream in the same order).
    """

    names: tuple[str, ...]
    open: Callable[[], Iterator[tuple[str, torch.Tensor]]]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.open()


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(
        self, prompt_token_ids: list[list[int]], spec: SamplingSpec
    ) -> list[list[Completion]]:
        """[num_prompts][spec.n] completions, in prompt order."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's weights (its full ``state_dict().items()``) in-process."""
        ...

    def close(self) -> None:
        """Free the engine's memory; the engine is unusable afterwards."""
        ...


#: Engine registry: kind -> "module:Class" (imported lazily; vllm only when asked for).
ENGINES: dict[str, str] = {
    "vllm": "dapo.engines.vllm_engine:VLLMEngine",
    "hf": "dapo.engines.hf_engine:HFEngine",
}


def make_engine(
    kind: str,
    model_path: Any,
    *,
    dtype: str = "float32",
    seed: int = 0,
    trainer_model: Any = None,
    **kw: Any,
) -> RolloutEngine:
    """Build a rollout engine of ``kind`` (one of :data:`ENGINES`) on ``model_path``.

    ``dtype``: "float32" | "bfloat16". ``seed``: the engine's base seed.
    ``trainer_model``: the trainer's live model; the "hf" engine then generates with it
    directly (``update_weights`` becomes a no-op), the "vllm" engine ignores it. Other
    keyword arguments go to the engine class (see each engine's docstring).
    """
    if kind not in ENGINES:
        raise ValueError(f"unknown rollout engine {kind!r}; valid: {sorted(ENGINES)}")
    module_name, cls_name = ENGINES[kind].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(model_path, dtype=dtype, seed=seed, trainer_model=trainer_model, **kw)


# --------------------------------------------------------------------------- helpers


def per_prompt_seeds(seed: int | None, num_prompts: int, *, salt: int = 0) -> list[int] | list[None]:
    """Deterministic 31-bit seeds, one per prompt, derived from ``(salt, seed)``.

    ``salt`` is the engine's own seed. vLLM gives sample j of a seeded request the seed
    ``s + j``; drawing each prompt's ``s`` at random from a 2^31 range keeps overlaps
    between prompts negligible. ``seed=None`` gives ``[None] * num_prompts``.
    """
    if seed is None:
        return [None] * num_prompts
    rng = random.Random(f"{salt}:{seed}")  # str seeds hash deterministically (sha512)
    return [rng.randrange(2**31 - 2**16) for _ in range(num_prompts)]


def split_at_eos(token_ids: list[int], eos_ids: set[int], max_tokens: int) -> tuple[list[int], bool]:
    """Cut generated ids after the first EOS (kept) and at ``max_tokens``.

    Returns ``(ids, finished)`` with ``finished`` True iff an EOS ends ``ids``.
    """
    for k, t in enumerate(token_ids[:max_tokens]):
        if t in eos_ids:
            return list(token_ids[: k + 1]), True
    return list(token_ids[:max_tokens]), False


def check_full_state_dict(names: Iterable[str], expected: Iterable[str], *, who: str) -> None:
    """Raise if a weight push misses names the engine needs (e.g. tied ``lm_head.weight``).

    ``expected``: every name of the model's ``state_dict()``. Extra names are allowed.
    """
    missing = sorted(set(expected) - set(names))
    if missing:
        hint = (
            " (lm_head.weight is tied to the embedding and absent from named_parameters(): "
            "pass model.state_dict().items())"
            if any(m.endswith("lm_head.weight") for m in missing)
            else ""
        )
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ValueError(
            f"{who}.update_weights: {len(missing)} weights missing: {shown}{hint}"
        )


def strip_wrapper_prefixes(name: str) -> str:
    """Drop DDP / torch.compile prefixes ("module.", "_orig_mod.") from a weight name."""
    for p in ("module.", "_orig_mod."):
        while name.startswith(p):
            name = name[len(p) :]
    return name
