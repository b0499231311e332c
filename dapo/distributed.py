"""Processes, sharding and the few collectives the loop needs.

One process per accelerator (or per CPU slot), started by a torchrun-compatible launcher
(``accelerate launch``, ``torchrun``): it sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``. :func:`init_distributed` reads them and creates the
default process group with a timeout from the config (``launch.pg_timeout_s``), so a rank
that waits in a collective for a peer that died or is busy alone fails with a timeout
instead of hanging. One process (no ``WORLD_SIZE`` or 1) creates no group at all.

Sharding is FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder layer is one
unit, the root (embeddings, final norm, lm_head) another. Master weights, gradients and
optimizer state stay fp32 and are sharded 1/world per rank; with bf16 on, layers are
gathered and run in bf16 and gradients reduced in fp32 (``MixedPrecisionPolicy``). The
module keeps the HF parameter names, so ``state_dict()`` keys are the checkpoint's.

Loading (:func:`load_sharded_causal_lm`): every rank builds the model on the meta device
(no memory), shards it, allocates only its shards; rank 0 alone reads the checkpoint and
broadcasts it tensor by tensor into the shards. No rank other than 0 ever holds a full
copy, and rank 0 holds one only in host memory while loading.

Gradient clipping: FSDP2 gradients are DTensors, so ``torch.nn.utils.clip_grad_norm_``
computes the norm over all shards (the global norm); :func:`clip_grad_norm` returns it as
a float, identical on every rank.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DistInfo", "init_distributed", "CudaUnavailableError", "EXPECT_CUDA_ENV", "cuda_expected", "check_cuda", "destroy_distributed", "launcher_world_size",
           "all_gather_object", "broadcast_object", "barrier", "all_reduce_sum",
           "is_sharded", "shard_causal_lm", "final_state_dict", "load_sharded_causal_lm", "clip_grad_norm",
           "full_tensor", "split_for_rank"]


@dataclass(frozen=True)
class DistInfo:
    """Who this process is. ``world == 1``: no process group exists."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launcher_world_size() -> int:
    """``WORLD_SIZE`` as set by the launcher (1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


#: Set to 1 by the launcher for a job whose resources ask for GPUs (0: run on CPU whatever Slurm gave).
EXPECT_CUDA_ENV = "DAPO_EXPECT_CUDA"


class CudaUnavailableError(RuntimeError):
    """A job that should run on GPUs found no usable CUDA."""


def cuda_expected() -> str | None:
    """Why this process should find CUDA (``DAPO_EXPECT_CUDA=1``, or Slurm's ``SLURM_GPUS_ON_NODE`` > 0),
    or None when nothing says so or ``DAPO_EXPECT_CUDA=0``."""
    flag = os.environ.get(EXPECT_CUDA_ENV, "").strip()
    if flag:
        return None if flag == "0" else f"{EXPECT_CUDA_ENV}={flag}"
    gpus = os.environ.get("SLURM_GPUS_ON_NODE", "").strip()
    return f"SLURM_GPUS_ON_NODE={gpus}" if gpus.isdigit() and int(gpus) > 0 else None


def check_cuda() -> bool:
    """Whether CUDA is usable; a process that should have it (:func:`cuda_expected`) and has not
    raises :class:`CudaUnavailableError` naming the likely causes, instead of quietly running as a
    gloo/CPU job (vLLM's CPU path, hours slower) that fails much later."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:   # e.g. "The NVIDIA driver on your system is too old"
        warnings.simplefilter("always")
        ok = torch.cuda.is_available()
    why = cuda_expected()
    if ok or why is None:
        return ok
    said = "; ".join(str(w.message).strip().replace("\n", " ") for w in caught)[:400]
    wheel = (f"torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None
             else f"torch {torch.__version__} needs CUDA {torch.version.cuda}")
    raise CudaUnavailableError(
        f"this job expects GPUs ({why}) but CUDA did not initialise ({wheel}; "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}"
        + (f"; torch said: {said}" if said else "") + "). Likely causes: the NVIDIA driver is older than the "
        "wheels need (compare nvidia-smi's 'CUDA Version'), CUDA_VISIBLE_DEVICES is empty, a CPU-only torch in "
        "this Python, or a module environment whose LD_LIBRARY_PATH shadows the CUDA libraries the pip wheels "
        f"bring (they need no `module load cuda`). To run on CPU anyway, set {EXPECT_CUDA_ENV}=0")


def init_distributed(timeout_s: float = 600.0) -> DistInfo:
    """Create the default process group from the launcher's environment (idempotent).

    Backend: NCCL for CUDA tensors plus gloo for CPU tensors (objects, counters) on a GPU
    machine; gloo alone on CPU. ``timeout_s`` bounds every collective (launch.pg_timeout_s).
    A job that should have GPUs and finds no CUDA fails here (:func:`check_cuda`).
    """
    import torch.distributed as dist

    world = launcher_world_size()
    rank = int(os.environ.get("RANK", "0") or 0)
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)) or 0)
    cuda = check_cuda()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        os.environ.setdefault("LOCAL_RANK", str(local_rank))   # vLLM's external launcher reads it
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
                                timeout=datetime.timedelta(seconds=float(timeout_s)),
                                **({"device_id": device} if cuda else {}))
    return DistInfo(rank=rank, world=world, local_rank=local_rank, device=device)


