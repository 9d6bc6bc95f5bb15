"""The runtime's own memory store (the folder :func:`evolve.open_memory` keeps) as a user-format
dataset: each scope's (user's) session log becomes one conversation.

Read-only, beside a running runtime: the store's lock is not taken and nothing in the store is
created, truncated or written, so a runtime holding the store open goes on serving and adding.
Each log is read whole at one moment (:func:`evolve.runtime.log.scan`): the import holds every
session acknowledged before that moment; it stops at the last whole record (a session being
added is not read; the next import has it), and a damaged record with whole ones after it is
skipped and named with its byte offset, the rest kept. A session an ``add`` logged and then
took back (its indexing failed) is read if the import looked in between.

Names: a scope's folder is named by the sha256 of the scope id
(:func:`evolve.runtime.store.scope_key`) and the id is stored nowhere, so it cannot be
recovered: each conversation is named by its scope's folder (32 hex digits; ``scope_key(id)``
names the folder of a known id), and the import says so in a note. Conversations go in the
order of their folder names.

Keeps: every session in log order, its id, date, and messages (ids, roles, contents) as the
memory received them; empty messages too. An empty id (the runtime takes one) becomes
``log-<n>`` for a session (``n`` its place in the log) and ``<session id>.<k>`` for a message.

Skips, counted: dates that are not ISO 8601 (the runtime takes any text; the session is kept,
undated); a date before an earlier dated session of its scope (kept undated: the log's order is
the order the memory saw); messages over the format's content limit (and a session left with no
message); damaged records; records being written (or a torn tail the runtime drops on its next
open); scopes with no session.

Problems (the import fails, one line each): a source that is not a store, a log that is not a
session log or cannot be read, ``per_chat`` (a store's conversations are its users already).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from contract.types import Segment
from evolve.datasets.types import Conversation
from evolve.datasets.usercheck import parse_date
from evolve.datasets.userformat import Invalid
from evolve.importers.common import ImportCounts, Imported, run_import, unique_messages
from evolve.runtime.log import LogError, scan
from evolve.runtime.store import MemoryStoreError, scope_logs


def import_store(source: Path, name: str, *, per_chat: bool = False) -> Imported:
    """The store at ``source`` as a dataset named ``name`` (see the module's docstring)."""
    return run_import("store", _read, source, name, per_chat)


def _read(source: Path, name: str, per_chat: bool, tally: ImportCounts) -> list[Conversation]:
    if per_chat:
        raise Invalid(["--per-chat: a store's conversations are its users (one per scope)"])
    try:
        logs = scope_logs(source)
    except (MemoryStoreError, OSError) as exc:
        raise Invalid([str(exc) if isinstance(exc, MemoryStoreError) else
                       f"{source}: cannot read ({exc.strerror or exc})"]) from None  # fmt: skip
    conversations = []
    for key, path in logs:
        sessions = _scope(key, path, tally)
        if sessions:
            conversations.append(Conversation(key, unique_messages(sessions, tally)))
        else:
            tally.skip("scopes with no session")
    if conversations:
        tally.notes.append("a scope id is not recoverable (its folder is named by its sha256): "
                           "conversations are named by their scope folders")  # fmt: skip
    return conversations


def _scope(key: str, path: Path, tally: ImportCounts) -> list[Segment]:
    """One scope's sessions, ready for the format (see the module's docstring)."""
    try:
        read = scan(path)
    except FileNotFoundError:
        return []
    except LogError as exc:
        where, _, what = str(exc).partition(": ")
        tally.problem(where, what or "not a PrisMem session log")
        return []
    except OSError as exc:
        tally.problem(str(path), f"cannot read ({exc.strerror or exc})")
        return []
    tally.skip("damaged records", len(read.damaged))
    for at, why in read.damaged:
        tally.notes.append(f"scope {key}: the record at byte {at} of its log is damaged "
                           f"({why}): skipped")  # fmt: skip
    if read.unread:
        tally.skip("records being written")
        tally.notes.append(f"scope {key}: the {read.unread} bytes after its last whole record "
                           "were not read (a session being added, or a torn tail)")  # fmt: skip
    out = []
    last: datetime | None = None
    for n, s in enumerate(read.sessions):
        date = s.date if isinstance(s.date, str) else None
        when = parse_date(date) if date is not None else None
        if date is not None and when is None:
            tally.skip("dates not ISO 8601")
            date = None
        elif when is not None and last is not None and when < last:
            tally.skip("dates out of order")
            date, when = None, None
        last = when or last
        sid = s.session_id or f"log-{n}"
        kept = (tally.message(m.id or f"{sid}.{k}", m.role, m.content, drop_empty=False)
                for k, m in enumerate(s.messages))  # fmt: skip
        messages = [m for m in kept if m is not None]
        if messages:
            out.append(Segment(sid, date, tuple(messages)))
        else:
            tally.skip("sessions with no message kept")
    return out
