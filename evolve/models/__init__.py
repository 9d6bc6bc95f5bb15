"""Model access: sentence embeddings (:mod:`.embed`), role-based LLM calls (:mod:`.llm`) and
their test doubles (:mod:`.testing`). Importing this package loads neither torch nor litellm.

Owns :func:`sqlite_connection`, the on-disk store shared by the embedding cache, the LLM request
cache and the LLM call log. Invariants: connections are pooled per (file, schema): a thread
borrows one for one transaction and gives it back, so a connection is used by one thread at a
time and the connections open are bounded by the transactions in flight, never by the threads
that ever ran (a connection kept per thread outlived its thread: Python 3.11's sqlite3
connection sits in a reference cycle with its statement cache, so only the cyclic collector
closed it, and a process of short-lived thread pools ran out of file descriptors). Up to
:data:`MAX_IDLE` connections per pool stay open between transactions (closing the last
connection to a WAL file checkpoints and fsyncs it, which made every logged call cost ~12 ms),
and only for the :data:`MAX_FILES` pools used last: using another closes the idle connections
of the least recently used one (a worker process that evaluates run after run, each with its
own cache folder, once kept every run's connections open until ``select`` failed above 1024
descriptors). Borrowing and giving back take no lock (deque ``append`` / ``pop`` are atomic);
only finding a pool does, and a forked child gets a fresh lock and an empty pool table: the
parent's connections are never used, nor closed, after ``fork``. WAL journal and a busy
timeout, so several worker processes can read and write one file.

Owns :func:`open_wal`, the one way a SQLite file of the project is opened for use (the pools
here and the run's event index, :mod:`evolve.evolution.store`; only :func:`set_aside`'s quick
check of a damaged file opens one plainly): a busy timeout of :data:`BUSY_TIMEOUT_S`
and the WAL journal. SQLite's switch to WAL ignores the busy timeout while another connection
holds a write transaction on the file in its old journal mode, which is what happens when
several connections open one *new* file at once: a loser got "database is locked" at once
(seen as a failed plan call under 16 concurrent model calls). So the switch alone is retried
until it succeeds or the same timeout is spent (``tests/test_connections.py``).

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
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

T = TypeVar("T")

BUSY_TIMEOUT_S = 60.0
_CORRUPT_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes)
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)
DAMAGE_LOG = logging.getLogger("evolve.damage")

MAX_IDLE = 4
"""Connections per pool kept open between transactions; more, borrowed at once, are closed when
given back."""
MAX_FILES = 8
"""Pools (files) that keep idle connections; the least recently used beyond these is closed."""
_Key = tuple[str, str]  # (path, schema)
_pools: OrderedDict[_Key, deque[sqlite3.Connection]] = OrderedDict()  # idle ones, by last use
_pools_lock = threading.Lock()  # protects the table, not the pools
_inherited: list[object] = []  # a forked child's copy of the parent's pools: never touched


def _forget_after_fork() -> None:
    """In a forked child: the parent's pools are kept alive, unused (closing one would
    checkpoint the parent's WAL file under it), and the table starts empty."""
    global _pools_lock
    _pools_lock = threading.Lock()
    _inherited.append(dict(_pools))
    _pools.clear()


os.register_at_fork(after_in_child=_forget_after_fork)

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


@contextmanager
def sqlite_connection(path: Path, schema: str) -> Iterator[sqlite3.Connection]:
    """A connection to ``path`` with ``schema`` (idempotent DDL) applied, lent to this thread for
    one transaction: ``with sqlite_connection(path, schema) as conn:`` commits on success and
    rolls back on error, then gives the connection back to its pool."""
    key = (str(path), schema)
    pool = _pool(key)
    try:
        conn = pool.pop()
    except IndexError:
        conn = _connect(path, schema)
    try:
        with conn:
            yield conn
    finally:
        _give_back(key, pool, conn)


def _pool(key: _Key) -> deque[sqlite3.Connection]:
    """The pool of ``key``, now the most recently used; the pools beyond :data:`MAX_FILES`
    leave the table and their idle connections are closed (a lent one when given back)."""
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = deque()
        _pools.move_to_end(key)
        evicted = [_pools.popitem(last=False)[1] for _ in range(len(_pools) - MAX_FILES)]
    for old in evicted:
        _close_idle(old)
    return pool


def _close_idle(pool: deque[sqlite3.Connection]) -> None:
    """Close the idle connections of a pool that left the table."""
    while True:
        try:  # a borrower may take one meanwhile: it closes it when giving it back
            conn = pool.pop()
        except IndexError:
            return
        conn.close()


def open_wal(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection to ``path`` with the busy timeout, in WAL mode; a switch to WAL that finds
    the file busy is retried (with jitter) for up to :data:`BUSY_TIMEOUT_S`."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=check_same_thread)
    try:
        for attempt in Retrying(
            retry=retry_if_exception(_is_busy),
            wait=wait_random_exponential(multiplier=0.005, max=0.25),
            stop=stop_after_delay(BUSY_TIMEOUT_S),
            reraise=True,
        ):
            with attempt:
                conn.execute("PRAGMA journal_mode=WAL")
    except BaseException:
        conn.close()
        raise
    return conn


def _is_busy(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.OperationalError)
        and code is not None
        and (code & 0xFF in _BUSY_CODES)
    )


def _connect(path: Path, schema: str) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    # lent to one thread at a time, but given back (and perhaps closed) by whichever borrowed it
    conn = open_wal(path, check_same_thread=False)
    try:
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(schema)
    except BaseException:
        conn.close()
        raise
    return conn


def _give_back(key: _Key, pool: deque[sqlite3.Connection], conn: sqlite3.Connection) -> None:
    """Keep ``conn`` idle in ``pool``, unless the pool is full or was closed meanwhile."""
    if _pools.get(key) is pool and len(pool) < MAX_IDLE:
        pool.append(conn)
        if _pools.get(key) is not pool:  # the pool left the table meanwhile
            _close_idle(pool)
    else:
        conn.close()


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
    """Close this process's idle connections to ``path`` (one lent out now is closed when given
    back); the next use opens the file again."""
    with _pools_lock:
        pools = [_pools.pop(k) for k in [k for k in _pools if k[0] == str(path)]]
    for pool in pools:
        _close_idle(pool)


def set_aside(path: Path) -> Path | None:
    """Move a damaged SQLite file (and its ``-wal`` / ``-shm``) to ``<name>.corrupt-<time>``,
    after closing this process's connections to it; returns the new name, or None when the file
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
