"""The user format's folders (docs/user-format.md): :class:`Dataset`, :class:`Invalid` (every
problem of a folder, one line each), :func:`read_dataset`, :func:`write_dataset`,
:func:`write_questions` and :func:`to_taskset` (a dataset as a ``jsonl`` bench's task set).

Folder: ``prismem-data.json`` (the manifest: format, version, name, source),
``conversations.jsonl`` (one session per line, in time order within its conversation; lines of
different conversations may interleave) and, optionally, ``questions.jsonl`` (one question per
line). ``splits.json`` (:mod:`evolve.datasets.usersplits`) and ``synth/`` belong to PrisMem. The
format's names, limits and rules are :mod:`evolve.datasets.usercheck`'s.

Invariants:
- Reading collects every problem (up to ``MAX_PROBLEMS``) into one :class:`Invalid`;
  a manifest of another format or a newer version stops it at once.
- The writers check with the same :class:`~.usercheck.Checker` before anything is in place.
  :func:`write_dataset` writes a temporary sibling folder, fsyncs its files and itself, then
  renames it into place: a crash leaves the old folder or none, never a half-written one (and
  it replaces only a folder that holds a manifest). :func:`write_questions` replaces
  questions.jsonl with :func:`evolve.files.write_atomic`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.datasets.types import Conversation, DataError, Question, TaskSet
from evolve.datasets.usercheck import (
    CONVERSATIONS,
    FORMAT,
    MANIFEST,
    MANIFEST_LIMIT,
    MAX_PROBLEMS,
    QUESTIONS,
    VERSION,
    Checker,
    Stop,
    jsonl_lines,
)
from evolve.files import fsync_dir, plain_mode, write_atomic

BENCH = "jsonl"  # TaskSet.bench of a user-format dataset


class Invalid(DataError):
    """A folder (or records to write) breaking the format: every problem found, one line each."""

    def __init__(self, problems: list[str], *, truncated: bool = False) -> None:
        self.problems = list(problems)
        self.truncated = truncated  # the checker stopped at MAX_PROBLEMS
        more = len(self.problems) - 1
        tail = f" (and {more} more)" if more > 0 else ""
        super().__init__(f"{self.problems[0]}{tail}" if self.problems else "invalid data")

    def lines(self) -> list[str]:
        """The problems, and a last line when the checker stopped early (what the CLI prints)."""
        if not self.truncated:
            return list(self.problems)
        return [*self.problems, f"stopped after {MAX_PROBLEMS} problems: fix these and check again"]


def _fail(checker: Checker) -> Invalid:
    return Invalid(checker.problems, truncated=checker.truncated)


@dataclass(frozen=True)
class Dataset:
    """A user-format folder's contents: conversations in order of first appearance, questions in
    file order."""

    name: str
    source: str
    conversations: tuple[Conversation, ...]
    questions: tuple[Question, ...]


def _read_manifest(folder: Path, checker: Checker) -> tuple[str, str] | None:
    """(name, source), or None with the problem collected; Invalid at once when its format or
    version rule the folder out."""
    path = folder / MANIFEST
    if not path.is_file():
        checker.add(MANIFEST, f'missing (a data folder starts with {{"format": "{FORMAT}", '
                    f'"version": {VERSION}, "name": ..., "source": ...}})')  # fmt: skip
        return None
    with open(path, "rb") as fh:
        data = fh.read(MANIFEST_LIMIT + 1)
    if len(data) > MANIFEST_LIMIT:
        checker.add(MANIFEST, f"over {MANIFEST_LIMIT:,} bytes (a manifest is a small object)")
        return None
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        checker.add(MANIFEST, f"not UTF-8: byte 0x{data[e.start]:02x} at byte {e.start + 1}")
        return None
    except json.JSONDecodeError as e:
        checker.add(f"{MANIFEST}:{e.lineno}", f"not valid JSON ({e.msg} at column {e.colno})")
        return None
    return checker.manifest(obj)


def _read(folder: Path, *, questions: bool) -> tuple[Checker, tuple[str, str] | None]:
    """Check a folder (its questions too when ``questions``); Invalid with every problem."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder (a PrisMem data folder holds {MANIFEST} and "
                        f"{CONVERSATIONS}; see docs/user-format.md)")  # fmt: skip
    checker = Checker()
    try:
        meta = _read_manifest(folder, checker)
        path = folder / CONVERSATIONS
        if not path.is_file():
            checker.add(CONVERSATIONS, "missing (one session per line)")
        else:
            for where, number, obj, size in jsonl_lines(path, CONVERSATIONS, checker):
                checker.session(where, number, obj, size)
        path = folder / QUESTIONS
        if questions and path.is_file():
            for where, number, obj, size in jsonl_lines(path, QUESTIONS, checker):
                checker.question(where, number, obj, size)
    except Stop:
        raise _fail(checker) from None
    except OSError as e:
        raise DataError(f"{folder}: cannot read ({e.strerror or e})") from None
    if checker.problems:
        raise _fail(checker)
    return checker, meta


