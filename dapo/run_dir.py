"""A run directory: what it may hold, whether a config may resume it, and one process at a time.

    run_dir_for(cfg)              ``<output_dir>/runs/<name>-<hash>``: where ``dapo train`` puts a run
                                  (a sweep's jobs use ``<output>/runs/<hash>``, the run id alone)
    check_run_dir(cfg, run_dir)   before anything is written: the directory is new, empty, or holds a
                                  run of this config (its ``config.yaml`` has the same run id, and no
                                  resource-only key differs unless ``allow_resource_change``); a
                                  directory holding anything a run does not write is not a run dir
    hold_run_dir(run_dir)         an exclusive lock on ``<run_dir>/run.lock`` for as long as the run
                                  lives; a second process gets :class:`RunDirBusy` naming the holder
                                  (after a bounded wait when the holder is on another host), a file
                                  system without locks :class:`RunDirNoLocks` saying so
    run_dir_holder(run_dir)       who holds that lock now (``dapo runs``: running vs stopped), asked
                                  without taking it

Both raise a :class:`~dapo.config.ConfigError` (one line, exit 2 in ``dapo train``).

The lock is a POSIX record lock (``fcntl.lockf``), not ``flock``: it belongs to the process, so a
child forked by the trainer (a math-verify worker, a data loader) never holds it, and the kernel
drops it when the process dies however it dies (``kill -9``, a Slurm requeue), so a requeued or
resumed job always gets it. Only rank 0 of a multi-process run takes it (the other ranks share the
directory with it). A POSIX lock is released when its process closes *any* descriptor of the file,
so this process never opens ``run.lock`` a second time (:func:`hold_run_dir` is re-entrant instead).

On a shared file system a lock can outlive its holder: after a node failure the server keeps the dead
client's lock until its lease or grace period ends (minutes). So a holder on *another host* (what the
lock file says) is waited for, at most ``FOREIGN_HOLDER_WAIT_S``, before :class:`RunDirBusy`: a
requeued job landing on a new node then starts once the old lock lapses. A holder on this host is
alive (the kernel drops a dead process's lock at once): busy at once. A file system with no locks at
all (``ENOLCK``, ``ENOSYS``, ``EOPNOTSUPP``; :func:`dapo.file_lock.lock_failure`) is said as such.

Pure standard library plus :mod:`dapo.config`, :mod:`dapo.file_lock` and :mod:`dapo.store_checks`: no
torch, nothing imported that writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from dapo.config import Config, ConfigError, build_config, config_diff, config_hash, show
from dapo.file_lock import lock_failure, no_locks_message
from dapo.yaml_io import safe_yaml_file

__all__ = ["RunDirBusy", "RunDirNoLocks", "run_dir_for", "check_run_dir", "hold_run_dir", "run_dir_holder", "LOCK_FILE", "RUN_ENTRIES"]

LOCK_FILE = "run.lock"
FOREIGN_HOLDER_WAIT_S = 300.0   # how long a holder on another host is waited for (a stale lock of a dead node)
FOREIGN_HOLDER_POLL_S = 5.0
# What a run (dapo train, a sweep job) writes at the top of its directory.
RUN_ENTRIES = frozenset({"config.yaml", "checkpoints", "mlflow_run.json", "summary.json", "final_model",
                         "eval_records", "engine.log", ".engine-logging.json", LOCK_FILE, "job.json",
                         "requeues.json", "failed.json"})
_RUN_ENTRY_RE = re.compile(r"\.launch-config\.node\d+\.yaml|\..+\.\d+\.tmp"     # per-node configs, atomic writes,
                           r"|engine\.rank\d+\.log|\.engine-logging\.rank\d+\.json")   # per-rank engine logs


def run_dir_for(cfg: Config) -> Path:
    """``<output_dir>/runs/<name>-<hash>``: the same resolved config → the same directory."""
    return Path(cfg.output_dir) / "runs" / f"{cfg.name}-{config_hash(cfg)}"


class RunDirBusy(ConfigError):
    """Another process is training into this run directory."""


class RunDirNoLocks(ConfigError):
    """The run directory's file system cannot lock ``run.lock`` (no locks there, or another lock error)."""


def _show_value(v: Any) -> str:
    return show(v, 60)


