"""Model access: sentence embeddings (:mod:`.embed`), role-based LLM calls (:mod:`.llm`) and
their test doubles (:mod:`.testing`). Importing this package loads neither torch nor litellm.

Owns :func:`sqlite_connection`, the on-disk store shared by the embedding cache, the LLM request
cache and the LLM call log. Invariants: one connection per (process, thread, file, schema), opened
on first use and kept open (closing the last connection to a WAL file checkpoints and fsyncs it,
which made every logged call cost ~12 ms); WAL journal and a busy timeout, so several worker
processes can read and write one file; a connection is never used after ``fork`` (the pid is part
of the key).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

BUSY_TIMEOUT_S = 60.0

_local = threading.local()


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
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(schema)
        conns[key] = conn
    return conn
