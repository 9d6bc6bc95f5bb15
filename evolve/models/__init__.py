"""Model access: sentence embeddings (:mod:`.embed`), role-based LLM calls (:mod:`.llm`) and
their test doubles (:mod:`.testing`). Importing this package loads neither torch nor litellm.

Owns :func:`sqlite_connection`, the on-disk store shared by the embedding cache, the LLM request
cache and the LLM call log. Invariants: one connection per (process, thread, file, schema), opened
on first use and kept open (closing the last connection to a WAL file checkpoints and fsyncs it,
which made every logged call cost ~12 ms); WAL journal and a busy timeout, so several worker
processes can read and write one file; a connection is never used after ``fork`` (the pid is part
of the key).

Also owns how damaged files are handled everywhere: :func:`damaged` reports one in one line on
the ``evolve.damage`` logger (the CLI prints each such line once, as ``warning:``; a worker
process without handlers prints it bare), :func:`is_corrupt` tells a damaged SQLite file from a
busy or unopenable one, :func:`why` says in one line why a file did not load,
:func:`set_aside` moves a damaged file out of the way (never deleting it) so that a fresh one
can take its place, and :func:`cache_transaction` is the one way a *cache* file (embeddings, LLM
responses: contents that can be recomputed) is used: a damaged one is set aside and replaced.
The call log is a record, not a cache: a damaged log is an error, never silently replaced.

And owns the registry of test doubles, :data:`DOUBLES`: production code looks a double up by
name (:func:`double`) and never imports one; the tests fill it (importing
:mod:`evolve.models.testing` registers its doubles).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BUSY_TIMEOUT_S = 60.0
_CORRUPT_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes)
DAMAGE_LOG = logging.getLogger("evolve.damage")

_local = threading.local()

DOUBLES: dict[str, Callable[..., Any]] = {}
"""Test doubles by name (``scripted``: an LLM client answering from a script), filled by the
tests; see :func:`double`."""


def double(name: str) -> Callable[..., Any]:
    """The test double registered as ``name``; LookupError in one line when none is."""
    try:
        return DOUBLES[name]
    except KeyError:
        raise LookupError(
            f"no test double {name!r} is registered (tests register them by importing "
            "evolve.models.testing)"
        ) from None


def sqlite_connection(path: Path, schema: str) -> sqlite3.Connection:
    """This thread's open connection to ``path``, with ``schema`` (idempotent DDL) applied.

    Use it as ``with sqlite_connection(path, schema) as conn:`` — one transaction, committed on
    success and rolled back on error; the connection stays open.
    """
    conns: dict[tuple[int, str, str], sqlite3.Connection] = _local.__dict__.setdefault("conns", {})
    key = (os.getpid(), str(path), schema)
    conn = conns.get(key)
    if conn is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(schema)
        except BaseException:
            conn.close()
            raise
        conns[key] = conn
    return conn


def damaged(message: str) -> None:
    """Report a damaged file (and what was done about it) in one line."""
    DAMAGE_LOG.warning(" ".join(message.split()))


def why(exc: Exception) -> str:
    """One line on why a file did not load: pydantic's first error, or the OS error."""
    errors = getattr(exc, "errors", None)  # a pydantic ValidationError (pydantic not imported)
    if callable(errors) and isinstance(exc, ValueError):
        first, n = errors()[0], len(errors())
        where = ".".join(map(str, first["loc"]))
        more = f" (and {n - 1} more)" if n > 1 else ""
        return f"{where + ': ' if where else ''}{first['msg']}{more}"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def is_corrupt(exc: BaseException) -> bool:
    """Whether an SQLite error says the file itself is damaged (not busy, locked or unopenable)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.DatabaseError)
        and code is not None
        and code & 0xFF in (_CORRUPT_CODES)
    )


def _still_corrupt(path: Path) -> bool:
    """Whether the file now at ``path`` fails a quick check (another process may have replaced
    it already; a missing file is not corrupt)."""
    if not path.exists():
        return False
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
    try:
        return conn.execute("PRAGMA quick_check").fetchone()[0] != "ok"
    except sqlite3.DatabaseError as exc:
        if is_corrupt(exc):
            return True
        raise
    finally:
        conn.close()


def close_connections(path: Path) -> None:
    """Close this thread's open connections to ``path`` (the next use reopens the file)."""
    conns: dict[tuple[int, str, str], sqlite3.Connection] = _local.__dict__.setdefault("conns", {})
    for key in [k for k in conns if k[1] == str(path)]:
        conns.pop(key).close()


def set_aside(path: Path) -> Path | None:
    """Move a damaged SQLite file (and its ``-wal`` / ``-shm``) to ``<name>.corrupt-<time>``,
    after closing this thread's connections to it; returns the new name, or None when the file
    now at ``path`` is sound (another process set it aside first) and nothing was moved."""
    close_connections(path)
    if not _still_corrupt(path):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():  # never overwrite an earlier damaged copy
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            os.replace(source, f"{target}{suffix}")
    return target


def cache_transaction(
    path: Path, schema: str, what: str, work: Callable[[sqlite3.Connection], T]
) -> T:
    """``work`` in one transaction on the cache file at ``path``; when SQLite calls the file
    corrupt, it is set aside (said once, in one line naming ``what`` and the file) and ``work``
    runs again on a fresh cache."""
    try:
        with sqlite_connection(path, schema) as conn:
            return work(conn)
    except sqlite3.DatabaseError as exc:
        if not is_corrupt(exc):
            raise
        moved = set_aside(path)
        if moved is not None:
            damaged(f"{what} {path} is damaged ({exc}): moved to {moved.name}; "
                    "starting a fresh cache")  # fmt: skip
    with sqlite_connection(path, schema) as conn:
        return work(conn)