def read_dataset(folder: Path) -> Dataset:
    """The dataset of a user-format folder; :class:`Invalid` with every problem found (up to
    :data:`MAX_PROBLEMS`), DataError when the folder does not exist or cannot be read."""
    checker, meta = _read(folder, questions=True)
    assert meta is not None  # a folder without a valid manifest has problems
    return Dataset(meta[0], meta[1], checker.conversations(), tuple(checker.questions))


def to_taskset(
    dataset: Dataset,
    split: str,
    conversations: set[str] | None = None,
    questions: set[str] | None = None,
) -> TaskSet:
    """The ``jsonl`` task set of ``dataset``'s conversations in ``conversations`` (None: all)
    and their questions in ``questions`` (None: all), both in dataset order."""
    convs = tuple(
        c for c in dataset.conversations if conversations is None or c.id in conversations
    )
    kept = {c.id for c in convs}
    qs = tuple(
        q
        for q in dataset.questions
        if q.conversation_id in kept and (questions is None or q.id in questions)
    )
    return TaskSet(BENCH, split, convs, qs)


# -------------------------------------------------------------------- writing


def session_records(dataset: Dataset) -> Iterator[dict[str, Any]]:
    """The lines of conversations.jsonl, as objects."""
    for conv in dataset.conversations:
        for seg in conv.sessions:
            messages = [{"id": m.id, "role": m.role, "content": m.content} for m in seg.messages]
            yield {"conversation": conv.id, "session": seg.session_id, "date": seg.date,
                   "messages": messages}  # fmt: skip


def question_record(q: Question) -> dict[str, Any]:
    """One line of questions.jsonl, as an object (rubric and meta only when not empty)."""
    out: dict[str, Any] = {
        "id": q.id, "conversation": q.conversation_id, "question": q.question, "answer": q.gold,
        "evidence": list(q.evidence_ids), "date": q.question_date,
        "capability": q.capability or None, "kind": q.ability,
    }  # fmt: skip
    if q.rubric:
        out["rubric"] = list(q.rubric)
    if q.meta:
        out["meta"] = dict(q.meta)
    return out


def _encode(where: str, record: dict[str, Any], checker: Checker) -> bytes | None:
    try:
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    except (TypeError, ValueError) as e:  # UnicodeEncodeError is a ValueError
        checker.add(where, f"cannot be written as UTF-8 JSON ({e})")
        return None


def _write_lines(
    path: Path, name: str, records: Iterator[dict[str, Any]], checker: Checker, question: bool
) -> None:
    """Check each record and write it as a line of ``path`` (fsynced)."""
    check = checker.question if question else checker.session
    with open(path, "wb") as fh:
        for number, record in enumerate(records, 1):
            where = f"{name}:{number}"
            data = _encode(where, record, checker)
            if data is not None:
                check(where, number, record, len(data) - 1)
                fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _check_conversations(dataset: Dataset, checker: Checker) -> None:
    """What the lines cannot show: two conversations with one id, a conversation without
    sessions."""
    first: dict[str, int] = {}
    line = 1
    for conv in dataset.conversations:
        where = f"{CONVERSATIONS}:{line}: conversation"
        if not conv.sessions:
            checker.add(f"{CONVERSATIONS}: conversation", f"{conv.id!r} has no sessions")
        elif conv.id in first:
            checker.add(where, f"repeats {conv.id!r} (first at line {first[conv.id]}: two "
                        "conversations with one id)")  # fmt: skip
        first.setdefault(conv.id, line)
        line += len(conv.sessions)


