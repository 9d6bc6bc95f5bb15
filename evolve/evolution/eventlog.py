"""A run's event log: the table ``events`` of its ``index.sqlite``.

Owns :class:`EventLog`, which the run store (:mod:`evolve.evolution.store`) holds for each run.

Invariants:

- Events live only here, in logging order; each is ``{"id", "ts", "kind", "data"}`` with
  ``data`` JSON, scrubbed of secrets (:func:`evolve.scrub.scrub_secrets`) before it is written.
- Every access is one transaction on a fresh connection, committed on success and closed
  afterwards (never a connection kept for the process's life: that would keep writing to an
  index file that was deleted). A stale WAL is never replayed into a new index.
- An index SQLite calls corrupt is moved aside (``index.sqlite.corrupt-<time>``), said once,
  and a fresh one started: the event log is lost, never a candidate or the run's state (they
  are in their files). A run from before may also hold a ``candidates`` table; nothing reads it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from evolve.models import damaged, is_corrupt, open_wal, set_aside
from evolve.scrub import scrub_secrets

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, kind TEXT NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_kind ON events (kind, id);
"""


class EventLog:
    """The event log in the SQLite file at ``path`` (created on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def log(self, kind: str, **data: Any) -> None:
        """Append an event (``data`` must be JSON; it is scrubbed of secrets)."""
        row = (time.time(), kind, json.dumps(scrub_secrets(data), ensure_ascii=False))
        self.transact(lambda c: c.execute("INSERT INTO events (ts, kind, data) VALUES (?, ?, ?)",
                                          row))  # fmt: skip

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Events in logging order, each ``{"id", "ts", "kind", "data"}``; optionally one kind."""
        sql = "SELECT id, ts, kind, data FROM events"
        args: tuple[str, ...] = ()
        if kind is not None:
            sql, args = sql + " WHERE kind = ?", (kind,)
        rows = self.transact(lambda c: c.execute(sql + " ORDER BY id", args).fetchall())
        return [{"id": i, "ts": ts, "kind": k, "data": json.loads(d)} for i, ts, k, d in rows]

    def transact(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` in one transaction on the index. An index SQLite calls corrupt is set aside,
        said once, and ``work`` runs on a fresh one."""
        try:
            with self._db() as conn:
                return work(conn)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            moved = set_aside(self.path)
            where = f"moved to {moved.name}" if moved else "replaced"
            damaged(f"run index {self.path} is unreadable ({exc}): {where} and rebuilt "
                    "(its event log is lost; the candidates are in their files)")  # fmt: skip
        with self._db() as conn:
            return work(conn)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A fresh connection for one transaction (committed on success), closed afterwards.

        Not :func:`evolve.models.sqlite_connection`: that keeps one connection per file for the
        process's lifetime, which would keep writing to an index file that was deleted.
        """
        if not self.path.exists():  # a stale WAL must not be replayed into a new index
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        conn = open_wal(self.path)
        try:
            conn.executescript(SCHEMA)
            with conn:
                yield conn
        finally:
            conn.close()
