"""Capability annotation: each task's primary and secondary capabilities (docs/design.md §3).

Owns :class:`Labels`, :func:`native_labels`, :func:`annotate` (a run's labels),
:func:`label_questions` (the annotator's labels of some questions), :func:`unlabelled` and
:func:`with_labels` (the questions of a dataset given their annotated capability, for
``evolve data annotate``).

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
- A question with no capability (``Question.capability == ""``, a user's) has no native label:
  without an annotator (or where the annotator gave no valid label) its label is unlabelled
  (``primary == ""``, no secondaries, a ``none: ...`` source); it still counts in every overall
  fitness, and no capability's figures and no refinement target count it.
- :func:`with_labels` changes only questions with no capability, and only to a capability of
  F, T, P, M, A, recording whose label it is in ``meta["capability_source"]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES, Question, TaskSet
from evolve.models.llm import JSONReplyError, LLMClient

MAX_SECONDARY = 2
NO_ANNOTATOR = "none: no capability given and no annotator"
NO_VALID_LABEL = "the annotator gave no valid label"
SOURCE_KEY = "capability_source"  # Question.meta key: whose label a written capability is

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
    primary: str  # "" = unlabelled
    secondary: tuple[str, ...]
    # "native", "annotator:<model>", "native: <why the annotator's was not used>", or for a
    # question with no capability "none: <why it has no label>"
    source: str

    def covers(self, capability: str) -> bool:
        return capability == self.primary or capability in self.secondary

    @property
    def labelled(self) -> bool:
        return self.primary in CAPABILITIES


def native_labels(tasks: TaskSet) -> dict[str, Labels]:
    return {q.id: Labels(q.capability, (), "native" if q.capability else NO_ANNOTATOR)
            for q in tasks.questions}  # fmt: skip


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
    return label_questions(tasks.questions, llm)


def label_questions(questions: Iterable[Question], llm: LLMClient) -> dict[str, Labels]:
    """The annotator's labels of ``questions`` (``llm`` has an annotator), one call each."""
    config = llm.models.annotator
    assert config is not None
    llm = llm.view()  # its records are dropped with it (the call log keeps every call)
    out = {}
    for q in questions:
        try:
            primary, secondary = llm.complete_json(
                "annotator", "annotate", _prompt(q), SCHEMA, _validate, max_tokens=60
            )
        except JSONReplyError:  # the model answered, but never usably: this task keeps its own
            why = f"native: {NO_VALID_LABEL}" if q.capability else f"none: {NO_VALID_LABEL}"
            out[q.id] = Labels(q.capability, (), why)
            continue
        out[q.id] = Labels(primary, secondary, f"annotator:{config.model}")
    return out


def unlabelled(questions: Iterable[Question]) -> tuple[Question, ...]:
    """The questions that carry no capability."""
    return tuple(q for q in questions if not q.capability)


def with_labels(questions: Iterable[Question], labels: dict[str, Labels]) -> tuple[Question, ...]:
    """``questions`` in their order, each one with no capability given its label's primary
    (and the label's source as ``meta["capability_source"]``) where it has a label; every other
    question as it is."""
    out = []
    for q in questions:
        label = labels.get(q.id)
        if not q.capability and label is not None and label.labelled:
            q = replace(q, capability=label.primary, meta={**q.meta, SOURCE_KEY: label.source})
        out.append(q)
    return tuple(out)
