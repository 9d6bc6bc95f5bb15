"""Answer scoring: the interface every benchmark's answer scorer implements, and the registry.

Owns :class:`Judged`, the :class:`AnswerScorer` protocol, :func:`prompt_sha256` and
:func:`make_scorer`. Implementations live one module per benchmark —
:mod:`evolve.scoring.beam_judge`, :mod:`evolve.scoring.locomo`,
:mod:`evolve.scoring.longmemeval` — each following its benchmark authors' protocol
(``benchmarks.md`` §2.5, §3.3, §4.3).

Invariants:

- A scorer scores one question's answer at a time; the executor calls it in the parent process
  after retrieval and answering, with the answers the task model gave. It never sees the
  program or the retrieved text.
- Every judge call goes through the :class:`~evolve.models.llm.LLMClient` it was built with,
  under role ``judge`` and stage ``<bench>/<what>`` (so it is cached and counted like every
  other call). With no judge, judged metrics are ``None`` (not 0) and :meth:`describe` says that
  no judge was used; metrics that need no LLM (LoCoMo's token F1, BLEU-1) are still computed.
- Every result records the judge model, the sha256 of each judge prompt template and the
  variant(s) scored (:meth:`AnswerScorer.describe`).
- Per-question metric values are floats in [0, 1] or ``None`` (not applicable / not judged);
  the executor's aggregation takes means over the non-None values, per capability, per native
  type and overall; :meth:`AnswerScorer.summarize` adds the benchmark's own headline numbers.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from evolve.datasets.types import Question
from evolve.models.llm import LLMClient

BENCH_SCORERS = {
    "beam": "evolve.scoring.beam_judge",
    "locomo": "evolve.scoring.locomo",
    "longmemeval": "evolve.scoring.longmemeval",
}


@dataclass(frozen=True)
class Judged:
    """One question's answer scores, and what the judge said (kept in the trace)."""

    scores: dict[str, float | None]
    detail: dict[str, Any] = field(default_factory=dict)


class AnswerScorer(Protocol):
    """Scores answers the way one benchmark's authors do."""

    bench: str
    metrics: tuple[str, ...]  # every key :meth:`score` fills, in report order

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


def make_scorer(bench: str, judge: LLMClient | None) -> AnswerScorer:
    """The answer scorer of ``bench``; ``judge`` None means no judge (see the invariants)."""
    if bench not in BENCH_SCORERS:
        raise ValueError(f"no answer scorer for benchmark {bench!r}")
    module = importlib.import_module(BENCH_SCORERS[bench])
    scorer: AnswerScorer = module.Scorer(judge)
    return scorer
