"""SQLite connections of the LLM call log and request cache under many short-lived threads.

Many concurrent LLM calls, each judged on a fresh thread pool, once leaked one connection per
thread that ever ran: thread-kept connections outlived their threads until the
process ran out of file descriptors. The cyclic garbage collector is held off while the calls
run, so the count shows what is closed without it (a connection of Python 3.11 sits in a
reference cycle with its statement cache, which only that collector frees).

And a fresh file opened by many connections at once: SQLite's switch to WAL ignores the busy
timeout, so without a retry one of 16 concurrent plan calls failed with "database is locked".
"""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
from tenacity import wait_none

from evolve.models import MAX_FILES, MAX_IDLE, close_connections, open_wal, sqlite_connection
from evolve.models.clients import llm_client
from evolve.models.fake_server import FakeModelServer, FaultPlan, parse_rates
from evolve.models.llm import LLMError, ModelConfig, Models

ROUNDS = 6
THREADS = 8
FAULTS = "429:0.1,500:0.1,truncate:0.05,garbage:0.05"


def open_fds(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path`` itself."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return count


@pytest.fixture()
def no_cyclic_gc() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")


@needs_proc
def test_short_lived_thread_pools_do_not_leak_connections(
    tmp_path: Path, no_cyclic_gc: None
) -> None:
    log, cache = tmp_path / "llm-calls.sqlite", tmp_path / "llm-cache.sqlite"
    plan = FaultPlan(rates=parse_rates(FAULTS), retry_after=0.1, seed=1)
    with FakeModelServer(faults=plan) as server:
        judge = ModelConfig(model="openai/fake", api_base=server.base_url)
        client = llm_client(Models(judge=judge), log_path=log, cache_path=cache, concurrency=16)
        client.retry_wait = wait_none()

        def call(i: int) -> None:
            try:
                client.complete("judge", "s", f"prompt {i}")
            except LLMError:  # a call whose retries ran out is still logged
                pass

        for r in range(ROUNDS):
            with ThreadPoolExecutor(THREADS) as pool:  # fresh threads, joined at the end
                list(pool.map(call, range(r * THREADS, (r + 1) * THREADS)))
        served = server.stats().requests
    assert served >= ROUNDS * THREADS  # every call reached the server, some more than once
    # no transaction is in flight now: at most one round's worth of connections stays open
    assert open_fds(cache) <= THREADS and open_fds(log) <= THREADS, (
        f"{open_fds(cache)} connections to the cache, {open_fds(log)} to the log open after "
        f"{ROUNDS} rounds of {THREADS} threads"
    )


def is_open(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:  # closed
        return False
    return True


@needs_proc
def test_the_pool_keeps_few_idle_and_closes_what_a_closed_pool_lent(tmp_path: Path) -> None:
    path, schema = tmp_path / "x.sqlite", "CREATE TABLE IF NOT EXISTS t (x);"
    with ExitStack() as stack:  # borrowed at once: each transaction has its own connection
        lent = [stack.enter_context(sqlite_connection(path, schema)) for _ in range(MAX_IDLE + 3)]
        assert len({id(conn) for conn in lent}) == MAX_IDLE + 3
    assert sum(map(is_open, lent)) == MAX_IDLE  # given back: the extra ones are closed
    with sqlite_connection(path, schema) as conn:
        close_connections(path)  # the idle ones now, the lent one when given back
        assert [c for c in lent if is_open(c)] == [conn]
        conn.execute("INSERT INTO t VALUES (1)")
    assert not is_open(conn) and open_fds(path) == 0  # none left: SQLite closed every file
    with sqlite_connection(path, schema) as conn:  # opened again, the insert committed
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]


@needs_proc
def test_only_the_files_used_last_keep_idle_connections(tmp_path: Path) -> None:
    """A worker evaluates run after run, each with its own cache folder: the idle connections
    of files it no longer uses are closed, so its descriptors stay bounded (they once grew by
    ~30 per evaluation until ``select`` failed above 1024)."""
    schema = "CREATE TABLE IF NOT EXISTS t (x);"
    paths = [tmp_path / f"run{i}" / "llm-cache.sqlite" for i in range(MAX_FILES + 5)]
    for path in paths:
        with sqlite_connection(path, schema) as conn:
            conn.execute("INSERT INTO t VALUES (1)")
    still_open = [path.parent.name for path in paths if open_fds(path)]
    assert still_open == [path.parent.name for path in paths[-MAX_FILES:]]
    with sqlite_connection(paths[0], schema) as conn:  # an evicted file opens again
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)


def _writer_holds(path: Path, seconds: float) -> sqlite3.Connection:
    """Another connection in a write transaction on the fresh (rollback-journal) file at
    ``path``, committed after ``seconds``: the state in which a switch to WAL fails at once,
    busy timeout or not."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(seconds, lambda: other.execute("COMMIT")).start()
    return other


def test_a_fresh_file_waits_for_a_writer_before_switching_to_wal(tmp_path: Path) -> None:
    path, schema = tmp_path / "fresh.sqlite", "CREATE TABLE IF NOT EXISTS t (x);"
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # SQLite's own behaviour
        _writer_holds(path, 0.3)
        sqlite3.connect(path, timeout=30).execute("PRAGMA journal_mode=WAL")
    time.sleep(0.5)
    path.unlink()
    _writer_holds(path, 0.3)
    started = time.monotonic()
    with sqlite_connection(path, schema) as conn:  # waits for the writer, then switches
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        conn.execute("INSERT INTO t VALUES (1)")
    assert time.monotonic() - started >= 0.25
    other = tmp_path / "other.sqlite"
    _writer_holds(other, 0.3)
    conn = open_wal(other)  # the run store's index opens its file the same way
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
