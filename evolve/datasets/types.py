"""Benchmark-neutral data types: conversations (of :mod:`contract.types` segments) and questions;
and :func:`read_json` / :func:`read_records`, the one way loaders read a benchmark file (errors
become one line).

Every loader (BEAM, LoCoMo, LongMemEval) converts its files into these types; nothing
downstream knows which benchmark a conversation came from.

Invariants:
- All types are frozen. `Segment` and `Message` (what a memory program receives) are the
  contract's (:mod:`contract.types`, with their invariants); BEAM's integer message ids are
  stringified.
- `Question.meta["posed"]`, when present, is the question as the benchmark's protocol poses it
  to the answer model (planning and retrieval see `Question.question`).
- `Question.capability` is the *native* capability of the benchmark's question type (docs/design.md
  §3), or "" for a question that carries none (a user's); it is used to group results (the
  questions with "" under :data:`UNLABELLED`) and is never shown to a memory program.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.types import Message, Segment

CAPABILITIES: tuple[str, ...] = ("F", "T", "P", "M", "A")
CAPABILITY_NAMES: dict[str, str] = {
    "F": "factual retrieval",
    "T": "temporal tracking",
    "P": "preference extraction",
    "M": "multi-session synthesis",
    "A": "adversarial handling",
}
UNLABELLED = "unlabelled"  # the results group of the questions whose capability is ""
GROUPS: tuple[str, ...] = (*CAPABILITIES, UNLABELLED)  # per-capability result groups, in order


def group_title(group: str) -> str:
    """A per-capability result group as tables name it: ``F factual retrieval``, ``unlabelled``."""
    return f"{group} {CAPABILITY_NAMES[group]}" if group in CAPABILITY_NAMES else group


class DataError(Exception):
    """Missing or malformed benchmark data; the message is one line meant for the user."""


@dataclass(frozen=True)
class Conversation:
    id: str
    sessions: tuple[Segment, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def messages(self) -> dict[str, tuple[Segment, Message]]:
        """Message id -> (its segment, the message)."""
        return {m.id: (s, m) for s in self.sessions for m in s.messages}

    @property
    def n_chars(self) -> int:
        return sum(len(m.content) for s in self.sessions for m in s.messages)


@dataclass(frozen=True)
class Question:
    id: str
    conversation_id: str
    ability: str
    capability: str
    question: str
    gold: str
    rubric: tuple[str, ...] = ()
    evidence_ids: tuple[str, ...] = ()
    question_date: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def posed(self) -> str:
        """The question as the answer model sees it (see the module's invariants)."""
        return str(self.meta.get("posed") or self.question)


@dataclass(frozen=True)
class TaskSet:
    """Conversations and the questions asked about them (every question's conversation is here)."""

    bench: str
    split: str
    conversations: tuple[Conversation, ...]
    questions: tuple[Question, ...]

    def first(self, n: int | None) -> TaskSet:
        """Only the first ``n`` conversations (in split order) and their questions; None: all.
        The one slicing rule of a run's splits and of ``evolve eval/compare --conversations``."""
        if n is None:
            return self
        keep = self.conversations[:n]
        ids = {c.id for c in keep}
        questions = tuple(q for q in self.questions if q.conversation_id in ids)
        return TaskSet(self.bench, self.split, keep, questions)

    def by_conversation(self) -> dict[str, list[Question]]:
        out: dict[str, list[Question]] = {c.id: [] for c in self.conversations}
        for q in self.questions:
            out[q.conversation_id].append(q)
        return out

    def evidence_texts(self) -> dict[str, list[str]]:
        """Question id → the texts (:meth:`Message.text`) of its evidence messages, as the
        scorers read them; an evidence id missing from its conversation is left out."""
        out: dict[str, list[str]] = {}
        by_conv = self.by_conversation()
        for conv in self.conversations:
            messages = conv.messages()
            for q in by_conv[conv.id]:
                out[q.id] = [messages[e][1].text() for e in q.evidence_ids if e in messages]
        return out


def read_json(path: Path) -> Any:
    """Parse one JSON file; any failure becomes a one-line `DataError` naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON (line {e.lineno} column {e.colno})") from None


def read_records(path: Path, kind: str, key: str) -> list[dict[str, Any]]:
    """A JSON file holding a list of objects, each with a unique non-empty string ``key``;
    every violation is a one-line `DataError` naming the file and the record (``kind [i]``)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of {kind}s, got {type(data).__name__}")
    seen: set[str] = set()
    for i, raw in enumerate(data):
        if not isinstance(raw, dict):
            raise DataError(f"{path}: {kind} [{i}] is {type(raw).__name__}, not an object")
        rid = raw.get(key)
        if not isinstance(rid, str) or not rid:
            raise DataError(f"{path}: {kind} [{i}] has no string {key!r}")
        if rid in seen:
            raise DataError(f"{path}: {kind} [{i}] repeats {key} {rid!r}")
        seen.add(rid)
    return data
