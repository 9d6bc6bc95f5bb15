"""The rules of the user format, version 1 (docs/user-format.md): its constants, the one checker
of its records and the bounded reading of its JSONL lines.

Owns the format's names and limits (:data:`FORMAT`, :data:`VERSION`, the file names,
:data:`CONTENT_LIMIT`, :data:`LINE_LIMIT`, the fields of each record), :class:`Checker` (each
rule once, over raw JSON records, collecting one line per problem and building the typed records
as it goes) and :func:`jsonl_lines`. :mod:`evolve.datasets.userformat` reads and
writes folders through them: the reader and both writers run the same checker.

Invariants:
- Every problem is one line ``FILE:LINE: FIELD: what`` (``FILE: FIELD: what`` for the manifest,
  ``FILE:LINE: what`` for a line that is not a record); the checker stops (:class:`Stop`) at
  :data:`MAX_PROBLEMS`. Unknown fields are problems, so typos are caught.
- :func:`jsonl_lines` reads with a bounded ``readline``: a line over :data:`LINE_LIMIT` bytes is
  never held whole in memory — it is one problem and reading goes on at the next newline.
- Records map verbatim onto :mod:`evolve.datasets.types`: ids, roles, contents and date texts
  unchanged (a converted benchmark conversation renders byte-identically); ``kind`` becomes
  ``Question.ability`` (default :data:`DEFAULT_KIND`), a null capability ``""`` (not labelled).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from contract.types import Message, Segment
from evolve.datasets.types import CAPABILITIES, Conversation, Question

FORMAT = "prismem-conversations"
VERSION = 1
MANIFEST = "prismem-data.json"
CONVERSATIONS = "conversations.jsonl"
QUESTIONS = "questions.jsonl"
DEFAULT_KIND = "user"  # Question.ability of a question without "kind"

CONTENT_LIMIT = 1_000_000  # characters of one message's content
LINE_LIMIT = 16 * 1024 * 1024  # bytes of one line (without its newline)
MANIFEST_LIMIT = 1024 * 1024  # bytes of the manifest
MAX_PROBLEMS = 50  # the reader stops after this many

MANIFEST_FIELDS = ("format", "version", "name", "source")
SESSION_FIELDS = ("conversation", "session", "date", "messages")
MESSAGE_FIELDS = ("id", "role", "content")
QUESTION_FIELDS = ("id", "conversation", "question", "answer", "evidence", "date",
                   "capability", "kind", "rubric", "meta")  # fmt: skip
_CHUNK = 1024 * 1024  # bytes a line is read in at a time


class Stop(Exception):
    """Raised inside the checker when it stops: :data:`MAX_PROBLEMS` problems are collected, or
    the manifest rules the rest of the folder out (another format, a newer version)."""


def _type_name(value: Any) -> str:
    """A JSON value's kind, as a problem line names it (``a number``, ``an array``, ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def parse_date(text: str) -> datetime | None:
    """An ISO 8601 date or datetime (a trailing ``Z`` means UTC) as a naive UTC datetime for
    ordering; None when ``text`` is not one."""
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    return when.astimezone(UTC).replace(tzinfo=None) if when.tzinfo else when


@dataclass
class _SeenConversation:
    """What the checker knows of one conversation while reading."""

    line: int  # its first line
    sessions: list[Segment] = field(default_factory=list)
    session_lines: dict[str, int] = field(default_factory=dict)  # session id -> its line
    message_lines: dict[str, int] = field(default_factory=dict)  # message id -> its line
    last_date: tuple[str, datetime, int] | None = None  # text, value, line
    broken: bool = False  # a line of it had a problem (its messages may be incomplete)