def destroy_distributed(world: int) -> None:
    """Destroy the process group :func:`init_distributed` created (none for one process: a
    group that exists then is vLLM's own, and vLLM tears it down)."""
    import torch.distributed as dist
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------- collectives
def all_gather_object(obj: Any, world: int) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` for one process)."""
    if world == 1:
        return [obj]
    import torch.distributed as dist
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, world: int, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if world == 1:
        return obj
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist
        dist.barrier()


def all_reduce_sum(values: dict[str, float], world: int) -> dict[str, float]:
    """Sum float values over ranks, key by key (ranks may hold different key sets)."""
    if world == 1:
        return dict(values)
    import torch.distributed as dist
    keys = sorted(set().union(*all_gather_object(sorted(values), world)))
    t = torch.tensor([float(values.get(k, 0.0)) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def split_for_rank(n: int, rank: int, world: int) -> list[int]:
    """The global indices rank ``rank`` handles out of ``n``: ``rank, rank+world, ...``."""
    return list(range(rank, n, world))


# --------------------------------------------------------------------------- sharding
def is_sharded(model: torch.nn.Module) -> bool:
    """True for a module sharded with FSDP2 ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (``model.model.layers`` for Llama/Qwen-like)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no .model.layers to shard (an HF decoder-only LM is expected)")
    return list(layers)


def shard_causal_lm(model: torch.nn.Module, *, bf16: bool) -> torch.nn.Module:
    """FSDP2-shard ``model`` in place over all ranks: one unit per decoder layer + the root.

    ``bf16``: parameters are gathered and computed in bf16, gradients reduced in fp32; the
    sharded master weights keep their own dtype (fp32). Returns ``model`` (now an FSDPModule).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    for layer in _decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def load_sharded_causal_lm(path: str | os.PathLike, *, dtype: str, dist_info: DistInfo, bf16: bool,
                           gradient_checkpointing: bool = False) -> torch.nn.Module:
    """An HF causal LM from ``path``, FSDP2-sharded, without a full copy on ranks > 0.

    Every rank: config → model on the meta device (buffers such as rotary frequencies are
    real) → :func:`shard_causal_lm` → allocate its own shards. Rank 0: read the checkpoint
    (host memory) and broadcast it into everyone's shards, tensor by tensor.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    from accelerate import init_empty_weights

    from dapo.models import load_model

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    config = AutoConfig.from_pretrained(str(path))
    with init_empty_weights(include_buffers=False):   # parameters on meta, buffers real
        model = AutoModelForCausalLM.from_config(config, dtype=dtypes[dtype])
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()   # one Parameter for embed_tokens and lm_head, shared by FSDP's root unit
    # non-persistent buffers (rotary inv_freq) are not in the checkpoint; to_empty() below
    # would leave them uninitialised, so keep their computed values
    real_buffers = {n: b.clone() for n, b in model.named_buffers()}
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    shard_causal_lm(model, bf16=bf16)
    model.to_empty(device=dist_info.device)
    for name, buf in model.named_buffers():
        if name in real_buffers:
            buf.copy_(real_buffers[name].to(buf.dtype))
    full = load_model(path, dtype=dtype).state_dict() if dist_info.is_main else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    return model


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered to its full value (a collective: every rank must call it, in the
    same order); a plain tensor as is."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def final_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full state dict on CPU for saving a final HF model: a sharded model is gathered (every
    rank must call this; rank 0 gets the tensors, the others an empty dict); a plain one as is."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def clip_grad_norm(parameters, max_norm: float) -> float:
    """Clip gradients to the GLOBAL norm (over all shards of all ranks); return that norm.

    FSDP2 gradients are DTensors: ``clip_grad_norm_`` then reduces the shard norms across
    ranks before scaling, so every rank scales by the same factor.
    """
    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    return float(full_tensor(norm))

