"""``dapo export RUN --to DIR``: a run's checkpoint as a Hugging Face model directory.

Writes the policy of checkpoint ``--step S`` (default: the run's latest; ``--step 0`` is the model it
started from) into ``DIR``: ``config.json``, the weights as ``model.safetensors``,
``generation_config.json``, the tokenizer's files, and ``dapo_export.json`` (which run, step and
checkpoint it came from). ``DIR`` loads with ``transformers.AutoModelForCausalLM.from_pretrained(DIR)``
and is a model dir for ``dapo eval DIR --config RUN/config.yaml`` (the run's prompts and caps).
RUN may also be a checkpoint dir (``<run>/checkpoints/step_NNNNNN``).

The checkpoint is loaded exactly as ``dapo eval`` loads it (its files verified against their
checksums first, :mod:`dapo.train.checkpoint`) and saved as the run saves its final model
(``dapo.train.checkpoint.save_final_model``); ``--dtype train_dtype`` (default) keeps the tensors bit for
bit, ``bfloat16`` halves them. A sharded checkpoint (``shards/``, written by several processes) is
loaded by as many processes as you start: ``python -m torch.distributed.run --nproc_per_node 2 -m
dapo.cli export RUN --to DIR`` (rank 0 writes); one process is refused with that command.

Atomic: the directory is written as ``DIR.tmp`` and renamed to ``DIR`` when complete, so an
interrupted export leaves no half-written ``DIR`` (the next export removes the leftover
``DIR.tmp``). An existing non-empty ``DIR`` is refused unless ``--force``, which replaces it. Every
bad input (not a run, no such step, a damaged checkpoint, ``DIR`` taken) is one ``error: ...`` line,
exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

from dapo.helptext import help_text

__all__ = ["ExportError", "export", "main"]

MARKER = ".dapo-export"
"""Written first into ``DIR.tmp``: a leftover tmp dir with it is an interrupted export (removed), one
without it is someone's directory (refused)."""

EXAMPLES = """examples:
  dapo export runs/runs/RUN_DIR --to exported/my-policy                 # the latest checkpoint
  dapo export runs/runs/RUN_DIR --step 30 --to exported/step30 --dtype bfloat16
  dapo eval exported/step30 --config runs/runs/RUN_DIR/config.yaml --protocol dapo
"""


class ExportError(ValueError):
    """A bad run, step, checkpoint or output dir: one ``error:`` line, exit 2."""


def _sharded_refusal(ckpt: Path, argv: list[str]) -> str:
    import shlex
    return (f"{ckpt}: a sharded (DCP) checkpoint, written by several processes; one process cannot load it: "
            f"start several, e.g. python -m torch.distributed.run --nproc_per_node 2 -m dapo.cli export "
            f"{' '.join(shlex.quote(a) for a in argv)}")


def _check_to(to: Path, force: bool) -> Path:
    """The temporary sibling ``DIR.tmp`` to write into (a leftover export's removed); ExportError if ``to``
    is taken (without --force) or ``DIR.tmp`` is not ours."""
    if to.exists() and not to.is_dir():
        raise ExportError(f"--to {to}: exists and is not a directory")
    if to.is_dir() and any(to.iterdir()) and not force:
        raise ExportError(f"--to {to}: exists and is not empty; pass --force to replace it")
    tmp = to.with_name(to.name + ".tmp")
    if tmp.exists() or tmp.is_symlink():
        if not (tmp.is_dir() and not tmp.is_symlink() and (tmp / MARKER).is_file()):
            raise ExportError(f"{tmp}: exists and is not a leftover of dapo export (no {MARKER}); move it away")
    return tmp