class Checker:
    """The format's rules over raw records, collecting problems; builds the typed records."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.convs: dict[str, _SeenConversation] = {}
        self.question_lines: dict[str, int] = {}
        self.questions: list[Question] = []
        self.unreadable = False  # a line of conversations.jsonl named no conversation it could
        # read: a question's unknown conversation may be on it, so that is not a second problem

    def add(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")
        if len(self.problems) >= MAX_PROBLEMS:
            raise Stop

    def bad_line(self, name: str, where: str, what: str) -> None:
        """A line of file ``name`` that is not a record (too long, not UTF-8, not JSON)."""
        self.unreadable |= name == CONVERSATIONS
        self.add(where, what)

    @property
    def truncated(self) -> bool:
        """Whether it stopped at :data:`MAX_PROBLEMS` (more problems may follow)."""
        return len(self.problems) >= MAX_PROBLEMS

    # ---------------------------------------------------------------- fields

    def _fields(self, where: str, obj: Any, allowed: tuple[str, ...], what: str) -> bool:
        """``obj`` is an object with no unknown field; problems otherwise."""
        if not isinstance(obj, dict):
            self.add(where, f"is {_type_name(obj)}, not an object ({what})")
            return False
        for key in obj:
            if key not in allowed:
                self.add(f"{where}: {key}", f"unknown field (expected {', '.join(allowed)})")
        return True

    def _str(
        self, where: str, obj: dict[str, Any], key: str, *, prefix: str = "", empty: bool = False
    ) -> bool:
        """``obj[key]`` is a string (non-empty unless ``empty``); ``prefix`` leads the field's
        path in a problem (``messages[3].``)."""
        at = f"{where}: {prefix}{key}"
        if key not in obj:
            self.add(at, "missing")
            return False
        value = obj[key]
        if not isinstance(value, str):
            self.add(at, f"expected a string, got {_type_name(value)}")
            return False
        if not empty and not value:
            self.add(at, "is empty")
            return False
        return True

    def _date(self, where: str, obj: dict[str, Any]) -> tuple[bool, datetime | None]:
        """(ok, parsed) for an optional ``date`` (null or ISO 8601)."""
        value = obj.get("date")
        if value is None:
            return True, None
        if not isinstance(value, str):
            self.add(f"{where}: date", f"expected an ISO date string or null, got "
                     f"{_type_name(value)}")  # fmt: skip
            return False, None
        parsed = parse_date(value)
        if parsed is None:
            self.add(f"{where}: date", f"{value!r} is not an ISO 8601 date or datetime")
            return False, None
        return True, parsed

    # ---------------------------------------------------------------- records

    def manifest(self, obj: Any) -> tuple[str, str] | None:
        """(name, source) of a manifest; None with its problems. :class:`Stop` when it is not
        this format's or not this version's (nothing else can be read then)."""
        if not self._fields(MANIFEST, obj, MANIFEST_FIELDS, "the manifest"):
            raise Stop
        if obj.get("format") != FORMAT:
            got = f"got {obj['format']!r}" if "format" in obj else "missing"
            self.add(f"{MANIFEST}: format", f"expected {FORMAT!r} ({got})")
            raise Stop
        version = obj.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            self.add(f"{MANIFEST}: version", f"{version} is newer than this PrisMem reads "
                     f"({VERSION}); upgrade PrisMem")  # fmt: skip
            raise Stop
        if version != VERSION or isinstance(version, bool):
            got = repr(version) if "version" in obj else "missing"
            self.add(f"{MANIFEST}: version", f"expected {VERSION} (got {got})")
            raise Stop
        ok = self._str(MANIFEST, obj, "name") & self._str(MANIFEST, obj, "source")
        return (obj["name"], obj["source"]) if ok else None

    def session(self, where: str, line: int, obj: Any, size: int) -> None:
        """One line of conversations.jsonl (``size``: its length in bytes)."""
        if size > LINE_LIMIT:
            self.add(where, f"line is {size:,} bytes (limit {LINE_LIMIT:,})")
            return
        if not self._fields(where, obj, SESSION_FIELDS, "one session per line"):
            self.unreadable = True
            return
        cid_ok = self._str(where, obj, "conversation")
        conv = (
            self.convs.setdefault(obj["conversation"], _SeenConversation(line)) if cid_ok else None
        )
        self.unreadable |= conv is None
        ok = self._str(where, obj, "session")
        date_ok, when = self._date(where, obj)
        messages = self._messages(where, obj)
        if conv is None or not (ok and date_ok) or messages is None:
            if conv is not None:
                conv.broken = True
            return
        cid, sid = obj["conversation"], obj["session"]
        if sid in conv.session_lines:
            conv.broken = True
            self.add(f"{where}: session", f"repeats {sid!r} in conversation {cid!r} (first at "
                     f"line {conv.session_lines[sid]})")  # fmt: skip
            return
        conv.session_lines[sid] = line
        for i, m in enumerate(messages):
            if m.id in conv.message_lines:
                first = conv.message_lines[m.id]
                self.add(f"{where}: messages[{i}].id", f"repeats {m.id!r} (first at line {first})")
            else:
                conv.message_lines[m.id] = line
        if when is not None:
            if conv.last_date is not None and when < conv.last_date[1]:
                text, _, at = conv.last_date
                self.add(f"{where}: date", f"{obj['date']!r} is before {text!r} of the "
                         f"conversation's previous dated session (line {at})")  # fmt: skip
            else:
                conv.last_date = (obj["date"], when, line)
        conv.sessions.append(Segment(session_id=sid, date=obj.get("date"), messages=messages))

    def _messages(self, where: str, obj: dict[str, Any]) -> tuple[Message, ...] | None:
        raw = obj.get("messages")
        if "messages" not in obj:
            self.add(f"{where}: messages", "missing")
            return None
        if not isinstance(raw, list):
            self.add(f"{where}: messages", f"expected an array, got {_type_name(raw)}")
            return None
        if not raw:
            self.add(f"{where}: messages", "empty (a session needs at least one message)")
            return None
        out: list[Message] = []
        for i, m in enumerate(raw):
            at = f"{where}: messages[{i}]"
            if not self._fields(at, m, MESSAGE_FIELDS, "a message"):
                continue
            pre = f"messages[{i}]."
            ok = (self._str(where, m, "id", prefix=pre) & self._str(where, m, "role", prefix=pre)
                  & self._str(where, m, "content", prefix=pre, empty=True))  # fmt: skip
            if ok and len(m["content"]) > CONTENT_LIMIT:
                self.add(f"{at}.content", f"{len(m['content']):,} characters (limit "
                         f"{CONTENT_LIMIT:,})")  # fmt: skip
                ok = False
            if ok:
                out.append(Message(id=m["id"], role=m["role"], content=m["content"]))
        return tuple(out) if len(out) == len(raw) else None

    def question(self, where: str, line: int, obj: Any, size: int) -> None:
        """One line of questions.jsonl (after every session is checked)."""
        if size > LINE_LIMIT:
            self.add(where, f"line is {size:,} bytes (limit {LINE_LIMIT:,})")
            return
        if not self._fields(where, obj, QUESTION_FIELDS, "one question per line"):
            return
        ok = True
        for key in ("id", "conversation", "question"):
            ok &= self._str(where, obj, key)
        ok &= self._str(where, obj, "answer", empty=True)
        ok &= self._date(where, obj)[0]
        ok &= self._strings(where, obj, "evidence", required=True)
        ok &= self._strings(where, obj, "rubric", required=False)
        capability = obj.get("capability")
        if capability is not None and capability not in CAPABILITIES:
            self.add(f"{where}: capability", f"{capability!r} is not one of "
                     f"{', '.join(CAPABILITIES)} (or null)")  # fmt: skip
            ok = False
        kind = obj.get("kind")
        if kind is not None and (not isinstance(kind, str) or not kind):
            self.add(f"{where}: kind", f"expected a non-empty string, got {kind!r}")
            ok = False
        meta = obj.get("meta")
        if meta is not None and not isinstance(meta, dict):
            self.add(f"{where}: meta", f"expected an object, got {_type_name(meta)}")
            ok = False
        qid, cid = obj.get("id"), obj.get("conversation")
        if isinstance(qid, str) and qid:
            first = self.question_lines.setdefault(qid, line)
            if first != line:
                self.add(f"{where}: id", f"repeats {qid!r} (first at line {first})")
                ok = False
        if isinstance(cid, str) and cid:
            conv = self.convs.get(cid)
            if conv is None:
                ok = False
                if not self.unreadable:
                    self.add(f"{where}: conversation", f"{cid!r} is not a conversation of "
                             f"{CONVERSATIONS}")  # fmt: skip
            elif isinstance(obj.get("evidence"), list) and not conv.broken:
                for i, e in enumerate(obj["evidence"]):
                    if isinstance(e, str) and e not in conv.message_lines:
                        self.add(f"{where}: evidence[{i}]", f"{e!r} is not a message of "
                                 f"conversation {cid!r}")  # fmt: skip
                        ok = False
        if ok:
            self.questions.append(Question(
                id=qid, conversation_id=cid, ability=kind or DEFAULT_KIND,
                capability=capability or "", question=obj["question"], gold=obj["answer"],
                rubric=tuple(obj.get("rubric") or ()), evidence_ids=tuple(obj["evidence"]),
                question_date=obj.get("date"), meta=dict(meta or {}),
            ))  # fmt: skip

    def _strings(self, where: str, obj: dict[str, Any], key: str, *, required: bool) -> bool:
        if key not in obj or (obj[key] is None and not required):
            if required:
                self.add(f"{where}: {key}", "missing (a list of message ids, [] for none)")
            return not required
        value = obj[key]
        if not isinstance(value, list):
            self.add(f"{where}: {key}", f"expected an array of strings, got {_type_name(value)}")
            return False
        bad = [i for i, v in enumerate(value) if not isinstance(v, str) or not v]
        for i in bad:
            self.add(f"{where}: {key}[{i}]", f"expected a non-empty string, got {value[i]!r}")
        return not bad

    def conversations(self) -> tuple[Conversation, ...]:
        return tuple(Conversation(id=cid, sessions=tuple(c.sessions))
                     for cid, c in self.convs.items())  # fmt: skip


# -------------------------------------------------------------------- reading


def _read_line(fh: BinaryIO) -> tuple[bytes | None, int] | None:
    """The next line (without its newline) and its size in bytes, None at the end of the file.
    The line is None when it is over :data:`LINE_LIMIT`: it is read past in chunks, never held
    whole (at most the limit is in memory at once)."""
    parts: list[bytes] = []
    size = 0
    while chunk := fh.readline(_CHUNK):
        ended = chunk.endswith(b"\n")
        size += len(chunk) - ended
        if size <= LINE_LIMIT:
            parts.append(chunk[:-1] if ended else chunk)
        elif parts:
            parts = []
        if ended:
            break
    if size == 0 and not parts:
        return None
    return (b"".join(parts) if size <= LINE_LIMIT else None), size


def jsonl_lines(path: Path, name: str, checker: Checker) -> Iterator[tuple[str, int, Any, int]]:
    """(where, line number, parsed JSON, size in bytes) per non-blank line of a JSONL file; a
    line that is too long, not UTF-8 or not JSON is a problem instead
    (:meth:`Checker.bad_line`)."""
    with open(path, "rb") as fh:
        number = 0
        while (read := _read_line(fh)) is not None:
            number += 1
            where = f"{name}:{number}"
            body, size = read
            if body is None:
                checker.bad_line(name, where, f"line is {size:,} bytes (limit {LINE_LIMIT:,}; "
                                 "skipped)")  # fmt: skip
                continue
            body = body[:-1] if body.endswith(b"\r") else body
            if number == 1 and body.startswith(b"\xef\xbb\xbf"):
                checker.bad_line(name, where, "starts with a byte order mark (save the file as "
                                 "UTF-8 without one)")  # fmt: skip
                continue
            if not body.strip():
                continue
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as e:
                checker.bad_line(name, where, f"not UTF-8: byte 0x{body[e.start]:02x} at byte "
                                 f"{e.start + 1} of the line")  # fmt: skip
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                checker.bad_line(name, where, f"not valid JSON ({e.msg} at column {e.colno})")
                continue
            yield where, number, obj, len(body)
