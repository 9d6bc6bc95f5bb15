"""Writing probing questions: one JSON call per (window, kind).

Owns :class:`Draft` (a written question before any check), :data:`PURPOSE`, :func:`prompt`,
:data:`SCHEMA`, :func:`draft` (the call, its reply validated into drafts) and :func:`validated`
(a model's JSON reply as a small pydantic record, for this call and the checks').

Invariants:

- The request is a pure function of the window's rendered text, the kind and the number asked
  for, so a rerun makes the same request and is answered from the request cache.
- A reply is usable when it is ``{"questions": [...]}`` whose items each have a non-empty
  ``question`` and ``answer`` and an ``evidence`` list of strings (:class:`_Reply`); anything
  else is a ValueError naming the field (:func:`validated`), for
  :meth:`evolve.models.llm.LLMClient.complete_json` to ask again. Items past the number asked
  for are ignored, unchecked.
- A draft's id is ``synth/<window id>/<kind>/<n>`` (n from 1, in reply order): deterministic.
  Its evidence is as the model wrote it until :func:`evolve.synth.checks.resolve` moves the
  ids that name no message of its window to ``unknown``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, StrictStr, ValidationError, ValidationInfo, field_validator

from evolve.models import why
from evolve.models.llm import LLMClient
from evolve.synth.kinds import Kind
from evolve.synth.windows import Window

R = TypeVar("R", bound=BaseModel)
PURPOSE = "synth/write"
ID_PREFIX = "synth/"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "question": {"type": "string"},
                    "answer": {"type": "string"},
                    "evidence": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["question", "answer", "evidence"],
            },
        }
    },
    "required": ["questions"],
}


@dataclass(frozen=True)
class Draft:
    id: str
    conversation: str
    window: str
    kind: Kind
    question: str
    answer: str
    evidence: tuple[str, ...]
    unknown: tuple[str, ...] = ()  # cited ids that name no message of its window (dropped)


def prompt(window: Window, kind: Kind, n: int) -> str:
    return (
        "You write probing questions that test whether an assistant remembers its past "
        "conversations with a user. Below is part of one conversation history: sessions "
        "(with their dates, when known) and messages, one per line as "
        '"[message id] role: content".\n\n'
        f"{window.render()}\n\n"
        f"Write {n} {kind.name} question{'s' if n != 1 else ''}: {kind.instruction}\n"
        "Ask as the user would ask the assistant later. Give each a short answer and the ids "
        "of the messages that support it, copied exactly as they appear in brackets.\n"
        'Reply with JSON only: {"questions": [{"question": "...", "answer": "...", '
        '"evidence": ["<message id>", ...]}]}'
    )


def validated(record: type[R], data: Any, context: dict[str, Any] | None = None) -> R:
    """``data`` (a parsed JSON reply) as ``record``; else a ValueError naming the field and what
    is wrong with it (pydantic's first error), which ``complete_json`` shows the model."""
    try:
        return record.model_validate(data, context=context)
    except ValidationError as exc:
        raise ValueError(why(exc)) from None


class _Item(BaseModel):
    question: StrictStr
    answer: StrictStr
    evidence: list[StrictStr]

    @field_validator("question", "answer")
    @classmethod
    def _text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must hold text")
        return value.strip()


class _Reply(BaseModel):
    questions: list[_Item]

    @field_validator("questions", mode="before")
    @classmethod
    def _asked(cls, value: Any, info: ValidationInfo) -> Any:
        """Only the first ``n`` items (the number asked for, the context's) are read."""
        return value[: info.context["n"]] if isinstance(value, list) and info.context else value


def draft(client: LLMClient, window: Window, kind: Kind, n: int) -> list[Draft]:
    """Ask for ``n`` questions of ``kind`` about ``window``; raises what the client raises."""
    reply = client.complete_json("task", PURPOSE, prompt(window, kind, n), SCHEMA,
                                 lambda data: validated(_Reply, data, {"n": n}))  # fmt: skip
    return [
        Draft(
            f"{ID_PREFIX}{window.id}/{kind.name}/{i}",
            window.conversation,
            window.id,
            kind,
            item.question,
            item.answer,
            tuple(dict.fromkeys(item.evidence)),
        )  # fmt: skip
        for i, item in enumerate(reply.questions, 1)
    ]