def _changes(diff: dict[str, tuple[Any, Any]], limit: int = 6) -> str:
    items = [f"{k} ({_show_value(a)} in the run, {_show_value(b)} now)" for k, (a, b) in diff.items()]
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def check_run_dir(cfg: Config, run_dir: str | os.PathLike, *, allow_resource_change: bool = False) -> None:
    """Refuse (ConfigError) to train ``cfg`` into ``run_dir`` unless it is new, empty, or this config's run.

    Reads only: the directory listing and ``config.yaml``."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir}: exists and is not a directory")
    try:
        names = sorted(p.name for p in run_dir.iterdir())
    except OSError as exc:
        raise ConfigError(f"run directory {run_dir}: cannot list it ({exc.strerror})") from None
    foreign = [n for n in names if n not in RUN_ENTRIES and not _RUN_ENTRY_RE.fullmatch(n)]
    if foreign:
        raise ConfigError(f"run directory {run_dir} is not empty and is not a run directory (it holds "
                          f"{', '.join(map(repr, foreign[:3]))}{' ...' if len(foreign) > 3 else ''}, which no run "
                          f"writes); a run would overwrite files there: give a new or empty --run-dir")
    stored_path = run_dir / "config.yaml"
    if not stored_path.is_file():
        return
    try:
        stored = build_config(safe_yaml_file(stored_path) or {}, str(stored_path))
    except ConfigError as exc:
        raise ConfigError(f"run directory {run_dir}: its config.yaml is not a config this version reads "
                          f"({exc}); give a new --run-dir") from None
    diff = config_diff(stored, cfg)
    if set(diff["run"]) == {"train.rollout_steps"}:
        was, now = diff["run"]["train.rollout_steps"]
        raise ConfigError(f"run directory {run_dir} holds a run of {was} rollout steps; a run cannot be extended in "
                          f"place to {now}: train.rollout_steps is part of its identity (run id "
                          f"{config_hash(stored)}, its MLflow params). Train the {now}-step run as a run of its "
                          f"own (omit --run-dir: it gets its own directory and run id)")
    if diff["run"]:
        raise ConfigError(f"run directory {run_dir} holds run {config_hash(stored)}, whose config differs from this "
                          f"one (run id {config_hash(cfg)}) in keys that change its numbers: {_changes(diff['run'])}; "
                          f"resuming would mix two configs in one run. Omit --run-dir (each config gets its own "
                          f"directory) or give a new one")
    _check_store(cfg, run_dir)
    if diff["resources"] and not allow_resource_change:
        raise ConfigError(f"run directory {run_dir}: resource-only keys differ from the run's config: "
                          f"{_changes(diff['resources'])}; they do not change the run's numbers: pass "
                          f"--allow-resource-change to resume with them")


def _check_store(cfg: Config, run_dir: Path) -> None:
    """The run's MLflow run (``mlflow_run.json``) lives in the store this config logs to: resuming
    into another store (a changed ``output_dir`` or ``logging.tracking_uri``) would log to a run id
    that store does not have."""
    from dapo.store_checks import default_store_uri, same_store
    from dapo.yaml_io import redact
    try:
        was = json.loads((run_dir / "mlflow_run.json").read_text()).get("tracking_uri")
    except (OSError, ValueError, AttributeError):
        return
    now = cfg.logging.tracking_uri or default_store_uri(cfg.output_dir)
    if isinstance(was, str) and was and not same_store(was, now):
        raise ConfigError(f"run directory {run_dir} logs to the MLflow store {redact(was)} (its mlflow_run.json), "
                          f"but this config logs to {redact(now)} (output_dir / logging.tracking_uri): its MLflow "
                          f"run is not there. Resume with the run's store, or give a new --run-dir")


_HELD: dict[str, int] = {}   # resolved run dir → the descriptor of its lock file, in this process


def _holder_words(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return []


def _holder(path: Path) -> str:
    """What the lock file says about its holder (another process wrote it): ``pid N on HOST``."""
    words = _holder_words(path)
    if words and words[0].isdigit():
        return f"pid {words[0]}" + (f" on {show(words[1], 80)}" if len(words) > 1 else "")
    return "a process that has not written its pid yet"


def _holder_host(path: Path) -> str | None:
    """The host the lock file names (None when it names none)."""
    words = _holder_words(path)
    return words[1] if len(words) > 1 and words[0].isdigit() else None


# struct flock as fcntl(F_GETLK) reads and writes it (l_type, l_whence, l_start, l_len, l_pid), per platform
_FLOCK_LAYOUT = {"linux": ("hhqqi", (0, 1, 2, 3, 4)), "darwin": ("qqihh", (3, 4, 0, 1, 2))}


def run_dir_holder(run_dir: str | os.PathLike) -> str | None:
    """Who holds ``<run_dir>/run.lock`` now: ``"pid N on HOST"`` (what the holder wrote), or None when
    nobody does, or when it cannot be told (no lock file, a platform without a known ``struct flock``).

    It asks the kernel (``F_GETLK``) without taking the lock, so a run starting at that moment is never
    refused because of the question. The current process's own run dirs are answered from memory: it
    must not open their lock file (closing any descriptor of it would release its lock)."""
    run_dir = Path(run_dir)
    if str(run_dir.resolve()) in _HELD:
        return f"pid {os.getpid()} (this process)"
    layout = next((v for k, v in _FLOCK_LAYOUT.items() if sys.platform.startswith(k)), None)
    path = run_dir / LOCK_FILE
    if layout is None or not path.is_file():
        return None
    import fcntl
    import struct
    fmt, order = layout
    fields = [0] * 5
    fields[order[0]], fields[order[1]] = fcntl.F_WRLCK, os.SEEK_SET   # "could I take all of it for writing?"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        got = struct.unpack(fmt, fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(fmt, *fields)))
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if got[order[0]] == fcntl.F_UNLCK else _holder(path)


def _take_lock(fd: int, path: Path, run_dir: Path, *, foreign_wait_s: float, poll_s: float,
               log: Callable[[str], Any]) -> None:
    """Take the POSIX lock on ``fd`` (``path``), or raise: :class:`RunDirBusy` (a holder on this host, or
    one on another host still there after ``foreign_wait_s``), :class:`RunDirNoLocks` (no locks on this
    file system, or another lock error). The caller closes ``fd`` on a raise."""
    import fcntl
    import socket
    deadline = None
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            kind = lock_failure(exc)
            if kind == "unsupported":
                raise RunDirNoLocks(no_locks_message(path, exc)) from None
            if kind == "other":
                raise RunDirNoLocks(f"run directory {run_dir}: cannot lock {LOCK_FILE} ({type(exc).__name__}: "
                                  f"{exc.strerror or exc})") from None
        host = _holder_host(path)
        busy = (f"run directory {run_dir} is in use by {_holder(path)} (another dapo train of this run); two "
                f"processes must not train into one run: wait for it to end or stop it")
        if host is None or host == socket.gethostname() or foreign_wait_s <= 0:
            raise RunDirBusy(busy)
        now = time.monotonic()
        if deadline is None:
            deadline = now + foreign_wait_s
            log(f"[dapo] run directory {run_dir} is held by {_holder(path)}, another host; a lock can outlive a "
                f"failed node for minutes: waiting up to {foreign_wait_s:.0f} s for it")
        elif now > deadline:
            raise RunDirBusy(f"{busy} (still held after {foreign_wait_s:.0f} s of waiting)")
        time.sleep(poll_s)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def hold_run_dir(run_dir: str | os.PathLike, *, enabled: bool = True, foreign_wait_s: float = FOREIGN_HOLDER_WAIT_S,
                 poll_s: float = FOREIGN_HOLDER_POLL_S, log: Callable[[str], Any] = _stderr) -> Iterator[None]:
    """Hold ``<run_dir>/run.lock`` (created with the directory) while the body runs; re-entrant.

    ``enabled=False`` (ranks other than 0) holds nothing. Raises :class:`RunDirBusy` naming the
    holder's pid at once if another process on this host holds it; a holder on another host is waited
    for, at most ``foreign_wait_s`` (polling every ``poll_s``), with one line through ``log`` when the
    wait begins. A file system without locks is :class:`RunDirNoLocks` saying so, not "in use"."""
    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if not enabled or key in _HELD:
        yield
        return
    import socket
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _take_lock(fd, path, run_dir, foreign_wait_s=foreign_wait_s, poll_s=poll_s, log=log)
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        _HELD[key] = fd
        yield
    finally:
        _HELD.pop(key, None)
        os.close(fd)   # releases the lock (the kernel does it too if the process dies)