def _publish(tmp: Path, to: Path) -> None:
    """fsync ``tmp``'s files, then rename it to ``to`` (an existing ``to`` is moved aside first and removed after)."""
    from dapo.train.checkpoint import _fsync_dir, _fsync_files
    _fsync_files(p for p in tmp.rglob("*") if p.is_file())
    _fsync_dir(tmp)
    old = None
    if to.is_dir() and any(to.iterdir()):       # --force: the old one goes only once the new one is whole
        old = to.with_name(f".{to.name}.old-{os.getpid()}")
        os.rename(to, old)
    elif to.is_dir():
        to.rmdir()
    try:
        os.rename(tmp, to)
    except OSError:
        if old is not None:
            os.rename(old, to)                  # the old one back under its name
        raise
    _fsync_dir(to.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export(target_spec: str, step: int | None, to: str | Path, *, dtype: str = "train_dtype", force: bool = False,
           argv: list[str] | None = None) -> dict[str, Any]:
    """Export checkpoint ``step`` of the run (or the checkpoint dir) ``target_spec`` into ``to``; every rank of
    a sharded load calls this, rank 0 writes. Returns dapo_export.json's dict. ExportError on bad input."""
    from dapo.commands.eval import EvalInputError, resolve_target
    to = Path(to).expanduser()
    try:
        target = resolve_target(target_spec, step)
    except EvalInputError as exc:
        raise ExportError(str(exc)) from None
    if target.kind == "model":
        raise ExportError(f"{target_spec}: not a run dir (config.yaml + checkpoints/) nor a checkpoint dir "
                          f"(checkpoints/step_NNNNNN): nothing to export")
    from dapo.dist.distributed import launcher_world_size
    if target.checkpoint is not None and (target.checkpoint / "shards").is_dir() and launcher_world_size() == 1:
        raise ExportError(_sharded_refusal(target.checkpoint, argv or [target_spec, "--to", str(to)]))
    run, dest = target.run_dir.resolve(), to.resolve()
    if dest == run or run.is_relative_to(dest) or dest.is_relative_to(run):
        raise ExportError(f"--to {to}: inside the run dir {target.run_dir} or holding it; a run dir keeps only "
                          f"what its run writes (dapo train refuses other files when it resumes): pick a DIR "
                          f"outside it")
    tmp = _check_to(to, force)
    from dapo.config import ConfigError, load_config
    try:
        cfg = load_config(target.run_dir / "config.yaml")
    except ConfigError as exc:
        raise ExportError(str(exc)) from None
    with _no_progress_bars():
        return _export(cfg, target, tmp, to, dtype)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' "Loading weights" / "Writing model shards" bars off while this runs (two lines of noise
    on stderr each; the export prints its own line)."""
    from transformers.utils import logging as hf_logging
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _export(cfg, target, tmp: Path, to: Path, dtype: str) -> dict[str, Any]:
    from dapo.commands.eval import _model
    from dapo.dist.distributed import final_state_dict
    from dapo.train.checkpoint import CheckpointError, save_final_model
    rank = int(os.environ.get("RANK", "0") or 0)
    try:
        policy, tokenizer, model_path, grad_step = _model(cfg, target)   # dapo eval's loader: checksums first
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    state_dict = final_state_dict(policy.module)     # every rank (a sharded model is gathered to rank 0)
    info = {"run_dir": str(target.run_dir.resolve()), "run_id": target.run_dir.name, "step": target.step or 0,
            "grad_step": grad_step, "checkpoint": str(target.checkpoint.resolve()) if target.checkpoint else None,
            "base_model": cfg.model.path, "dtype": cfg.model.train_dtype if dtype == "train_dtype" else dtype}
    if rank != 0:
        return info
    if tmp.exists():
        shutil.rmtree(tmp)                            # an interrupted export's (it has the marker)
    tmp.mkdir(parents=True)
    (tmp / MARKER).write_text(json.dumps({"pid": os.getpid()}) + "\n")
    try:
        save_final_model(policy.module, state_dict, tmp, dtype=dtype)
        if not (tmp / "generation_config.json").is_file() and getattr(policy.module, "generation_config", None):
            policy.module.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "dapo_export.json").write_text(json.dumps(info, indent=1) + "\n")
        _publish(tmp, to)
    except Exception as exc:  # noqa: BLE001 -- a full disk, a write refused: one line; DIR is as it was
        why = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        raise ExportError(f"--to {to}: could not write ({why}); {tmp} is left for the next export to remove") \
            from None
    (to / MARKER).unlink()     # complete: the marker only ever named a tmp dir
    return info


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dapo export", description=help_text(__doc__, None), epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="a run dir (<output>/runs/<run id>) or a checkpoint dir of one")
    p.add_argument("--step", type=int, help="the checkpoint's rollout step (default: the latest; 0 = the model the "
                                            "run started from)")
    p.add_argument("--to", required=True, metavar="DIR", help="the model directory to write (must not exist or "
                                                              "be empty, unless --force)")
    p.add_argument("--dtype", choices=("train_dtype", "bfloat16"), default="train_dtype",
                   help="floating tensors as trained, bit for bit (train_dtype, default) or in bfloat16")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    from dapo.cli import parse_or_usage
    got = parse_or_usage(parser(), argv, EXAMPLES)
    if got is None:
        return 2
    argv, a = got
    try:
        info = export(a.run, a.step, a.to, dtype=a.dtype, force=a.force, argv=argv)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0") or 0) == 0:
        print(f"[dapo] exported {info['run_dir']} step {info['step']} (grad step {info['grad_step']}, "
              f"{info['dtype']}) to {a.to}")
        print(f"  load: transformers.AutoModelForCausalLM.from_pretrained({str(a.to)!r})")
        print(f"  evaluate: dapo eval {a.to} --config {Path(info['run_dir']) / 'config.yaml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
