"""The task-model prompts of evaluation: extraction, planning and answering.

Owns the prompt templates, the extraction window (how a session is cut into extraction calls)
and the lookup of a program's instruction strings (read from its source without running it).
:class:`evolve.session.ConversationSession` sends these prompts; stage keys fold in
:func:`texts` through :func:`evolve.session.evaluator_version`.

Invariants:
- Every text or number here that shapes a prompt is listed in :func:`texts`, so changing one
  changes every stage key and no cached output of the old prompt is reused.
- An instruction is a string literal assigned at the program's top level; anything else is a
  :class:`~contract.types.ContractError`.
- Extraction windows cover a session's messages in order, each within
  :data:`EXTRACT_WINDOW_CHARS` (one message at least, however long).
"""

from __future__ import annotations

import ast
import functools
import json
from typing import Any

from contract.parsing import parse
from contract.spec import INSTRUCTIONS
from contract.types import ContractError
from evolve.datasets.types import Question, Segment

EXTRACT_WINDOW_CHARS = 24_000  # one extraction call sees at most this much of a session
SCHEMA_PROMPT = "{instruction}\n\nReply with one JSON object matching this schema:\n{schema}\n\n"
EXTRACT_PROMPT = SCHEMA_PROMPT + "{window}"
PLAN_PROMPT = SCHEMA_PROMPT + "Question: {question}{when}"
PLAN_DATE = "\nThe question is asked on {date}."
ANSWER_PROMPT = (
    "{instruction}\n\nRetrieved memories:\n{retrieved}\n\n{today}Question: {question}\nAnswer:"
)
ANSWER_DATE = "Today is {date}.\n"


def texts() -> list[Any]:
    """Everything here that shapes a prompt, read at call time (for the evaluator version)."""
    return [SCHEMA_PROMPT, EXTRACT_PROMPT, PLAN_PROMPT, PLAN_DATE, ANSWER_PROMPT, ANSWER_DATE,
            EXTRACT_WINDOW_CHARS]  # fmt: skip


def units_schema(unit_schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one extraction reply: ``{"units": [<unit>, ...]}``."""
    return {
        "type": "object",
        "properties": {"units": {"type": "array", "items": unit_schema}},
        "required": ["units"],
        "additionalProperties": False,
    }


def extraction_prompt(source: str, reply_schema: dict[str, Any], window: Segment) -> str:
    return EXTRACT_PROMPT.format(
        instruction=instruction(source, INSTRUCTIONS["extract"]),
        schema=json.dumps(reply_schema),
        window=window.render(),
    )


def planning_prompt(source: str, query_schema: dict[str, Any], q: Question) -> str:
    return PLAN_PROMPT.format(
        instruction=instruction(source, INSTRUCTIONS["plan"]),
        schema=json.dumps(query_schema),
        question=q.question,
        when=PLAN_DATE.format(date=q.question_date) if q.question_date else "",
    )


def answer_prompt(source: str, retrieved: str, q: Question) -> str:
    return ANSWER_PROMPT.format(
        instruction=instruction(source, INSTRUCTIONS["answer"]),
        retrieved=retrieved,
        today=ANSWER_DATE.format(date=q.question_date) if q.question_date else "",
        question=q.posed,
    )


@functools.lru_cache(maxsize=64)  # called for every LLM prompt: parse each source once
def instruction(source: str, name: str) -> str:
    """An instruction string read from the source without running it (a literal assignment)."""
    for node in parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise ContractError(f"{name} must be assigned a string literal")


def extraction_windows(segment: Segment) -> list[Segment]:
    """Consecutive slices of a session, each within EXTRACT_WINDOW_CHARS (one message at least)."""
    out: list[Segment] = []
    current: list[Any] = []
    size = 0
    for m in segment.messages:
        if current and size + len(m.content) > EXTRACT_WINDOW_CHARS:
            out.append(Segment(segment.session_id, segment.date, tuple(current)))
            current, size = [], 0
        current.append(m)
        size += len(m.content)
    if current or not out:
        out.append(Segment(segment.session_id, segment.date, tuple(current)))
    return out
