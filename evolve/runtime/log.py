"""The session log of one scope: every acknowledged session, append-only, on disk.

Owns the log file's format and :class:`SessionLog`. The log is the store's source of truth:
a memory snapshot (:mod:`.store`) is only a shortcut to replaying it.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.types import Message, Segment

MAGIC = b"PRISMEM-LOG-v1\n\0"
_HEAD = struct.Struct(">I32s")  # payload length, sha256 of the payload
MAX_RECORD = 1 << 28  # a session larger than 256 MiB is refused (and such a length is damage)


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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
            _fsync_dir(path.parent)
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
    """The sessions of the log at ``path``, read-only (see the module's invariants): a record
    that runs past the end, or whose checksum fails as the last one, is a record being written
    (or a torn tail) and is not read; a damaged record followed by others is skipped, and so
    is everything after a damaged length (no record can be found past it)."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[: len(MAGIC)] != MAGIC:
        if MAGIC.startswith(data):  # a new log's header being written
            return Scanned([], [], 0)
        raise LogError(f"{path} is not a PrisMem session log")
    sessions: list[Segment] = []
    damaged: list[tuple[int, str]] = []
    at = len(MAGIC)
    while at < len(data):
        end, payload, wrong = _record_at(data, at)
        if wrong == _TORN or (wrong == "checksum" and end == len(data)):
            break
        if wrong == "checksum":
            damaged.append((at, "checksum"))
        elif payload is None:
            damaged.append((at, f"{wrong}; its {len(data) - at} bytes to the end not read"))
            at = len(data)
            break
        else:
            try:
                sessions.append(_decode(payload))
            except (ValueError, KeyError, TypeError) as exc:
                damaged.append((at, f"not a session ({exc})"))
        at = end
    return Scanned(sessions, damaged, len(data) - at)


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
        if wrong == _TORN:
            break
        if wrong == "checksum":
            if end < len(data):
                raise LogError(f"{path}: damaged at byte {at} (checksum) with records after it")
            break  # the last record, torn (its bytes not all on disk)
        if payload is None:
            raise LogError(f"{path}: damaged at byte {at} ({wrong})")
        try:
            sessions.append(_decode(payload))
        except (ValueError, KeyError, TypeError) as exc:
            raise LogError(f"{path}: record at byte {at} is not a session ({exc})") from None
        at = end
    return sessions, at
