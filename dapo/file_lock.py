"""Exclusive advisory locks on a lock file (``fcntl.flock``), the one implementation.

Three places serialize processes on a file: the sweep's submission record (``dapo.sweep.launcher``), the
creation of a sqlite MLflow store (``dapo.tracking.tracker.store_lock``) and the build of a model-cache entry
(``dapo.models.build_lock``). A ``flock`` belongs to the open file description: it is released when the
descriptor is closed, and by the kernel when its process dies however it dies (``kill -9``, OOM).

(The run-dir lock, ``dapo.run_dir``, is deliberately not one of these: it is a POSIX record lock,
owned by the process rather than the descriptor, so a forked child never holds it.)

A failed lock call is one of two things, told apart by its errno (:func:`lock_failure`): another
process holds the lock (``EAGAIN`` / ``EWOULDBLOCK`` / ``EACCES``), or the file system has no locks
at all (``ENOLCK``, ``ENOSYS``, ``EOPNOTSUPP``: Lustre mounted without ``flock``, NFSv3 without
``lockd``), which :class:`NoLocksError` reports with what to do instead of "in use".
"""
from __future__ import annotations

import contextlib
import errno
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

BUSY_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
NO_LOCK_ERRNOS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


class NoLocksError(OSError):
    """The file system of a lock file does not support locks (the message says what to do)."""


def lock_failure(exc: OSError) -> str:
    """What a failed lock call means: ``"busy"`` (another process holds it), ``"unsupported"`` (this file
    system has no locks) or ``"other"``."""
    if exc.errno in BUSY_ERRNOS:
        return "busy"
    return "unsupported" if exc.errno in NO_LOCK_ERRNOS else "other"


def no_locks_message(path: str | os.PathLike, exc: OSError) -> str:
    """One line: ``path``'s file system refused a lock (``exc``), the usual causes, and what to do."""
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return (f"{path}: this file system does not support file locks ({name}: {exc.strerror}); Lustre mounted "
            f"without -o flock, or NFSv3 without lockd, does this. Put the output directory (and DAPO_LAB_CACHE) "
            f"on a file system with locks (node-local disk, or mount with -o flock), or ask the admins to enable them")


def try_flock(path: str | os.PathLike) -> int | None:
    """Open (create) ``path`` and take its exclusive ``flock`` without waiting: the descriptor holding
    it, or None when another process holds it. Closing the descriptor releases the lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        kind = lock_failure(exc)
        if kind == "busy":
            return None
        if kind == "unsupported":
            raise NoLocksError(no_locks_message(path, exc)) from None   # str(): the message alone
        raise
    return fd


@contextlib.contextmanager
def held_flock(path: str | os.PathLike, timeout_s: float | None = None,
               busy: Callable[[], Exception] | None = None, poll_s: float = 0.1) -> Iterator[int]:
    """Hold the exclusive ``flock`` on ``path`` (its parent directory created) for the ``with`` block;
    yields the descriptor. Waits for another holder, polling every ~``poll_s`` (jittered, so waiters do
    not move in step); past ``timeout_s`` seconds (None: forever) raises ``busy()`` (a ``TimeoutError``
    naming the path when None)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (fd := try_flock(path)) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise (busy() if busy is not None else
                   TimeoutError(f"{path}: held by another process for {timeout_s:.0f} s"))
        time.sleep(poll_s * (0.5 + random.random()))
    try:
        yield fd
    finally:
        os.close(fd)   # releases the lock
