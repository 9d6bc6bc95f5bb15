"""The task-model prompts of evaluation: extraction, planning and answering.

Owns the prompt templates, the extraction window (how a session is cut into extraction calls)
and the check of a program's instruction strings as its host reports them
(:func:`reported_instructions`). :class:`evolve.evaluation.pipeline.Pipeline` sends these prompts;
step
keys fold in :func:`texts` through :func:`evolve.evaluation.identity.pipeline_version`.

Invariants:
- Every text or number here that shapes a prompt is listed in :func:`texts`, so changing one
  changes every step key and no cached output of the old prompt is reused.
- An instruction is the value the loaded program holds (however its source builds it: plain,
  annotated or concatenated assignments, the last one winning), as the host reports it after
  loading (:meth:`sandbox.serve.Server.op_load`). The host is untrusted: the report must map
  each name of :data:`~contract.spec.INSTRUCTIONS` to an exact ``str`` of at most
  :data:`INSTRUCTION_MAX_CHARS` characters, non-blank; anything else is a
  :class:`~contract.types.ContractError`.
- Extraction windows cover a session's messages in order, each within
  :data:`EXTRACT_WINDOW_CHARS` (one message at least, however long).
"""

from __future__ import annotations

import json
from typing import Any

from contract.spec import INSTRUCTIONS
from contract.types import ContractError
from evolve.datasets.types import Segment

EXTRACT_WINDOW_CHARS = 24_000  # one extraction call sees at most this much of a session
INSTRUCTION_MAX_CHARS = 20_000  # an instruction longer than this fails the conversation
SCHEMA_PROMPT = "{instruction}\n\nReply with one JSON object matching this schema:\n{schema}\n\n"
EXTRACT_PROMPT = SCHEMA_PROMPT + "{window}"
PLAN_PROMPT = SCHEMA_PROMPT + "Question: {question}{when}"
PLAN_DATE = "\nThe question is asked on {date}."
ANSWER_PROMPT = (
    "{instruction}\n\nRetrieved memories:\n{retrieved}\n\n{today}Question: {question}\nAnswer:"
)
ANSWER_DATE = "Today is {date}.\n"


def texts() -> list[Any]:
    """Everything here that shapes a prompt, read at call time (for the pipeline version)."""
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


def reported_instructions(report: Any) -> dict[str, str]:
    """The instructions a host reported after loading (``{"instructions": {name: value}}``),
    keyed by component (``extract``, ``plan``, ``answer``), each checked: an exact non-blank
    ``str`` of at most INSTRUCTION_MAX_CHARS characters."""
    values = report.get("instructions") if isinstance(report, dict) else None
    if not isinstance(values, dict):
        raise ContractError("the program host did not report the instructions")
    out: dict[str, str] = {}
    for component, name in INSTRUCTIONS.items():
        value = values.get(name)
        if type(value) is not str or not value.strip():
            raise ContractError(f"{name} must be a non-empty string")
        if len(value) > INSTRUCTION_MAX_CHARS:
            raise ContractError(
                f"{name} is {len(value)} characters long; at most {INSTRUCTION_MAX_CHARS}"
            )
        out[component] = value
    return out


def extraction_prompt(instruction: str, reply_schema: dict[str, Any], window: Segment) -> str:
    return EXTRACT_PROMPT.format(
        instruction=instruction, schema=json.dumps(reply_schema), window=window.render()
    )


def planning_prompt(
    instruction: str, query_schema: dict[str, Any], question: str, date: str | None
) -> str:
    return PLAN_PROMPT.format(
        instruction=instruction,
        schema=json.dumps(query_schema),
        question=question,
        when=PLAN_DATE.format(date=date) if date else "",
    )


def answer_prompt(instruction: str, retrieved: str, question: str, date: str | None) -> str:
    """``question`` as the answer model is to see it (a benchmark's ``Question.posed``)."""
    return ANSWER_PROMPT.format(
        instruction=instruction,
        retrieved=retrieved,
        today=ANSWER_DATE.format(date=date) if date else "",
        question=question,
    )


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
