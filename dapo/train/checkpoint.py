"""Atomic, rotating checkpoints: model, optimizer, scheduler, RNG, data cursor, counters.

Layout: ``<run_dir>/checkpoints/step_000012/{model.pt, optim.pt, state.json}``. A
checkpoint is written into a temporary sibling directory, its files fsynced, and
published with one ``os.rename`` (then the directory is fsynced); a directory without
``state.json`` is never read. A crash mid-write (kill, full disk, unwritable directory)
leaves the previous checkpoints intact and loadable; the error (:class:`CheckpointError`)
names the path. Leftover temporary directories of a killed writer are removed by the
next save; old checkpoints are renamed away before they are deleted, so a kill during
rotation never leaves a half-deleted ``step_*`` directory that looks complete.

Integrity: before a checkpoint is published, the SHA-256 of each of its files goes into
``checksums.json`` (the files are hashed by all ranks, each its share); loading verifies them
first, so a file damaged after the save (flipped bytes, cut short, removed) is a
:class:`CheckpointError` naming the checkpoint and the file, never silently resumed.
:func:`load_latest` resumes from the newest intact checkpoint: a damaged newer one is moved
aside to ``.damaged_step_NNNNNN`` with one line saying so. Checkpoints written before
checksums existed are loaded unverified.

Everything is read back with ``torch.load(weights_only=True)``: no pickle of arbitrary
objects is ever loaded (the numpy RNG state is stored as a tensor for that reason).

Sharded (FSDP2) models: every rank calls :func:`save_checkpoint` / :func:`load_checkpoint`
at the same point. The model and optimizer go through ``torch.distributed.checkpoint``
(``shards/``: each rank writes and later reads only its own shards, also under a different
number of ranks); each rank's RNG state goes to ``rng_rank<r>.pt``; rank 0 writes the
scheduler (``extra.pt``) and ``state.json``. All ranks write into one temporary directory
(named by rank 0), then rank 0 alone publishes it with the same rename, after every rank
has reported its files durable; a failure on any rank fails the save on all of them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dapo import faults

__all__ = ["CheckpointError", "PendingCheckpoint", "save_checkpoint", "latest_checkpoint", "load_checkpoint",
           "load_latest", "checkpoint_problem", "rng_state", "set_rng_state", "save_final_model"]

SHARDS = "shards"   # torch.distributed.checkpoint directory of a sharded checkpoint
CHECKSUMS = "checksums.json"   # {relative file path: sha256 hex} of every other file of a checkpoint


class CheckpointError(RuntimeError):
    """Writing or reading a checkpoint failed; the message names the path."""


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
            "torch": torch.get_rng_state()}


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    kind, keys, pos, has_gauss, cached = s["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(s["torch"])


def _finite(model: torch.nn.Module) -> bool:
    """All weights finite (this rank's shards for a sharded model)."""
    return all(torch.isfinite(_local(p)).all().item() for p in model.state_dict().values()
               if torch.is_floating_point(p))


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def _sharded(model: torch.nn.Module) -> bool:
    from dapo.dist.distributed import is_sharded
    return is_sharded(model)


def save_checkpoint(run_dir: str | os.PathLike, step: int, *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, state: dict[str, Any],
                    keep_last: int = 2, extra: dict[str, Any] | None = None,
                    async_save: bool = False) -> "Path | PendingCheckpoint":
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep_last``.

    Refuses (CheckpointError) to write non-finite weights. A sharded model: every rank
    calls this (see the module docstring). ``extra``: more tensors to keep with the optimizer state
    (:func:`load_extra` reads them back), e.g. the lagged weights of ``train.staleness``; a sharded
    model's ranks each keep their own (their shards), read back only by as many ranks.

    ``async_save`` (``checkpoint.async_save``): copy the state to CPU memory now, write the files in the
    background and return a :class:`PendingCheckpoint`; its :meth:`~PendingCheckpoint.finish` (every
    rank, at the same point) waits for them, then publishes and rotates exactly as a synchronous save
    does. Until then the checkpoint does not exist for a resume (a crash falls back to the previous one).
    """
    if _sharded(model):
        pending = _start_sharded(Path(run_dir), step, model=model, optimizer=optimizer, scheduler=scheduler,
                                 state=state, keep_last=keep_last, extra=extra, async_save=async_save)
    else:
        pending = _start(Path(run_dir), step, model=model, optimizer=optimizer, scheduler=scheduler, state=state,
                         keep_last=keep_last, extra=extra, async_save=async_save)
    return pending if async_save else pending.finish()


class PendingCheckpoint:
    """A checkpoint whose files are being written into its temporary directory (in the background with
    ``async_save``). :meth:`finish` waits for the writer, then publishes it under its final name (sharded:
    every rank calls it; rank 0 publishes once all ranks' files are durable) and rotates the old ones."""

    def __init__(self, root: Path, tmp: Path | None, final: Path, step: int, keep_last: int,
                 wait: Any, *, world: int = 1, rank: int = 0, fsync_on_publish: bool = True):
        self.root, self.tmp, self.final, self.step, self.keep_last = root, tmp, final, step, keep_last
        self._wait, self.world, self.rank = wait, world, rank
        # sharded: each rank's files are already durable when its wait returns (DCP's writer fsyncs the
        # shards and .metadata, the rank its own small files), so the publish only renames
        self.fsync_on_publish = fsync_on_publish

    def finish(self) -> Path:
        from dapo.dist.distributed import all_gather_object, broadcast_object
        tag = f"rank {self.rank}: " if self.world > 1 else ""   # which rank failed, where there are several
        err = None
        try:
            self._wait()
        except Exception as exc:  # noqa: BLE001 - the writer's error, reported below (on every rank)
            err = tag + (str(exc) if isinstance(exc, _WriteFailed) else f"{type(exc).__name__}: {exc}")
        errors = [e for e in all_gather_object(err, self.world) if e]
        sums: dict[str, str] = {}
        if not errors:   # every rank's files are written: each rank hashes its share of them
            share, err = _hash_share(self.tmp, self.rank, self.world)
            gathered = all_gather_object((share, tag + err if err else None), self.world)
            errors = [e for _, e in gathered if e]
            sums = {k: v for part, _ in gathered for k, v in part.items()}
        if not errors and self.rank == 0:
            try:
                _write_checksums(self.tmp, sums)
                _publish(self.root, self.tmp, self.final, self.step, fsync_files=self.fsync_on_publish)
            except Exception as exc:  # noqa: BLE001
                errors = [f"{tag}{type(exc).__name__}: {exc}"]
        errors = broadcast_object(errors, self.world)
        if errors:
            if self.rank == 0 and self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            raise CheckpointError(f"{self.final}: could not write checkpoint ({'; '.join(errors)}); "
                                  f"the previous checkpoint is kept")
        if self.rank == 0:
            _rotate(self.root, self.keep_last)
        return self.final


class _WriteFailed(Exception):
    """A checkpoint writer's error, already described."""


def _failed(message: str) -> Any:
    """A wait function that reports ``message`` (a write that failed before anything was left to wait for)."""
    def wait() -> None:
        raise _WriteFailed(message)
    return wait


def _in_background(write: Any) -> Any:
    """Run ``write()`` in a thread; returns the wait function that joins it and re-raises its error."""
    import threading
    box: list[BaseException] = []

    def run() -> None:
        try:
            write()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            box.append(exc)
    t = threading.Thread(target=run, name="dapo-checkpoint-writer", daemon=True)
    t.start()

    def wait() -> None:
        t.join()
        if box:
            raise box[0]
    return wait


def _cpu_copy(obj: Any) -> Any:
    """``obj`` with every tensor copied to the CPU (nested dicts, lists and tuples): a snapshot that
    training may no longer change."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


def _start(run_dir: Path, step: int, *, model, optimizer, scheduler, state, keep_last: int,
           extra: dict[str, Any] | None, async_save: bool) -> PendingCheckpoint:
    """One process: the temporary directory, then its files (now, or from a CPU copy in the background)."""
    root = run_dir / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    if not _finite(model):
        raise CheckpointError(f"{final}: refusing to checkpoint non-finite (NaN/inf) weights; "
                              f"the previous checkpoint is kept")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp_step_*"):   # a killed writer's leftovers (one writer per run dir)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    except OSError as exc:
        raise CheckpointError(f"{final}: could not write checkpoint ({type(exc).__name__}: {exc}); "
                              f"the previous checkpoint is kept") from exc
    files = {"model.pt": model.state_dict(),
             "optim.pt": {"optimizer": optimizer.state_dict(),
                          "scheduler": scheduler.state_dict() if scheduler is not None else None,
                          "rng": rng_state(), **({"extra": extra} if extra else {})}}
    text = json.dumps(state, indent=1, default=str)
    if async_save:
        files = _cpu_copy(files)

    def write() -> None:
        torch.save(files["model.pt"], tmp / "model.pt")
        faults.kill_point("KILL_IN_CHECKPOINT", step)   # test hook: die with the checkpoint half written
        torch.save(files["optim.pt"], tmp / "optim.pt")
        (tmp / "state.json").write_text(text)
    # synchronous: finish() runs write() itself (an OSError of a full disk, or torch's RuntimeError
    # wrapping one, becomes its CheckpointError naming the path, the temporary directory removed)
    return PendingCheckpoint(root, tmp, final, step, keep_last, _in_background(write) if async_save else write)


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: Path) -> list[str]:
    """A checkpoint directory's files (relative POSIX paths, sorted), its checksum file aside."""
    return sorted(f.relative_to(directory).as_posix() for f in directory.rglob("*")
                  if f.is_file() and f.name != CHECKSUMS)


def _hash_share(directory: Path, rank: int, world: int) -> tuple[dict[str, str], str | None]:
    """SHA-256 of this rank's share (every ``world``-th file from ``rank``) of ``directory``'s files;
    (digests, None) or ({}, the error)."""
    try:
        return {name: _file_digest(directory / name) for name in _files(directory)[rank::world]}, None
    except OSError as exc:
        return {}, f"hashing its files: {type(exc).__name__}: {exc}"


def _write_checksums(directory: Path, sums: dict[str, str]) -> None:
    with open(directory / CHECKSUMS, "w") as fh:
        json.dump(dict(sorted(sums.items())), fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def checkpoint_problem(path: str | os.PathLike, rank: int = 0, world: int = 1) -> str | None:
    """What is wrong with checkpoint ``path``'s files (of several ranks, this rank's share of them), or
    None: a file its ``checksums.json`` lists is missing or differs from its checksum, or the checksum
    file is unreadable. A checkpoint written before checksums existed is not checked (None)."""
    path = Path(path)
    if not (path / "state.json").is_file():
        return "state.json is missing"
    if not (path / CHECKSUMS).exists():
        return None
    try:
        sums = json.loads((path / CHECKSUMS).read_text())
        if not isinstance(sums, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError) as exc:
        return f"{CHECKSUMS} is unreadable ({type(exc).__name__}: {exc})"
    for name in sorted(sums)[rank::world]:
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        try:
            if _file_digest(f) != sums[name]:
                return f"{name} does not match its checksum (the file was changed or damaged after the save)"
        except OSError as exc:
            return f"{name} is unreadable ({type(exc).__name__}: {exc})"
    return None


def _publish(root: Path, tmp: Path, final: Path, step: int, *, fsync_files: bool = True) -> None:
    """Make ``tmp``'s files durable (unless their writers already did: ``fsync_files=False``), then give
    it the name ``final`` with one rename."""
    if fsync_files:
        _fsync_files(p for p in tmp.rglob("*") if p.is_file())   # the bytes durable before the name
    old = None
    if final.exists():   # the same step again (rare): move it aside, never delete it first
        old = root / f".old_step_{step:06d}_{os.getpid()}"
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _rotate(root: Path, keep_last: int) -> None:
    done = sorted(p for p in root.glob("step_*") if (p / "state.json").is_file())
    for i, old in enumerate(done[:-keep_last]):
        trash = root / f".del_{old.name}_{os.getpid()}_{i}"
        try:
            os.rename(old, trash)   # atomic: a kill mid-delete leaves no half-deleted step_* directory
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    for trash in root.glob(".del_step_*"):   # leftovers of a kill during an earlier rotation
        shutil.rmtree(trash, ignore_errors=True)
    for trash in root.glob(".old_step_*"):
        shutil.rmtree(trash, ignore_errors=True)


def _start_sharded(run_dir: Path, step: int, *, model, optimizer, scheduler, state, keep_last: int,
                   extra: dict[str, Any] | None, async_save: bool) -> PendingCheckpoint:
    """Every rank: its model/optimizer shards (DCP; with ``async_save`` staged to CPU memory and written
    in the background, coordinated over a gloo group of its own so that the training's collectives are
    never interleaved with it), its RNG and its ``extra``; rank 0: the scheduler and the state."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from dapo.dist.distributed import all_gather_object, background_group, broadcast_object

    rank, world = dist.get_rank(), dist.get_world_size()
    root = run_dir / "checkpoints"
    final = root / f"step_{step:06d}"
    if not all(all_gather_object(_finite(model), world)):
        raise CheckpointError(f"{final}: refusing to checkpoint non-finite (NaN/inf) weights; "
                              f"the previous checkpoint is kept")
    tmp, err = None, None
    if rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.glob(".tmp_step_*"):   # a killed job's leftovers (one job per run dir)
                shutil.rmtree(stale, ignore_errors=True)
            tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
            tmp.mkdir()
        except OSError as exc:
            err = f"{type(exc).__name__}: {exc}"
    tmp, err = broadcast_object((tmp, err), world)
    wait: Any = lambda: None   # noqa: E731
    if err is None:
        try:
            msd, osd = get_state_dict(model, optimizer)
            if async_save:
                future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / SHARDS),
                                        process_group=background_group())
                wait = future.result
            else:
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / SHARDS))   # a collective
            faults.kill_point("KILL_IN_CHECKPOINT", step)   # test hook: die with the checkpoint half written
            own = [tmp / f"rng_rank{rank}.pt"]
            torch.save({"rng": rng_state(), **({"extra": extra, "world": world} if extra else {})}, own[0])
            if rank == 0:
                own += [tmp / "extra.pt", tmp / "state.json"]
                torch.save({"scheduler": scheduler.state_dict() if scheduler is not None else None}, own[1])
                own[2].write_text(json.dumps(state, indent=1, default=str))
            # each rank makes its own files durable; DCP's FileSystemWriter (sync_files=True, the default)
            # already fsynced every shard file and .metadata, so rank 0 does not read them all again
            _fsync_files(own)
        except Exception as exc:  # noqa: BLE001 - reported on every rank by finish()
            err = f"{type(exc).__name__}: {exc}"
    if err is not None:
        wait = _failed(err)
    return PendingCheckpoint(root, tmp, final, step, keep_last, wait, world=world, rank=rank, fsync_on_publish=False)


def save_final_model(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], out: str | os.PathLike,
                     dtype: str = "bfloat16") -> Path:
    """``model``'s gathered ``state_dict`` as an HF directory ``out``, floating tensors in ``dtype``
    ("bfloat16", or "train_dtype": as stored); ``config.json``'s ``dtype`` names the stored one, so vLLM
    and ``from_pretrained`` load it as saved. Rank 0 only (the state dict is already gathered)."""
    out = Path(out)
    if dtype == "bfloat16":   # one cast per storage: tied weights stay one tensor (saved once)
        cast: dict[tuple, torch.Tensor] = {}
        out_sd: dict[str, torch.Tensor] = {}
        for k, v in state_dict.items():
            key = (v.data_ptr(), tuple(v.shape))
            if torch.is_floating_point(v) and key not in cast:
                cast[key] = v.to(torch.bfloat16)
            out_sd[k] = cast.get(key, v) if torch.is_floating_point(v) else v
        state_dict = out_sd
    model.save_pretrained(out, state_dict=state_dict)
    if dtype == "bfloat16":
        cfg_file = out / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["dtype"] = "bfloat16"
        cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def _fsync_files(paths: Any) -> None:
    """fsync each file of ``paths`` (an OSError is the caller's checkpoint error)."""
    for f in paths:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _complete(run_dir: str | os.PathLike) -> list[Path]:
    """The published checkpoint directories of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / "state.json").is_file())


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    done = _complete(run_dir)
    return done[-1] if done else None


def load_latest(run_dir: str | os.PathLike, *, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None,
                required: tuple[str, ...] = (), log: Any = print) -> tuple[Path | None, dict[str, Any] | None]:
    """Load the newest intact checkpoint of ``run_dir`` (every rank of a sharded model calls this);
    returns (its path, its ``state.json``), or (None, None) when there is none.

    A newer checkpoint that fails its checks (:func:`load_checkpoint`) is moved aside to
    ``checkpoints/.damaged_<name>`` (kept for inspection, never read again) with one line through ``log``,
    and the one before is tried. If no checkpoint is intact nothing is moved and CheckpointError lists
    what is wrong with each."""
    done = _complete(run_dir)
    damaged: list[tuple[Path, str]] = []
    for ckpt in reversed(done):
        try:
            state = load_checkpoint(ckpt, model=model, optimizer=optimizer, scheduler=scheduler, required=required)
        except CheckpointError as exc:
            damaged.append((ckpt, _reason(exc, ckpt)))
            continue
        for bad, reason in damaged:
            aside = _move_aside(bad, model)
            log(f"checkpoint {bad} is damaged ({reason}); moved to {aside.name}, resuming from {ckpt.name} instead")
        return ckpt, state
    if damaged:
        raise CheckpointError(f"{Path(run_dir) / 'checkpoints'}: no intact checkpoint ("
                              + "; ".join(f"{p.name}: {r}" for p, r in damaged)
                              + "); move the checkpoints directory aside to start this run over")
    return None, None


def _reason(exc: CheckpointError, ckpt: Path) -> str:
    """The part of a load error after the checkpoint's path."""
    text = str(exc)
    return text[len(str(ckpt)) + 2:] if text.startswith(f"{ckpt}: ") else text


def _move_aside(ckpt: Path, model: torch.nn.Module) -> Path:
    """Rename a damaged checkpoint to a hidden name no loader reads (rank 0; every rank waits for it)."""
    from dapo.dist.distributed import barrier
    aside = ckpt.parent / f".damaged_{ckpt.name}"
    if aside.exists():
        aside = ckpt.parent / f".damaged_{ckpt.name}_{os.getpid()}"
    world = 1
    if _sharded(model):
        import torch.distributed as dist
        world = dist.get_world_size()
        if dist.get_rank() != 0:
            barrier(world)
            return aside
    os.rename(ckpt, aside)
    barrier(world)
    return aside


def _state(path: Path, required: tuple[str, ...]) -> dict[str, Any]:
    """``state.json``, with the keys ``required`` (a KeyError naming the file otherwise)."""
    state = json.loads((path / "state.json").read_text())
    if not isinstance(state, dict):
        raise ValueError("state.json is not a JSON object")
    missing = [k for k in required if k not in state]
    if missing:
        raise KeyError(f"state.json has no {', '.join(repr(k) for k in missing)}")
    return state


def load_checkpoint(path: str | os.PathLike, *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    restore_rng: bool = True, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a checkpoint into the given objects; return its ``state.json`` dict.

    Its files are first checked against ``checksums.json`` (:func:`checkpoint_problem`), and
    ``state.json`` must hold the keys ``required``: anything wrong is a CheckpointError naming the path
    and the file, before any object is changed by a damaged file.

    A sharded checkpoint (``shards/``) into a sharded model: every rank calls this and reads
    its own shards of the model and optimizer (any number of ranks), and its own RNG state.
    """
    path = Path(path)
    if (path / SHARDS).is_dir():
        return _load_sharded(path, model=model, optimizer=optimizer, scheduler=scheduler,
                             restore_rng=restore_rng, required=required)
    problem = checkpoint_problem(path)
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    try:
        state = _state(path, required)
        model.load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
        extra = _load_extra(path / "optim.pt")
        if optimizer is not None:
            optimizer.load_state_dict(extra["optimizer"])
        if scheduler is not None and extra.get("scheduler") is not None:
            scheduler.load_state_dict(extra["scheduler"])
        if restore_rng:
            set_rng_state(extra["rng"])
    except Exception as exc:  # OSError, a truncated zip (RuntimeError), bad JSON, a missing key, unpickling refused
        raise CheckpointError(f"{path}: could not load checkpoint ({_why(exc)})") from exc
    return state


def _why(exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{Path(exc.filename).name} is missing"
    if isinstance(exc, KeyError):
        return str(exc.args[0]) if exc.args and str(exc.args[0]).startswith("state.json") else f"a key is missing: {exc}"
    return f"{type(exc).__name__}: {exc}"


def load_extra(path: str | os.PathLike) -> dict[str, Any]:
    """The ``extra`` tensors :func:`save_checkpoint` kept with checkpoint ``path`` ({} if none); of a
    sharded checkpoint, this rank's, which needs the number of ranks that wrote it (else CheckpointError)."""
    path = Path(path)
    if (path / SHARDS).is_dir():
        import torch.distributed as dist
        rank, world = dist.get_rank(), dist.get_world_size()
        own = path / f"rng_rank{rank}.pt"
        d = torch.load(own, map_location="cpu", weights_only=True) if own.is_file() else {}
        saved = d["world"] if "world" in d else torch.load(path / "rng_rank0.pt", map_location="cpu",
                                                           weights_only=True).get("world")
        if saved is not None and saved != world:
            raise CheckpointError(f"{path}: its per-rank state (e.g. train.staleness's lagged weights, kept as "
                                  f"shards) was written by {saved} processes; resume it with {saved}, not {world}")
        return d.get("extra") or {}
    p = path / "optim.pt"
    return _load_extra(p).get("extra") or {} if p.is_file() else {}


def _load_sharded(path: Path, *, model, optimizer, scheduler, restore_rng: bool,
                  required: tuple[str, ...] = ()) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from dapo.dist.distributed import all_gather_object

    if not _sharded(model):
        raise CheckpointError(f"{path}: a sharded checkpoint (written by several processes); load it with "
                              f"the same launch.fsdp setting (a sharded model)")
    rank, world = dist.get_rank(), dist.get_world_size()
    problems = [p for p in all_gather_object(checkpoint_problem(path, rank, world), world) if p]
    if problems:   # the same answer on every rank (each checked its share of the files)
        raise CheckpointError(f"{path}: {problems[0]}")
    try:
        state = _state(path, required)
        msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
        target = {"model": msd, **({"optim": osd} if optimizer is not None else {})}
        dcp.load(target, checkpoint_id=str(path / SHARDS))
        set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=target["model"],
                       optim_state_dict=target.get("optim", {}))
        extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
        own = path / f"rng_rank{rank}.pt"
        rng = torch.load(own if own.is_file() else path / "rng_rank0.pt", map_location="cpu", weights_only=True)
        err = None
    except Exception as exc:  # OSError, bad JSON, a missing shard or key, unpickling refused
        err = _why(exc)
    errors = [e for e in all_gather_object(err, world) if e]
    if errors:   # every rank raises, so that every rank falls back to the same checkpoint
        raise CheckpointError(f"{path}: could not load checkpoint ({errors[0]})")
    if scheduler is not None and extra.get("scheduler") is not None:
        scheduler.load_state_dict(extra["scheduler"])
    if restore_rng:
        set_rng_state(rng["rng"])
    return state


def _load_extra(path: Path) -> dict[str, Any]:
    """optim.pt with ``weights_only=True``; checkpoints written before the numpy RNG state
    was stored as a tensor hold numpy arrays, allowed explicitly (no arbitrary globals)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - only the legacy numpy case is retried
        if "numpy" not in str(exc):
            raise
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core.multiarray import _reconstruct
    safe = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(safe):
        return torch.load(path, map_location="cpu", weights_only=True)
