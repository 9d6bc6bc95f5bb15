"""The LLM call log: the SQLite table ``calls`` that records every model call, and its readers.

Owns :data:`CALLS_SCHEMA` (the table ``calls`` and, beside it, the request cache's table
``responses``: a client's log and cache may be one file), :func:`append` (how
:class:`~evolve.models.llm.LLMClient` writes a call), :func:`read_rows` (how the run's spend is
read back, :mod:`evolve.evolution.budget`), :func:`read_rows_after` (the calls since a given
one, :mod:`evolve.models.spendcap`) and :func:`damaged_log`.

Invariants:

- The log is a record, not a cache: it only grows, and a damaged one is an :class:`LLMError`
  in one line (:func:`damaged_log`), never replaced silently, because it holds what a run
  spent (a cache file is set aside and replaced: :func:`evolve.models.cache_transaction`).
- Columns added after the first version (:data:`FAULT_COLUMNS`) are added to an older log
  when it is first written to, once per process and file; :func:`read_rows` reads whatever
  columns a log has, so a reader counts a missing one as 0.
- A call's ``purpose`` (what it is for: ``eval/extract``, ``cold_start/propose``) lives in the
  column ``stage``, the name every existing log has; rows are written and read as ``purpose``
  (:data:`_COLUMNS`), so no log needs a migration.
- Each transaction borrows a pooled connection (:func:`evolve.models.sqlite_connection`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evolve.models import is_corrupt, sqlite_connection

CALLS_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, role TEXT NOT NULL,
    stage TEXT NOT NULL, model TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, cost_usd REAL, latency_s REAL NOT NULL,
    cached INTEGER NOT NULL, request_hash TEXT NOT NULL, error TEXT,
    retries INTEGER NOT NULL DEFAULT 0, rate_limited INTEGER NOT NULL DEFAULT 0,
    timeouts INTEGER NOT NULL DEFAULT 0, repair INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS responses (
    request_hash TEXT PRIMARY KEY, text TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, model TEXT NOT NULL
);
"""
# The role of the one row a lost log's spend is rebuilt into (``evolve run --resume``)
REBUILT = "rebuilt"
# Columns added to ``calls`` after its first version: an older log gains them when written to.
FAULT_COLUMNS = ("retries", "rate_limited", "timeouts", "repair")
_migrated: set[tuple[int, str]] = set()
# A call's purpose is stored in the column ``stage`` (the name logs were created with; renaming it
# would need a migration of every existing log): rows are read and written with ``purpose``.
_COLUMNS = {"purpose": "stage"}
_FIELDS = {column: name for name, column in _COLUMNS.items()}


def _to_columns(record: dict[str, Any]) -> dict[str, Any]:
    return {_COLUMNS.get(name, name): value for name, value in record.items()}


class LLMError(RuntimeError):
    """A call failed for good: not configured, non-transient error, retries or repairs spent."""


def damaged_log(path: Path, exc: Exception) -> LLMError:
    """The error for a call log SQLite calls corrupt: the log records what a run spent, so it
    is never replaced silently (unlike a cache); the user decides."""
    return LLMError(
        f"call log {path} is damaged ({exc}); it records what the run spent, so it is not "
        "replaced: move it aside to continue (spend caps then count from zero)"
    )


def append(path: Path, record: dict[str, Any]) -> None:
    """Append one call (a :class:`~evolve.models.llm.UsageRecord` as a dict) to the log."""
    row = _to_columns(record)
    values = [int(v) if isinstance(v, bool) else v for v in row.values()]
    with _damage_said(path), _connection(path) as conn:
        conn.execute(
            f"INSERT INTO calls ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", values
        )


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every call in the log at ``path``, oldest first, with the columns the log has."""
    with _damage_said(path), sqlite_connection(path, CALLS_SCHEMA) as conn:
        cursor = conn.execute("SELECT * FROM calls ORDER BY id")
        names = [_FIELDS.get(d[0], d[0]) for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def read_rows_after(path: Path, last_id: int) -> list[dict[str, Any]]:
    """The calls logged after the one with id ``last_id`` (0: every call), oldest first."""
    with _damage_said(path), sqlite_connection(path, CALLS_SCHEMA) as conn:
        cursor = conn.execute("SELECT * FROM calls WHERE id > ? ORDER BY id", (last_id,))
        names = [_FIELDS.get(d[0], d[0]) for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


@contextmanager
def _damage_said(path: Path) -> Iterator[None]:
    """A corrupt log becomes :func:`damaged_log`'s error; any other SQLite error passes."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if not is_corrupt(exc):
            raise
        raise damaged_log(path, exc) from None


@contextmanager
def _connection(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection for one transaction, with :data:`FAULT_COLUMNS` added to an older log
    (once per process and file)."""
    with sqlite_connection(path, CALLS_SCHEMA) as conn:
        key = (os.getpid(), str(path))
        if key not in _migrated:
            _add_fault_columns(conn)
            _migrated.add(key)
        yield conn


def _add_fault_columns(conn: sqlite3.Connection) -> None:
    have = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
    for name in FAULT_COLUMNS:
        if name not in have:
            try:  # DDL: committed at once, outside the caller's transaction
                conn.execute(f"ALTER TABLE calls ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0")
            except sqlite3.OperationalError as exc:  # another process or thread added it first
                if "duplicate column" not in str(exc):
                    raise
