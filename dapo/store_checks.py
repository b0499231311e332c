"""Can an MLflow store be used? One-line answers, shared by preflight, the tracker and the analysis.

Pure checks with no MLflow import: :func:`sqlite_file_problem` looks at an ``mlruns.db`` file
(a directory, an unreadable file, a foreign or damaged file, a header cut short);
:func:`server_problem` asks a tracking server (``/health``) or a database (``SELECT 1``) within a
timeout. Both return None when the store can be used, else one line with every password masked.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from pathlib import Path

from dapo.yaml_io import redact

__all__ = ["WRITE_ERRNOS", "write_problem", "writable_problem", "SQLITE_MAGIC", "SQLITE_HEADER_BYTES", "scheme", "sqlite_file_problem", "server_problem",
           "SERVER_SCHEMES", "default_store_uri", "same_store", "sqlite_path"]

SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_HEADER_BYTES = 100          # an SQLite file's fixed header; a shorter non-empty file is damaged
SERVER_SCHEMES = ("http", "https", "postgresql", "postgres", "mysql", "mssql")


def scheme(uri: str) -> str:
    """The scheme of a tracking URI, lower case, without a ``+driver`` suffix
    (``postgresql+psycopg2://...`` → ``postgresql``); ``""`` for a plain path, ``C:\\...`` included."""
    head, sep, _ = uri.partition(":")
    if not sep or (len(head) == 1 and head.isalpha()) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", head):
        return ""
    return head.split("+")[0].lower()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def default_store_uri(output_dir: str | Path) -> str:
    """The store a run logs to without ``logging.tracking_uri``: ``sqlite:///<output_dir>/mlruns.db``
    (the directory made absolute; nothing is created)."""
    return f"sqlite:///{Path(output_dir).expanduser().resolve() / 'mlruns.db'}"


def same_store(a: str, b: str) -> bool:
    """Whether two tracking URIs name one store (sqlite files compared as resolved paths)."""
    pa, pb = sqlite_path(a), sqlite_path(b)
    if pa is not None and pb is not None:
        return pa.resolve() == pb.resolve()
    return a.rstrip("/") == b.rstrip("/")


def sqlite_file_problem(db: Path, *, missing_ok: bool = True) -> str | None:
    """Why the file ``db`` cannot be an MLflow SQLite store, or None.

    A missing file is fine when ``missing_ok`` (the run creates it; a broken symbolic link is not);
    an empty file is a new database. Otherwise the file must start with SQLite's magic, hold its
    whole 100-byte header, and answer ``PRAGMA schema_version`` opened read-only (or be locked by a
    writer, or have a hot journal that the next writer rolls back)."""
    db = Path(db)
    if not db.exists():
        if db.is_symlink():
            return f"{db} is a broken symbolic link"
        return None if missing_ok else f"{db} does not exist"
    if db.is_dir():
        return f"{db} is a directory, not an SQLite database"
    try:
        with open(db, "rb") as f:
            head = f.read(SQLITE_HEADER_BYTES)
    except OSError as exc:
        return f"{db} cannot be read ({exc.strerror or exc})"
    if not head:
        return None
    damaged = f"{db} is not an SQLite database (a damaged or foreign file); move it aside to start a new store"
    if not head.startswith(SQLITE_MAGIC) or len(head) < SQLITE_HEADER_BYTES:
        return damaged
    try:
        conn = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True, timeout=5.0)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        # "locked": a writer holds it right now (readable, just busy); "readonly": a writer killed
        # mid-transaction left a hot journal (mlruns.db-journal) that only a read-write open rolls
        # back, as the run's own connection will (a killed multi-process run leaves one)
        if "locked" in str(exc) or "readonly" in str(exc):
            return None
        return damaged
    except sqlite3.DatabaseError:
        return damaged
    return None


def server_problem(uri: str, timeout_s: float = 10.0) -> str | None:
    """Why the tracking server or database behind ``uri`` does not answer within ``timeout_s``, or None.

    ``http(s)://``: ``/health`` answers 200 (MLflow's own client would retry a dead server for
    minutes). ``postgresql://`` / ``mysql://`` / ``mssql://``: a connection runs ``SELECT 1``.
    Other schemes (``sqlite:///``, plain paths) need no server: None."""
    kind = scheme(uri)
    try:
        if kind in ("http", "https"):
            import urllib.request
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as r:
                if r.status != 200:
                    raise OSError(f"/health answered HTTP {r.status}")
        elif kind in ("postgresql", "postgres", "mysql", "mssql"):
            import sqlalchemy as sa
            args = {"connect_timeout": max(1, int(timeout_s))} if kind != "mssql" else {}
            eng = sa.create_engine(uri, connect_args=args)
            try:
                with eng.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
            finally:
                eng.dispose()
    except Exception as exc:  # noqa: BLE001 - every failure is one line
        orig = getattr(exc, "orig", None) or getattr(exc, "reason", None) or exc
        reason = " ".join(str(orig).split())[:300] or type(orig).__name__
        return f"tracking server {redact(uri)} does not answer ({type(orig).__name__}: {redact(reason)})"
    return None


WRITE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})
"""The OSErrors of an output that cannot take a write: no permission, a read-only file system, no space, a quota."""


def write_problem(exc: OSError, into: str | os.PathLike | None = None) -> str | None:
    """``cannot write FILE: REASON`` for an OSError of :data:`WRITE_ERRNOS` (``into DIR`` when the error names
    no file, as a full disk's at a write does), else None."""
    if exc.errno not in WRITE_ERRNOS:
        return None
    what = exc.filename or (f"into {into}" if into else "the output")
    return f"cannot write {what}: {exc.strerror or exc}"


def writable_problem(path: str | os.PathLike) -> str | None:
    """Why no file can be created in ``path`` (or in its nearest existing parent, where ``path`` would be
    made), or None: a read-only file system, a directory without write permission, a full disk. Probed by
    creating and removing one file, so it is named before a command writes anything."""
    import tempfile
    p = Path(path).expanduser()
    q = next((d for d in (p, *p.parents) if d.exists()), None)
    if q is None or not q.is_dir():
        return None                    # a file in the way: the command's own check names it
    try:
        fd, probe = tempfile.mkstemp(dir=q, prefix=".dapo-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        where = "" if q == p else f" (nothing is written: {q}, where it would be made, refuses)"
        return f"cannot write there ({exc.strerror}){where}"
    return None
