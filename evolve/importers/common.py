"""What every importer shares: the typed result (:class:`Imported`), the tally of what it
kept and skipped (:class:`ImportCounts`), reading an export's one JSON document
(:func:`read_export`), and the rules of messages, ids and times that hold for every source
(times of the exports are written as ISO 8601 UTC to the second, :func:`utc_text`).

Invariants:

- **An importer reads, never writes.** It returns an :class:`Imported` or raises
  :class:`~evolve.datasets.userformat.Invalid` naming every problem of its input, one line
  each, collected in the format's :class:`~evolve.datasets.usercheck.Checker` (which stops
  at its limit, :data:`~evolve.datasets.usercheck.MAX_PROBLEMS`); writing is the caller's
  (:func:`~evolve.datasets.userformat.write_dataset`, which validates again).
- **Every thing left out is counted, by what** (``Imported.skipped``); what is kept is counted
  from the dataset itself (conversations, sessions, messages), so the two cannot disagree with
  what is written.
- **A kept message is verbatim**, except that the text parts of one message are joined with
  :data:`PART_JOIN`. A message over the format's
  :data:`~evolve.datasets.usercheck.CONTENT_LIMIT` characters is skipped (the format cannot
  hold it) and counted.
- **Ids are unique where the format needs them**: a message id that repeats within its
  conversation becomes ``<session id>/<id>`` (``~2``, ``~3``, ... if that repeats too), and
  the renaming is said in a note.
- An import that keeps no message is a problem, not an empty dataset.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from contract.types import Message, Segment
from evolve.datasets.types import Conversation
from evolve.datasets.usercheck import CONTENT_LIMIT, Checker, Stop, parse_date
from evolve.datasets.userformat import Dataset, Invalid

PART_JOIN = "\n"  # between the text parts of one message
EXPORT_LIMIT = 2 * 1024**3  # bytes of an export's JSON document (it is parsed whole)
EXPORT_MEMBER = "conversations.json"  # the chats' file in a ChatGPT or Claude export
OVER_LIMIT = f"messages over {CONTENT_LIMIT:,} characters"


@dataclass(frozen=True)
class Imported:
    """An import's dataset, what it kept and what it skipped (counts by what), and notes the
    user should read (one line each: what the counts cannot say)."""

    dataset: Dataset
    kept: dict[str, int]
    skipped: dict[str, int]
    notes: tuple[str, ...] = ()


class Importer(Protocol):
    """An importer: ``source`` (a file or folder) -> :class:`Imported`; ``name`` names the
    dataset (and the one conversation of a whole history); ``per_chat`` makes each chat of an
    export a conversation of its own."""

    def __call__(self, source: Path, name: str, *, per_chat: bool = False) -> Imported: ...


@dataclass
class ImportCounts:
    """One import's counts, notes and problems as it reads (the problems in the format's own
    :class:`~evolve.datasets.usercheck.Checker`, which stops reading at its limit)."""

    skipped: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    checker: Checker = field(default_factory=Checker)
    renamed: int = 0  # message ids made unique (:func:`unique_messages`)

    def skip(self, what: str, n: int = 1) -> None:
        if n:
            self.skipped[what] += n

    def problem(self, where: str, what: str) -> None:
        """One problem, ``WHERE: what`` (raises Stop at the checker's limit)."""
        self.checker.add(where, what)

    def message(self, mid: str, role: str, content: str, *, drop_empty: bool) -> Message | None:
        """The message, or None (counted) when it is over the limit or, with ``drop_empty``,
        holds nothing but whitespace."""
        if len(content) > CONTENT_LIMIT:
            self.skip(OVER_LIMIT)
            return None
        if drop_empty and not content.strip():
            self.skip("empty messages")
            return None
        return Message(mid, role, content)


def unique_messages(sessions: Iterable[Segment], tally: ImportCounts) -> tuple[Segment, ...]:
    """``sessions`` of one conversation with every message id unique in it (see the module's
    invariants)."""
    seen: set[str] = set()
    out = []
    for s in sessions:
        messages = []
        for m in s.messages:
            mid = m.id
            if mid in seen:
                tally.renamed += 1
                mid, k = f"{s.session_id}/{m.id}", 2
                while mid in seen:
                    mid, k = f"{s.session_id}/{m.id}~{k}", k + 1
            seen.add(mid)
            messages.append(m if mid == m.id else Message(mid, m.role, m.content))
        out.append(Segment(s.session_id, s.date, tuple(messages)))
    return tuple(out)


@dataclass(frozen=True)
class Chat:
    """One chat of an export, read: its id, when it was created, its kept messages, and where
    it stood in the export (ties of ``created`` keep that order)."""

    id: str
    created: datetime | None
    messages: tuple[Message, ...]
    index: int


def chat_id(
    raw: Any, keys: tuple[str, ...], index: int, where: str, tally: ImportCounts
) -> tuple[str, str] | None:
    """A chat's id (the first of ``keys`` set in ``raw``, else ``chat-<index>``) and ``where``
    naming it too; None, with the problem in ``tally``, when ``raw`` is not an object or the id
    is not a string (the problem names ``keys[0]``)."""
    if not isinstance(raw, dict):
        tally.problem(where, f"is {type(raw).__name__}, not an object")
        return None
    cid = next((raw[k] for k in keys if raw.get(k)), f"chat-{index}")
    if not isinstance(cid, str):
        tally.problem(where, f"{keys[0]}: expected a string, got {type(cid).__name__}")
        return None
    return cid, f"{where} ({cid})"


def assemble(
    chats: list[Chat], name: str, per_chat: bool, tally: ImportCounts, where: str
) -> list[Conversation]:
    """An export's chats as conversations: by default one (named ``name``: the user's
    history) with each chat a session; ``per_chat``: one conversation per chat. Chats go in
    order of creation (those with no time last, in export order); a chat with no message
    kept is skipped and counted; a chat id that repeats is a problem (``where``: the file)."""
    first: dict[str, int] = {}
    for c in chats:
        if first.setdefault(c.id, c.index) != c.index:
            tally.problem(f"{where}: chat {c.index}", f"id {c.id!r} repeats chat {first[c.id]}'s")
    kept = [c for c in chats if c.messages]
    tally.skip("chats with no message kept", len(chats) - len(kept))
    kept.sort(key=lambda c: (c.created is None, c.created or datetime.min.replace(tzinfo=UTC),
                             c.index))  # fmt: skip
    sessions = [(c, Segment(c.id, utc_text(c.created) if c.created else None, c.messages))
                for c in kept]  # fmt: skip
    if per_chat:
        return [Conversation(c.id, unique_messages([s], tally)) for c, s in sessions]
    if not sessions:
        return []
    return [Conversation(name, unique_messages([s for _, s in sessions], tally))]


def read_chats(
    source: Path, name: str, per_chat: bool, tally: ImportCounts,
    read_chat: Callable[[Any, int, str, ImportCounts], Chat | None],
) -> list[Conversation]:  # fmt: skip
    """An export's conversations (:func:`assemble`): ``read_chat(raw, index, where, tally)``
    reads each chat of its list (None: it has problems, collected in ``tally``)."""
    where, data = read_export(source)
    if not isinstance(data, list):
        tally.problem(where, f"expected a list of chats, got {type(data).__name__}")
        return []
    chats = []
    for index, raw in enumerate(data):
        chat = read_chat(raw, index, f"{where}: chat {index}", tally)
        if chat is not None:
            chats.append(chat)
    return assemble(chats, name, per_chat, tally, where)


Reader = Callable[[Path, str, bool, ImportCounts], list[Conversation]]
"""An importer's reading: ``(source, name, per_chat, tally)`` -> its conversations."""


def run_import(kind: str, read: Reader, source: Path, name: str, per_chat: bool) -> Imported:
    """Run ``read`` over ``source``: the import's result (its source ``import:<kind>``), or
    Invalid with every problem collected (one naming ``source`` when nothing was kept)."""
    tally = ImportCounts()
    try:
        conversations = read(source, name, per_chat, tally)
    except Stop:
        conversations = []
    problems = tally.checker.problems
    if not problems and not conversations:
        problems.append(f"{source}: nothing to import (no message was kept)")
    if problems:
        raise Invalid(problems, truncated=tally.checker.truncated)
    if tally.renamed:
        tally.notes.append(f"{tally.renamed} message ids repeated within a conversation were "
                           "made unique as <session id>/<id>")  # fmt: skip
    kept = {
        "conversations": len(conversations),
        "sessions": sum(len(c.sessions) for c in conversations),
        "messages": sum(len(s.messages) for c in conversations for s in c.sessions),
    }
    dataset = Dataset(name=name, source=f"import:{kind}", conversations=tuple(conversations),
                      questions=())  # fmt: skip
    return Imported(dataset, kept, dict(tally.skipped), tuple(tally.notes))


def utc_text(when: datetime) -> str:
    """A time as the importers write it: ISO 8601 in UTC to the second, ``Z`` at the end (a
    naive time is taken as UTC)."""
    aware = when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    return aware.isoformat(timespec="seconds").replace("+00:00", "Z")


def epoch_time(value: Any) -> datetime | None:
    """A number of seconds since the epoch as a UTC time; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def iso_time(value: Any) -> datetime | None:
    """An ISO 8601 text as a UTC time (naive input taken as UTC); None for anything else."""
    if not isinstance(value, str):
        return None
    parsed = parse_date(value)
    return None if parsed is None else parsed.replace(tzinfo=UTC)


def read_export(path: Path, member: str = EXPORT_MEMBER) -> tuple[str, Any]:
    """``(the name problems cite, the parsed JSON)`` of an export given as the JSON file, the
    folder it was unpacked into, or its zip (``member`` at the top or in one folder of it).
    Raises Invalid with one line."""
    if path.is_dir():
        path = path / member
    if not path.is_file():
        raise Invalid([f"{path}: no such file"])
    if zipfile.is_zipfile(path):
        name, data = _from_zip(path, member)
    else:
        name = path.name
        if path.stat().st_size > EXPORT_LIMIT:
            raise Invalid([f"{name}: over {EXPORT_LIMIT:,} bytes"])
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise Invalid([f"{name}: cannot read ({exc.strerror or exc})"]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Invalid([f"{name}: not UTF-8 text (byte {exc.start})"]) from None
    try:
        return name, json.loads(text)
    except json.JSONDecodeError as exc:
        raise Invalid([f"{name}:{exc.lineno}: not JSON ({exc.msg}, column {exc.colno})"]) from None
    except RecursionError:
        raise Invalid([f"{name}: JSON nested too deep"]) from None


def _from_zip(path: Path, member: str) -> tuple[str, bytes]:
    try:
        with zipfile.ZipFile(path) as archive:
            found = sorted((i for i in archive.infolist()
                            if i.filename.rstrip("/").split("/")[-1] == member
                            and i.filename.count("/") <= 1),
                           key=lambda i: i.filename.count("/"))  # fmt: skip
            if not found:
                raise Invalid([f"{path.name}: the zip holds no {member}"])
            info = found[0]
            name = f"{path.name}:{info.filename}"
            if info.file_size > EXPORT_LIMIT:
                raise Invalid([f"{name}: over {EXPORT_LIMIT:,} bytes"])
            with archive.open(info) as fh:
                data = fh.read(EXPORT_LIMIT + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, EOFError,
            zlib.error) as exc:  # fmt: skip
        raise Invalid([f"{path.name}: not a readable zip ({exc})"]) from None
    if len(data) > EXPORT_LIMIT:
        raise Invalid([f"{name}: over {EXPORT_LIMIT:,} bytes"])
    return name, data
