"""Weight sync: stream the trainer's current weights into this rank's rollout engine (step 7 of the loop, docs/METRICS.md).

Every rank pushes into its own engine. The policy's ``state_dict()`` holds, per name, this
rank's shard (FSDP2, a DTensor) or the full tensor (one process); the stream casts each shard
to the engine's dtype first, then gathers it (``full_tensor()``, a collective that every rank
enters in the same order) and hands it to the engine's in-place reload, which copies it into
its own buffers before the next one is produced. Casting before the gather sends and holds
the tensor in the rollout dtype (bf16: half the bytes of the fp32 master, on the wire and in
the gathered buffer); the cast is element-wise, so the result is bit for bit the gathered
master cast afterwards. Peak extra memory: about one tensor in the rollout dtype, never the
full model. Tied weights (``lm_head.weight``) are in the state
dict under their own name, as the engine requires.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dapo.dist.distributed import full_tensor
from dapo.engines.base import WeightStream

__all__ = ["push_weights", "weight_stream", "cast_shard", "release_engine"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def weight_stream(model: torch.nn.Module, dtype: str | None = None) -> WeightStream:
    """The full state dict of ``model`` (sharded or not), one gathered tensor at a time.

    ``dtype``: "float32" | "bfloat16" to cast floating tensors to (None: as stored).
    """
    sd = model.state_dict()          # FSDP2: local shards only; names are the HF names
    cast = _DTYPES[dtype] if dtype is not None else None

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in sd.items():
            yield name, full_tensor(cast_shard(t.detach(), cast))

    return WeightStream(names=tuple(sd), open=tensors)


def cast_shard(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` (a local tensor or a sharded DTensor, any shape) in ``dtype`` if it is floating; a DTensor
    stays sharded (only the local shard is cast), so the gather that follows moves ``dtype`` bytes."""
    return t.to(dtype) if dtype is not None and torch.is_floating_point(t) else t


def push_weights(policy, engine) -> None:
    """Load ``policy`` (a :class:`dapo.train.update.Policy`) into ``engine`` in-process, streamed.

    Called on every rank at the same point (sharded tensors are gathered collectively).
    """
    engine.update_weights(weight_stream(policy.module, getattr(engine, "dtype", None)))


def release_engine(engine) -> None:
    """Before the update: let the engine free its accelerator memory (vLLM sleep mode on
    CUDA; a no-op elsewhere). The next :func:`push_weights` wakes it."""
    engine.sleep()
