"""One question's trace through evaluation: what each step produced, its scores, its error.

A :class:`QuestionTrace` is built by the worker (:mod:`evolve.evaluation.conversation`: query,
retrieval,
answer, diagnostics, error), completed by the executor (question labels, scores, judge detail)
and read by cases, diagnostics, the archive, comparison and the run's reports. It is written
as one JSON object per line (``questions.jsonl`` of ``evolve eval``, the run store's
``<id>.<split>.jsonl.gz``) and read back with :func:`read_trace`.

Invariants:
- ``id`` and ``conversation_id`` are required: a line without them is refused
  (:class:`TraceError`), never read as an anonymous question.
- Every other field is optional and defaults to empty, so traces written by older runs (which
  leave out what they did not compute) still read; fields this version does not know are
  ignored.
- Writing and reading back gives an equal trace (:meth:`QuestionTrace.to_json`,
  :func:`read_trace`).
- ``error`` set means the question failed at the step it names; its retrieval metrics are 0
  and its answer is scored as empty (the executor's rule).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class TraceError(ValueError):
    """A stored trace that is not one (not JSON, or without its question's identity)."""


class QuestionTrace(BaseModel):
    """One question's path through the steps, and its scores."""

    model_config = ConfigDict(extra="ignore")

    id: str
    conversation_id: str
    # planning
    query: dict[str, Any] | None = None
    # retrieval
    retrieved: str | None = None
    over_budget: bool | None = None
    raw_chars: int | None = None
    retrieve_ms: float | None = None
    # answering (None: offline, failed or not reached)
    answer: str | None = None
    error: str | None = None
    # cold-start diagnostics (evolve.evaluation.diagnostics), when asked for
    diagnostics: dict[str, float] | None = None
    diagnostics_error: str | None = None
    # added by the executor when it scores the question
    ability: str | None = None
    capability: str | None = None
    question: str | None = None
    scores: dict[str, float | None] = {}
    judged: dict[str, Any] | None = None

    @property
    def retrieved_text(self) -> str:
        """The retrieved text, empty when retrieval did not run."""
        return self.retrieved or ""

    def to_json(self) -> str:
        """One line of JSON (non-ASCII kept) that :func:`read_trace` reads back equal."""
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False)


def read_trace(line: str | dict[str, Any]) -> QuestionTrace:
    """A trace from one stored JSON line (or its decoded object); raises TraceError."""
    try:
        data = json.loads(line) if isinstance(line, str) else line
        return QuestionTrace.model_validate(data)
    except json.JSONDecodeError as exc:
        raise TraceError(f"a trace is not JSON: {exc.msg}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'trace'}: {e['msg']}" for e in exc.errors()
        )
        raise TraceError(f"not a question trace: {problems}") from None


def first_error(traces: list[QuestionTrace]) -> str:
    """The error of the first failed question (empty when none failed)."""
    return next((t.error for t in traces if t.error), "")
