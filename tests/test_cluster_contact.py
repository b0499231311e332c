"""The process and file-system side of a first cluster run (issue 38, defects 2-6 and the checkpoint fsync
waste; issue 41, item 3): preemption reaching torchrun's ranks, a killed local job leaving nothing behind,
the example profile's environment, the compiled-engine toolchain check, locks on file systems without
them, a shared sqlite store under concurrent jobs, and who makes a sharded checkpoint durable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


# =========================================================================== sharded checkpoint: fsync once
def test_a_sharded_checkpoint_fsyncs_each_file_once_dcp_its_shards_each_rank_its_own(tmp_path, monkeypatch):
    """DCP's FileSystemWriter (sync_files=True) fsyncs every shard file and .metadata; rank 0's publish
    used to open and fsync every rank's files again (393 GB at 32B, serially, while the other ranks wait).
    Now each file of the published checkpoint is fsynced exactly once, before the rename that publishes it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dapo.checkpoint import SHARDS, save_checkpoint
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(_fd_path(fd))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        final = save_checkpoint(tmp_path / "run", 1, model=model, optimizer=opt, scheduler=None,
                                state={"rollout_step": 1})
    finally:
        dist.destroy_process_group()
    tmp_prefix = str(tmp_path / "run" / "checkpoints" / ".tmp_step_000001_")
    files = [f.relative_to(final).as_posix() for f in final.rglob("*") if f.is_file()]
    assert any(f.startswith(f"{SHARDS}/") and f.endswith(".distcp") for f in files), files
    assert f"{SHARDS}/.metadata" in files and "rng_rank0.pt" in files and "state.json" in files
    per_file: dict[str, int] = {}
    for p in synced:
        if p.startswith(tmp_prefix):                   # the temporary directory, before the publish
            rel = p[len(tmp_prefix):].split("/", 1)[1].replace(".metadata.tmp", ".metadata")   # DCP renames it
            per_file[rel] = per_file.get(rel, 0) + 1
    assert per_file == {f: 1 for f in files}, per_file
