"""The session log of one scope: every acknowledged session, append-only, on disk.

Owns the log file's format, :class:`SessionLog`, :func:`scan` (a read beside the writer),
:func:`salvage` (every whole record of a damaged log) and :func:`rewrite`. The log is the
store's source of truth: a memory snapshot (:mod:`.store`) is only a shortcut to replaying it.

Format: a 16-byte file header (:data:`MAGIC`), then records. A record is a 4-byte big-endian
payload length, the payload's 32-byte sha256, and the payload: one session as UTF-8 JSON
(``session_id``, ``date``, ``messages`` of ``id``, ``role``, ``content``).

Invariants:

- **Acknowledged means durable.** :meth:`SessionLog.append` returns only after the record is
  written in one ``write`` and ``fsync``'d (and the folder too, when the file was created), so
  a session whose ``add`` returned survives a kill -9 or a power cut.
- **A torn tail is dropped, never read.** A record that is short or whose checksum fails can
  only be the last one a killed process was writing (every earlier record was fsync'd before
  the next began): :meth:`SessionLog.open` truncates the file back to the end of the last whole
  record. A bad record followed by whole ones is damage, not a torn write: :class:`LogError`,
  and nothing is truncated.
- **No session twice.** A session id is in the log at most once: :meth:`append` of an id the
  log holds returns its position and writes nothing, so a caller that retries an ``add`` whose
  acknowledgement it lost does not double it.
- **A session the memory could not take is taken back.** :meth:`SessionLog.drop_last`
  truncates the log to before its last record (fsync'd), so an ``add`` that failed after its
  session was logged leaves the log as it was (a crash in between leaves the session logged,
  never half of it).
- One writer per log: callers serialise appends (the runtime holds the scope's lock); the
  file is opened with ``O_APPEND``.
- **Read beside the writer.** :func:`scan` reads a log read-only (nothing created, truncated
  or locked) while a runtime may be appending to it: it stops at the last whole record (a
  record being written is not read) and skips a damaged record, naming its byte offset.
- **Salvage resynchronises on the next whole record.** :func:`salvage` keeps every whole
  record, before and after a damaged one: after a bad record it takes the next offset where a
  whole record parses (its checksum holds and its payload is a session). Every payload begins
  with ``{"session_id":`` (:data:`PAYLOAD_START`) and that text never occurs inside one (JSON
  escapes a quote within a string), so only record starts are tried, and no record can be
  forged inside a payload: a record's length is under ``2**28``, so its first byte is a control
  byte, which the JSON of a payload always escapes. :meth:`SessionLog.open` uses the same rule
  to tell a torn tail (no whole record after it) from damage (whole records after it), so a
  damaged length that runs past the end of the file is refused, never truncated away.
- **Rewritten whole or not at all.** :func:`rewrite` replaces a log with the given sessions
  through a temporary file, fsync'd and renamed (:func:`evolve.files.write_atomic`): a crash
  leaves the old log or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.types import Message, Segment
from evolve.files import fsync_dir, write_atomic

MAGIC = b"PRISMEM-LOG-v1\n\0"
_HEAD = struct.Struct(">I32s")  # payload length, sha256 of the payload
MAX_RECORD = 1 << 28  # a session larger than 256 MiB is refused (and such a length is damage)
PAYLOAD_START = b'{"session_id":'  # how every record's payload begins (see :func:`encode`)


class LogError(Exception):
    """A log that cannot be read or written as it should be; the message is one line."""


@dataclass(frozen=True)
class Opened:
    """What :meth:`SessionLog.open` found: the sessions, and the bytes of torn tail dropped."""

    sessions: list[Segment]
    dropped_bytes: int


@dataclass(frozen=True)
class Scanned:
    """What :func:`scan` read: the whole sessions, the records skipped as damaged (their byte
    offset and what is wrong), and the bytes after the last whole record, not read."""

    sessions: list[Segment]
    damaged: list[tuple[int, str]]
    unread: int


@dataclass(frozen=True)
class Lost:
    """Bytes ``start`` to ``end`` (exclusive) of a log that hold no whole record: ``why`` the
    record at ``start`` is bad, and what can still be read of it (its length, its session
    id), to say what was lost."""

    start: int
    end: int
    why: str
    records: int | None  # 1 when the bad record's own length spans exactly these bytes
    session_id: str | None  # as its payload still reads, when it does


@dataclass(frozen=True)
class Salvaged:
    """What :func:`salvage` found in a log: every whole session, in order; the damaged byte
    ranges (records after them were kept); a torn tail (a last record cut short, which
    :meth:`SessionLog.open` drops); whether the file header is wrong."""

    sessions: list[Segment]
    lost: list[Lost]
    torn: int
    bad_header: bool

    @property
    def damaged(self) -> bool:
        """What :meth:`SessionLog.open` refuses (a torn tail it drops is not damage)."""
        return bool(self.lost) or self.bad_header


def encode(segment: Segment) -> bytes:
    """One session as a log record."""
    payload = json.dumps(
        {
            "session_id": segment.session_id,
            "date": segment.date,
            "messages": [[m.id, m.role, m.content] for m in segment.messages],
        },
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode("utf-8")
    if len(payload) > MAX_RECORD:
        raise LogError(f"a session of {len(payload)} bytes is over the log's {MAX_RECORD}")
    return _HEAD.pack(len(payload), hashlib.sha256(payload).digest()) + payload


def _decode(payload: bytes) -> Segment:
    data: Any = json.loads(payload.decode("utf-8"))
    messages = tuple(Message(str(i), str(r), str(c)) for i, r, c in data["messages"])
    return Segment(str(data["session_id"]), data["date"], messages)


def _session(payload: bytes) -> Segment | None:
    try:
        return _decode(payload)
    except (ValueError, KeyError, TypeError):
        return None


def rewrite(path: Path, sessions: list[Segment]) -> None:
    """Replace the log at ``path`` by one holding ``sessions``, whole or not at all."""
    data = b"".join([MAGIC, *(encode(s) for s in sessions)])
    write_atomic(path, data, mode=0o600)


class SessionLog:
    """One scope's session log; open it with :meth:`open`."""

    def __init__(self, path: Path, sessions: list[Segment], size: int) -> None:
        self.path = path
        self.sessions = sessions
        self._sizes = [size]  # the file's size after each append of this object (last: now)
        self._ids = {s.session_id: i for i, s in enumerate(sessions)}

    @classmethod
    def open(cls, path: Path) -> tuple[SessionLog, Opened]:
        """The log at ``path`` (created empty when absent), its torn tail dropped."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, MAGIC)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(path.parent)
        data = path.read_bytes()
        if data[: len(MAGIC)] != MAGIC:
            if MAGIC.startswith(data):  # killed while writing the header of a new log
                path.write_bytes(MAGIC)
                data = MAGIC
            else:
                raise LogError(f"{path} is not a PrisMem session log")
        sessions, end = _read(data, path)
        dropped = len(data) - end
        if dropped:
            with open(path, "r+b") as fh:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
        return cls(path, sessions, end), Opened(list(sessions), dropped)

    def __len__(self) -> int:
        return len(self.sessions)

    def position(self, session_id: str) -> int | None:
        """Where the session with this id stands in the log, or None."""
        return self._ids.get(session_id)

    def append(self, segment: Segment) -> tuple[int, bool]:
        """Write ``segment`` durably; ``(its position, whether it was written now)``. A session
        id already in the log is not written again (its position is returned)."""
        known = self._ids.get(segment.session_id)
        if known is not None:
            return known, False
        record = encode(segment)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            written = os.write(fd, record)
            if written != len(record):  # a short write: leave a torn tail the next open drops
                raise LogError(f"{self.path}: short write ({written} of {len(record)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        self.sessions.append(segment)
        self._ids[segment.session_id] = len(self.sessions) - 1
        self._sizes.append(self._sizes[-1] + len(record))
        return len(self.sessions) - 1, True

    def drop_last(self) -> None:
        """Take back the session this object appended last (truncate and fsync)."""
        if len(self._sizes) < 2:
            raise LogError(f"{self.path}: no session appended here to take back")
        self._sizes.pop()
        with open(self.path, "r+b") as fh:
            fh.truncate(self._sizes[-1])
            fh.flush()
            os.fsync(fh.fileno())
        dropped = self.sessions.pop()
        del self._ids[dropped.session_id]


def scan(path: Path) -> Scanned:
    """The sessions of the log at ``path``, read-only, by :func:`salvage`'s rule (see the
    module's invariants): a last record cut short is a record being written (or a torn tail)
    and is not read; a damaged record is skipped with its byte offset, and reading resumes at
    the next whole record."""
    with open(path, "rb") as fh:
        data = fh.read()
    found = salvage(data)
    if found.bad_header:
        raise LogError(f"{path} is not a PrisMem session log")
    return Scanned(found.sessions, [(lost.start, lost.why) for lost in found.lost], found.torn)


_TORN = "torn"


def _record_at(data: bytes, at: int) -> tuple[int, bytes | None, str | None]:
    """The record that starts at byte ``at``: ``(its end, its payload, None)`` when it is whole
    and its checksum holds, else ``(its end, None, what is wrong)``: :data:`_TORN` (it runs
    past the end of ``data``), ``"checksum"``, or its impossible length."""
    if len(data) - at < _HEAD.size:
        return len(data), None, _TORN  # torn inside a record head
    length, digest = _HEAD.unpack_from(data, at)
    start, end = at + _HEAD.size, at + _HEAD.size + length
    if length > MAX_RECORD:
        return end, None, f"a record length of {length}"
    if end > len(data):
        return end, None, _TORN  # torn inside a payload
    payload = data[start:end]
    if hashlib.sha256(payload).digest() != digest:
        return end, None, "checksum"
    return end, payload, None


def _read(data: bytes, path: Path) -> tuple[list[Segment], int]:
    """The whole records of ``data`` and the offset where they end; LogError when a bad record
    is followed by more bytes than a torn tail can hold."""
    sessions: list[Segment] = []
    at = len(MAGIC)
    while at < len(data):
        end, payload, wrong = _record_at(data, at)
        if wrong == _TORN or (wrong == "checksum" and end == len(data)):
            if _next_record(data, at) is None:
                break  # the last record, torn (its bytes not all on disk)
            why = "checksum" if wrong == "checksum" else "its length runs past the end"
            raise LogError(f"{path}: damaged at byte {at} ({why}) with records after it")
        if wrong == "checksum":
            raise LogError(f"{path}: damaged at byte {at} (checksum) with records after it")
        if payload is None:
            raise LogError(f"{path}: damaged at byte {at} ({wrong})")
        try:
            sessions.append(_decode(payload))
        except (ValueError, KeyError, TypeError) as exc:
            raise LogError(f"{path}: record at byte {at} is not a session ({exc})") from None
        at = end
    return sessions, at


def _next_record(data: bytes, after: int) -> int | None:
    """The first offset past ``after`` where a whole record starts (its checksum holds, its
    payload is a session), or None (the rule is in the module's invariants)."""
    find = after + 1 + _HEAD.size
    while (found := data.find(PAYLOAD_START, find)) >= 0:
        at = found - _HEAD.size
        _, payload, _ = _record_at(data, at)
        if payload is not None and _session(payload) is not None:
            return at
        find = found + 1
    return None


_SESSION_ID = re.compile(rb'\{"session_id":("(?:[^"\\]|\\.)*")')


def salvage(data: bytes) -> Salvaged:
    """Every whole session of the log bytes ``data``, before and after damage (see the module's
    invariants), and what was lost; nothing is written."""
    bad_header = data[: len(MAGIC)] != MAGIC
    if bad_header and MAGIC.startswith(data):  # a new log's header being written
        return Salvaged([], [], 0, False)
    sessions: list[Segment] = []
    lost: list[Lost] = []
    torn = 0
    at = len(MAGIC)
    while at < len(data):
        end, payload, wrong = _record_at(data, at)
        segment = _session(payload) if payload is not None else None
        if segment is not None:
            sessions.append(segment)
            at = end
            continue
        resume = _next_record(data, at)
        if resume is None and (wrong == _TORN or (wrong == "checksum" and end == len(data))):
            torn = len(data) - at  # what open drops: a last record cut short
            break
        until = len(data) if resume is None else resume
        head = data[at + _HEAD.size : min(until, at + _HEAD.size + 1024)]
        one = 1 if end == until else None
        lost.append(Lost(at, until, wrong or "not a session", one, _lost_id(head)))
        at = until
    return Salvaged(sessions, lost, torn, bad_header)


def _lost_id(head: bytes) -> str | None:
    """The session id a damaged payload still begins with, if it does."""
    match = _SESSION_ID.match(head)
    if match is None:
        return None
    try:
        return str(json.loads(match.group(1).decode("utf-8")))
    except ValueError:
        return None
