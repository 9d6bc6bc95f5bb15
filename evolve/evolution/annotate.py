"""Capability annotation: each task's primary and secondary capabilities (docs/design.md §3).

Owns :class:`Labels`, :func:`native_labels` and :func:`annotate`.

Invariants:

- Only train and valid tasks are annotated; the labels organise the optimizer's feedback (which
  capability is weak, which cases a refinement sees) and never reach a memory program.
- With an annotator model (role ``annotator``, purpose ``annotate``), each task is labelled by one
  JSON call; the reply is validated (capabilities from F, T, P, M, A; the primary not repeated
  among the secondaries) and repaired by the client if malformed; a task whose replies never
  validate keeps its native label, with a source that says so (a transport failure still stops
  the caller). Calls are cached by the LLM request cache, so a task is labelled once per model.
  They are made through a view of the client (:meth:`~evolve.models.llm.LLMClient.view`), so
  the shared client keeps no records of them.
- Without a model the benchmark's native map stands in (primary = the native capability, no
  secondaries) and every label says so (``source == "native"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES, Question, TaskSet
from evolve.models.llm import JSONReplyError, LLMClient

MAX_SECONDARY = 2

PROMPT = """Which memory capabilities does answering this question about a long conversation
history need? The capabilities:
{definitions}

Question: {question}
Reference answer: {gold}

Reply with JSON only: {{"primary": "<one letter>", "secondary": [<up to two other letters>]}}"""

DEFINITIONS = {
    "F": "recall a specific stated fact",
    "T": "track time: dates, durations, order of events, facts that were updated later",
    "P": "know the user's preferences and instructions and apply them",
    "M": "combine information spread over several sessions (aggregate, summarise, compare)",
    "A": "resist traps: contradictions, unanswerable questions, false premises",
}

SCHEMA = {
    "type": "object",
    "properties": {
        "primary": {"type": "string", "enum": list(CAPABILITIES)},
        "secondary": {
            "type": "array",
            "items": {"type": "string", "enum": list(CAPABILITIES)},
            "maxItems": MAX_SECONDARY,
        },
    },
    "required": ["primary"],
}


@dataclass(frozen=True)
class Labels:
    primary: str
    secondary: tuple[str, ...]
    source: str  # "native", "annotator:<model>" or "native: <why the annotator's was not used>"

    def covers(self, capability: str) -> bool:
        return capability == self.primary or capability in self.secondary


def native_labels(tasks: TaskSet) -> dict[str, Labels]:
    return {q.id: Labels(q.capability, (), "native") for q in tasks.questions}


def _validate(data: Any) -> tuple[str, tuple[str, ...]]:
    if not isinstance(data, dict) or data.get("primary") not in CAPABILITIES:
        raise ValueError(f'"primary" must be one of {", ".join(CAPABILITIES)}')
    secondary = data.get("secondary") or []
    if not isinstance(secondary, list) or any(s not in CAPABILITIES for s in secondary):
        raise ValueError(f'"secondary" must be a list of letters from {", ".join(CAPABILITIES)}')
    rest = tuple(dict.fromkeys(s for s in secondary if s != data["primary"]))
    return str(data["primary"]), rest[:MAX_SECONDARY]


def _prompt(q: Question) -> str:
    lines = "\n".join(f"- {c} ({CAPABILITY_NAMES[c]}): {d}" for c, d in DEFINITIONS.items())
    return PROMPT.format(definitions=lines, question=q.question, gold=q.gold[:600])


def annotate(tasks: TaskSet, llm: LLMClient | None) -> dict[str, Labels]:
    """Labels for every question of ``tasks`` (the native map when ``llm`` is None)."""
    if llm is None or not llm.available("annotator"):
        return native_labels(tasks)
    config = llm.models.annotator
    assert config is not None
    llm = llm.view()  # its records are dropped with it (the call log keeps every call)
    out = {}
    for q in tasks.questions:
        try:
            primary, secondary = llm.complete_json(
                "annotator", "annotate", _prompt(q), SCHEMA, _validate, max_tokens=60
            )
        except JSONReplyError:  # the model answered, but never usably: this task keeps its own
            out[q.id] = Labels(q.capability, (), "native: the annotator gave no valid label")
            continue
        out[q.id] = Labels(primary, secondary, f"annotator:{config.model}")
    return out