def _target(folder: Path, replace: bool) -> bool:
    """Whether ``folder`` holds a dataset to swap out; DataError when it may not be written."""
    if not folder.exists():
        return False
    if not folder.is_dir():
        raise DataError(f"{folder}: exists and is not a folder")
    if not any(folder.iterdir()):
        return False
    if not replace:
        raise DataError(f"{folder}: exists and is not empty (choose a new folder, or replace "
                        "the dataset there)")  # fmt: skip
    if not (folder / MANIFEST).is_file():
        raise DataError(f"{folder}: holds files but no {MANIFEST}: not a data folder, so it is "
                        "not replaced")  # fmt: skip
    return True


def write_dataset(folder: Path, dataset: Dataset, *, replace: bool = False) -> Path:
    """Write ``dataset`` as the user-format folder ``folder`` (returned); :class:`Invalid` with
    every problem when its records break the format, nothing written. ``replace`` swaps out an
    existing data folder (one with a manifest); otherwise ``folder`` must not exist or be
    empty. The files go to a temporary sibling folder, fsynced, renamed into place."""
    folder = Path(folder).absolute()
    swap = _target(folder, replace)
    checker = Checker()
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(tmp)
        try:
            manifest = {"format": FORMAT, "version": VERSION, "name": dataset.name,
                        "source": dataset.source}  # fmt: skip
            checker.manifest(manifest)
            _check_conversations(dataset, checker)
            if checker.problems:  # its sessions would only repeat them
                raise Stop
            _write_lines(tmp / CONVERSATIONS, CONVERSATIONS, session_records(dataset), checker,
                         question=False)  # fmt: skip
            if dataset.questions:
                records = map(question_record, dataset.questions)
                _write_lines(tmp / QUESTIONS, QUESTIONS, records, checker, question=True)
        except Stop:
            pass
        if checker.problems:
            raise _fail(checker)
        write_atomic(
            tmp / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode(), mode=plain_mode()
        )
        fsync_dir(tmp)
        _put_in_place(tmp, folder, swap)
    except OSError as e:
        raise DataError(f"{folder}: cannot write ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _put_in_place(tmp: Path, folder: Path, swap: bool) -> None:
    """Rename ``tmp`` to ``folder`` (missing or empty); with ``swap`` the folder there is moved
    aside first, moved back when the rename fails, and removed once the new one is in place."""
    old = folder.parent / f".{folder.name}.old-{os.getpid()}-{os.urandom(4).hex()}"
    if swap:
        os.rename(folder, old)
    try:
        os.rename(tmp, folder)
    except OSError:
        if swap:
            os.rename(old, folder)
        raise
    fsync_dir(folder.parent)
    if swap:
        shutil.rmtree(old, ignore_errors=True)


def write_questions(folder: Path, questions: tuple[Question, ...] | list[Question]) -> Path:
    """Replace ``folder``'s questions.jsonl (returned) with ``questions``, atomically, after
    checking them against its conversations (:class:`Invalid` with every problem, nothing
    written)."""
    folder = Path(folder)
    checker, _ = _read(folder, questions=False)
    lines: list[bytes] = []
    try:
        for number, q in enumerate(questions, 1):
            where = f"{QUESTIONS}:{number}"
            record = question_record(q)
            data = _encode(where, record, checker)
            if data is not None:
                checker.question(where, number, record, len(data) - 1)
                lines.append(data)
    except Stop:
        pass
    if checker.problems:
        raise _fail(checker)
    try:
        write_atomic(folder / QUESTIONS, b"".join(lines), mode=plain_mode())
    except OSError as e:
        raise DataError(f"{folder / QUESTIONS}: cannot write ({e.strerror or e})") from None
    return folder / QUESTIONS
