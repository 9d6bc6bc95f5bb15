"""What a memory program receives: ``Segment`` / ``Message`` and the ``MemoryBackend`` it is given.

Invariants:
- ``Segment`` and ``Message`` are frozen; a memory program receives them read-only. Message ids
  are strings, unique within a conversation.
- A ``Segment`` is one session of a history in source order, with its date when the benchmark
  gives one (ISO ``YYYY-MM-DD`` when parseable, otherwise the benchmark's own text).
- :func:`content_digest` is the one content hash of these values (:meth:`Segment.digest` keys
  the extraction cache).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np


def content_digest(payload: Any) -> str:
    """sha256 of ``payload`` as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Message:
    id: str
    role: str
    content: str

    def text(self) -> str:
        """The message as ``"role: content"``: the one text of a message wherever it stands
        for itself — an offline unit's text, the evidence the offline scorer compares retrieved
        text with, a diagnostic's snippet, a diagnostic case's evidence line."""
        return f"{self.role}: {self.content}"


@dataclass(frozen=True)
class Segment:
    """One session of a history, as handed to a memory program's extraction and `index`."""

    session_id: str
    date: str | None
    messages: tuple[Message, ...]

    def render(self) -> str:
        """The segment as plain text: a header line, then one ``[id] role: content`` per message."""
        header = f"## Session {self.session_id}" + (f" ({self.date})" if self.date else "")
        lines = [header] + [f"[{m.id}] {m.text()}" for m in self.messages]
        return "\n".join(lines)

    def digest(self) -> str:
        """A content hash (id, date, every message); keys the extraction cache."""
        return content_digest(asdict(self))


class ContractError(Exception):
    """A program violates the contract; the message names the rule and, when known, the line."""


class BackendError(RuntimeError):
    """A program asked the backend for something it cannot give (no LLM, budget spent)."""


class MemoryBackend(Protocol):
    """What ``Memory.__init__`` receives."""

    dim: int
    max_complete_calls: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def complete(self, prompt: str, max_tokens: int = 256) -> str: ...
