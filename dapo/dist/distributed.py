"""Processes, sharding and the few collectives the loop needs.

One process per accelerator (or per CPU slot), started by a torchrun-compatible launcher
(``accelerate launch``, ``torchrun``): it sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``. :func:`init_distributed` reads them and creates the
default process group with a timeout from the config (``launch.pg_timeout_s``), so a rank
that waits in a collective for a peer that died or is busy alone fails with a timeout
instead of hanging. One process (no ``WORLD_SIZE`` or 1) creates no group at all.

Two timeouts: the rollout's gathers (a rank that finished its share of a generation round
waits there for the slowest engine: minutes at long responses) run on their own gloo group,
:func:`rollout_group`, with ``launch.rollout_timeout_s``; everything else (the update's
NCCL collectives, weight sync, checkpoints, counters) keeps the short ``pg_timeout_s``, so a
dead or stuck rank outside generation fails the job in minutes, not in an hour.

CPU threads per process (:func:`cpu_threads`): ``train.threads``, else ``OMP_NUM_THREADS``,
else this process's CPUs (its affinity mask) shared by the processes of its node.

Sharding is FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder layer is one
unit, an untied input embedding and lm_head one each, the root (final norm; tied embeddings)
another. Master weights, gradients and
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
           "all_gather_object", "all_gather_uneven", "broadcast_object", "barrier", "all_reduce_sum",
           "is_sharded", "shard_causal_lm", "final_state_dict", "load_sharded_causal_lm", "clip_grad_norm",
           "full_tensor", "split_for_rank", "rollout_group", "all_gather_strided", "broadcast_bytes_from",
           "cpu_threads", "usable_cpus", "set_cpu_threads"]


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


_groups: dict[str, Any] = {}   # "rollout": the gloo group of the rollout's gathers (created by init_distributed);
                               # "background": that of background checkpoint writes (background_group)


def rollout_group() -> Any:
    """The process group of the rollout's gathers (its own gloo group with ``launch.rollout_timeout_s``),
    or None (the default group) when :func:`init_distributed` made none (one process, or a group
    made elsewhere)."""
    return _groups.get("rollout")


def background_group() -> Any:
    """A gloo group of its own for collectives that run in a background thread (DCP's ``async_save``),
    so they never interleave with the training's on the default group. Made on the first call, which
    is a collective: every rank makes it at the same point."""
    import torch.distributed as dist
    if _groups.get("background") is None:
        _groups["background"] = dist.new_group(backend="gloo")
    return _groups["background"]


def init_distributed(timeout_s: float = 600.0, rollout_timeout_s: float | None = None) -> DistInfo:
    """Create the default process group from the launcher's environment (idempotent), and the
    rollout's gloo group (:func:`rollout_group`).

    Backend: NCCL for CUDA tensors plus gloo for CPU tensors (objects, counters) on a GPU
    machine; gloo alone on CPU. ``timeout_s`` bounds every collective of the default group
    (launch.pg_timeout_s); ``rollout_timeout_s`` (None: the same) those of the rollout group
    (launch.rollout_timeout_s). A job that should have GPUs and finds no CUDA fails here
    (:func:`check_cuda`).
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
    if world > 1 and _groups.get("rollout") is None:   # every rank creates it (a collective), once
        _groups["rollout"] = dist.new_group(backend="gloo", timeout=datetime.timedelta(
            seconds=float(rollout_timeout_s if rollout_timeout_s is not None else timeout_s)))
    return DistInfo(rank=rank, world=world, local_rank=local_rank, device=device)


def cpu_threads(configured: int | None, omp_num_threads: str | None, usable: int, local_processes: int) -> int:
    """Torch CPU threads for one process: ``configured`` (``train.threads``) when set, else a valid
    ``OMP_NUM_THREADS`` (the launcher's or the profile's), else the ``usable`` CPUs (this process's
    affinity mask) shared by the ``local_processes`` of its node (at least 1)."""
    if configured is not None:
        return int(configured)
    try:
        omp = int(str(omp_num_threads).strip())
    except ValueError:
        omp = 0
    if omp >= 1:
        return omp
    return max(1, usable // max(1, local_processes))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_cpu_threads(configured: int | None) -> int:
    """Set torch's CPU threads (and ``OMP_NUM_THREADS`` if unset: vLLM otherwise drops torch to
    1 thread) to :func:`cpu_threads` of this process; returns the count. ``LOCAL_WORLD_SIZE`` (set
    by torchrun / accelerate launch) gives the processes of the node."""
    threads = cpu_threads(configured, os.environ.get("OMP_NUM_THREADS"), usable_cpus(),
                          int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    return threads


def destroy_distributed(world: int) -> None:
    """Destroy the process group :func:`init_distributed` created (none for one process: a
    group that exists then is vLLM's own, and vLLM tears it down)."""
    import torch.distributed as dist
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()   # every group, the rollout group included
    _groups.clear()


# --------------------------------------------------------------------------- collectives
def all_gather_object(obj: Any, world: int, group: Any = None) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` for one process).
    ``group``: a process group spanning all ranks (None: the default group)."""
    if world == 1:
        return [obj]
    import torch.distributed as dist
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def all_gather_uneven(values: torch.Tensor, counts: list[int], world: int, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``values`` ([..., counts[rank]], the same leading shape and dtype on every rank, on the
    group's device: CUDA for NCCL), in rank order, on every rank: one ``all_gather`` of tensors padded to the
    longest (no pickling). ``counts``: every rank's length, which every rank knows beforehand. A collective."""
    if world == 1:
        return [values]
    import torch.distributed as dist
    m = max(max(counts), 1)
    mine = values.new_zeros((*values.shape[:-1], m))
    mine[..., :values.shape[-1]] = values
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return [p[..., :c] for p, c in zip(parts, counts)]


def all_gather_strided(values: torch.Tensor, n: int, rank: int, world: int, group: Any = None) -> torch.Tensor:
    """The [n] values of which each rank holds those of :func:`split_for_rank` (``values``: [len of
    its share], one dtype on every rank), in global order on every rank. A collective."""
    if world == 1:
        return values
    import torch.distributed as dist
    m = -(-n // world)                                               # the longest share
    mine = torch.zeros(m, dtype=values.dtype)
    mine[:len(split_for_rank(n, rank, world))] = values
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return torch.stack(parts).T.reshape(-1)[:n]                     # [m, world] → index a·world + r


def broadcast_bytes_from(payload: torch.Tensor | None, sources: list[int], rank: int, world: int,
                         group: Any = None) -> list[torch.Tensor]:
    """``[payload of sources[0], payload of sources[1], ...]`` (1-D uint8 tensors) on every rank:
    only the ranks in ``sources`` send (``payload`` elsewhere: ignored, may be None), each one's
    bytes once, at their own size (no padding to the largest). A collective: every rank calls it."""
    if world == 1:
        return [payload]
    import torch.distributed as dist
    mine = payload if rank in sources else torch.zeros(0, dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64), group=group)
    out = []
    for src in sources:
        buf = mine if src == rank else torch.empty(int(sizes[src]), dtype=torch.uint8)
        if buf.numel():
            dist.broadcast(buf, src=src, group=group)
        out.append(buf)
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


def all_reduce_tensor_sum(t: torch.Tensor, world: int) -> torch.Tensor:
    """The element-wise sum of a CPU tensor ``t`` over ranks (a copy; reduced in float64, so rows that
    only one rank filled come back exactly; a CPU tensor takes the gloo side of the process group)."""
    if world == 1:
        return t
    import torch.distributed as dist
    out = t.detach().to(torch.float64).clone()
    dist.all_reduce(out)
    return out.to(t.dtype)


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


def _untied_vocab_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The input embedding and the output projection when they hold separate matrices ([V, h] each);
    none when tied (one Parameter cannot belong to two FSDP units, so a tied pair stays in the root)."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is None or head is None or head.weight is emb.weight:
        return []
    return [emb, head]


def shard_causal_lm(model: torch.nn.Module, *, bf16: bool) -> torch.nn.Module:
    """FSDP2-shard ``model`` in place over all ranks: one unit per decoder layer, one each for an
    untied input embedding and lm_head, and the root (the final norm; a tied embedding).

    The root unit is gathered for the whole forward and backward; with the untied [V, h] matrices
    in it (Qwen2.5-32B: 2 × 152064 × 5120) both stayed gathered in bf16 through the backward and
    their gradients were reduced together in one fp32 buffer. As their own units each is gathered
    only around its own use and reduced alone.

    ``bf16``: parameters are gathered and computed in bf16, gradients reduced in fp32; the
    sharded master weights keep their own dtype (fp32). Returns ``model`` (now an FSDPModule).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    for layer in _decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
    for module in _untied_vocab_modules(model):
        fully_shard(module, mp_policy=mp)
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

