"""Answer scoring: the interface every benchmark's answer scorer implements.

Owns :class:`Judged`, the :class:`AnswerScorer` protocol, :func:`prompt_sha256`,
:func:`score_answer` and :data:`UNJUDGED`. Implementations live one module per benchmark —
:mod:`evolve.scoring.beam_judge`, :mod:`evolve.scoring.locomo`,
:mod:`evolve.scoring.longmemeval` — each following its benchmark authors' protocol
(docs/benchmarks.md §2.5, §3.3, §4.3); a bench's entry in :mod:`evolve.benches.registry`
names its scorer.

Invariants:

- A scorer scores one question's answer at a time; the executor calls it in the parent process
  after retrieval and answering, with the answers the task model gave. It never sees the
  program or the retrieved text.
- Every judge call goes through the :class:`~evolve.models.llm.LLMClient` it was built with,
  under role ``judge`` and purpose ``<bench>/<what>`` (so it is cached and counted like every
  other call). With no judge, judged metrics are ``None`` (not 0) and :meth:`describe` says that
  no judge was used; metrics that need no LLM (LoCoMo's token F1, BLEU-1) are still computed.
- Every result records the judge model, the sha256 of each judge prompt template and the
  variant(s) scored (:meth:`AnswerScorer.describe`).
- A question whose judge reply never parses (:class:`~evolve.models.llm.JSONReplyError`, after
  the client's repairs) costs that question, not the evaluation (:func:`score_answer`, which
  the executor scores through): every metric of the scorer's
  ``judge_metrics`` is 0, the others are scored as without a judge, and its detail says why
  under :data:`UNJUDGED` (the executor counts such questions). A transport failure
  (:class:`~evolve.models.llm.LLMError`) still stops the caller.
- Per-question metric values are floats in [0, 1] or ``None`` (not applicable / not judged);
  the executor's aggregation takes means over the non-None values, per capability, per native
  type and overall; :meth:`AnswerScorer.summarize` adds the benchmark's own headline numbers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from evolve.datasets.types import Question
from evolve.models.llm import JSONReplyError

UNJUDGED = "unjudged"  # a trace's judge detail key: why its judge reply never parsed


@dataclass(frozen=True)
class Judged:
    """One question's answer scores, and what the judge said (kept in the trace)."""

    scores: dict[str, float | None]
    detail: dict[str, Any] = field(default_factory=dict)


class AnswerScorer(Protocol):
    """Scores answers the way one benchmark's authors do."""

    @property
    def bench(self) -> str:
        """The bench it scores (its name in the registry)."""
        ...

    @property
    def metrics(self) -> tuple[str, ...]:
        """Every key :meth:`score` fills, in report order."""
        ...

    @property
    def judge_metrics(self) -> tuple[str, ...]:
        """The metrics a judge's parsed reply gives."""
        ...

    def score(self, question: Question, answer: str) -> Judged:
        """Score one answer (judge calls, if any, go through the scorer's client)."""
        ...

    def max_judge_calls(self, question: Question) -> int:
        """At most how many judge calls :meth:`score` makes for ``question`` (the estimate of
        ``evolve run --dry-run``; repairs of malformed replies not counted)."""
        ...

    def summarize(self, rows: list[tuple[Question, dict[str, Any]]]) -> dict[str, Any]:
        """The benchmark's headline numbers from per-question scores (e.g. BEAM's mean of the
        ten abilities, LongMemEval's task-averaged and abstention accuracy)."""
        ...

    def describe(self) -> dict[str, Any]:
        """``{"judge": model id or None, "prompts": {name: sha256}, "variants": [...],
        "note": str}`` — recorded in every result."""
        ...


def prompt_sha256(template: str) -> str:
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def score_answer(
    scorer: AnswerScorer, unjudged: AnswerScorer, question: Question, answer: str
) -> Judged:
    """``scorer.score``, except that a judge reply that never parses costs only this question:
    0 on the scorer's ``judge_metrics``, the other metrics as ``unjudged`` (the same bench's
    scorer without a judge) scores them, and why under :data:`UNJUDGED` in the detail."""
    try:
        return scorer.score(question, answer)
    except JSONReplyError as exc:
        scores = dict(unjudged.score(question, answer).scores)
        scores.update(dict.fromkeys(scorer.judge_metrics, 0.0))
        return Judged(scores, {UNJUDGED: str(exc)[:500]})
