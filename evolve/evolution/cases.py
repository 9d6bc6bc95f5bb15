"""Cases shown to a proposer: the parent's failing train questions, and paired differential
cases between two programs, made compact as docs/design.md §4 describes.

Owns :func:`failing_cases`, :func:`differential_cases`, :data:`UnitsOf` and the
:class:`CaseOrder` protocol (what ``RunConfig.cases`` / ``--cases`` names) with its two
strategies, :class:`WorstFirst` (``worst``, the default) and :class:`SeededDraw` (``random``, an
ablation). A case holds what a
coder needs to see why retrieval missed: the question and reference answer, each evidence
message with its session (the source text) and the memory units extracted from that session,
the query plan, the retrieved text, the predicted answer and the scores. Every long text is
excerpted by :func:`evolve.evolution.compact.compact_case` (2,400 characters per excerpt, spans
chosen to cover the question, answer, evidence and prediction; each evidence keeps its best
unit).

Invariants: cases come from the train split only (the loop passes train traces and the train
task set). The order is deterministic: :class:`WorstFirst` takes the lowest fitness
(:func:`evolve.evolution.archive.score_fitness`, ties by question id); :class:`SeededDraw`
shuffles that order with a generator seeded by the run seed and the round. With labels, a
target capability selects the tasks whose primary or secondary label is that capability (an
unlabelled task is never selected). A case names its question's native capability, or
``unlabelled``. At most :data:`MAX_EVIDENCE` evidence messages per case.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from evolve.datasets.types import UNLABELLED, Question, TaskSet
from evolve.evaluation.diagnostics import unit_text
from evolve.evolution.annotate import Labels
from evolve.evolution.archive import score_fitness
from evolve.evolution.compact import compact_case
from evolve.models.embed import Embedder
from evolve.trace import QuestionTrace

MAX_EVIDENCE = 4
CASE_CHARS = 11_300  # a compact case's mean size on BEAM-100K train (bench/compact_cases.py)
UnitsOf = Callable[[str, int], list[dict[str, Any]] | None]  # (conversation id, session) -> units


class CaseOrder(Protocol):
    """Which of the parent's train questions a proposer is shown as failing cases: the first
    ``limit`` of :meth:`order` (``RunConfig.cases`` names one, by its ``name``)."""

    name: str

    def order(self, pool: list[QuestionTrace], seed: str) -> list[QuestionTrace]:
        """``pool`` in the order its cases are shown (``seed``: the run seed and the round)."""
        ...


class WorstFirst:
    """The default: the lowest fitness first, ties by question id."""

    name = "worst"

    def order(self, pool: list[QuestionTrace], seed: str) -> list[QuestionTrace]:
        return sorted(pool, key=lambda t: (score_fitness(t.scores), t.id))


class SeededDraw:
    """An ablation: the worst-first order shuffled by a generator seeded with ``seed``."""

    name = "random"

    def order(self, pool: list[QuestionTrace], seed: str) -> list[QuestionTrace]:
        drawn = WorstFirst().order(pool, seed)
        random.Random(seed).shuffle(drawn)
        return drawn


WORST = WorstFirst()


def failing_cases(
    traces: list[QuestionTrace],
    tasks: TaskSet,
    target: str | None,
    limit: int = 4,
    *,
    labels: dict[str, Labels] | None = None,
    order: CaseOrder = WORST,
    seed: str = "",
    embedder: Embedder,
    units_of: UnitsOf | None = None,
) -> tuple[dict[str, Any], ...]:
    """Up to ``limit`` questions of capability ``target`` (all when None), the first of
    ``order`` (the worst-scored by default; ``seed`` for a seeded draw)."""
    questions = {q.id: q for q in tasks.questions}
    pool = [t for t in traces if t.id in questions]
    if target is not None:
        pool = [t for t in pool if _covers(questions[t.id], target, labels)]
    chosen = order.order(pool, seed)[:limit]
    return tuple(_case(t, questions[t.id], tasks, embedder, units_of) for t in chosen)


def differential_cases(
    mine: list[QuestionTrace],
    theirs: list[QuestionTrace],
    tasks: TaskSet,
    embedder: Embedder,
    limit: int = 2,
) -> tuple[dict[str, Any], ...]:
    """Paired cases: the questions where the other program beats this one most, then those
    where this one beats the other most (up to ``limit`` each), each with both traces."""
    questions = {q.id: q for q in tasks.questions}
    other = {t.id: t for t in theirs if t.id in questions}
    pairs = [(t, other[t.id]) for t in mine if t.id in other]
    a_fit = {a.id: score_fitness(a.scores) for a, _ in pairs}  # this program's, per question
    b_fit = {b.id: score_fitness(b.scores) for _, b in pairs}  # the other's
    gaps = sorted(pairs, key=lambda p: (a_fit[p[0].id] - b_fit[p[0].id], p[0].id))
    chosen = [p for p in gaps[:limit] if b_fit[p[0].id] > a_fit[p[0].id]]
    chosen += [p for p in gaps[::-1][:limit] if a_fit[p[0].id] > b_fit[p[0].id]]
    out = []
    for a, b in chosen:
        case = _case(a, questions[a.id], tasks, embedder, None)
        theirs_case = _case(b, questions[b.id], tasks, embedder, None)
        case["other"] = {k: theirs_case[k] for k in ("query", "retrieved", "retrieved_chars",
                                                     "answer", "scores")}  # fmt: skip
        out.append(case)
    return tuple(out)


def _covers(q: Question, target: str, labels: dict[str, Labels] | None) -> bool:
    if labels is not None and q.id in labels:
        return labels[q.id].covers(target)
    return q.capability == target


def _case(
    trace: QuestionTrace,
    q: Question,
    tasks: TaskSet,
    embedder: Embedder,
    units_of: UnitsOf | None,
) -> dict[str, Any]:
    conv = next(c for c in tasks.conversations if c.id == q.conversation_id)
    found = conv.messages()
    session = {s.session_id: i for i, s in enumerate(conv.sessions)}
    evidence, sources, units = [], [], []
    for e in [e for e in q.evidence_ids if e in found][:MAX_EVIDENCE]:
        segment, message = found[e]
        evidence.append(f"[{segment.date or 'undated'}] {message.text()}")
        sources.append(segment.render())
        stored = units_of(conv.id, session[segment.session_id]) if units_of else None
        units.append([unit_text(u) for u in stored or []])
    case: dict[str, Any] = {
        "id": q.id,
        "capability": q.capability or UNLABELLED,
        "ability": q.ability,
        "question": q.question,
        "reference_answer": q.gold,
        "evidence": evidence,
        "evidence_source": sources,
        "query": trace.query,
        "retrieved": trace.retrieved_text,
        "retrieved_chars": len(trace.retrieved_text),
        "answer": trace.answer,
        "scores": {k: v for k, v in trace.scores.items() if v is not None},
        "error": trace.error,
    }
    if all(units):  # units are shown when every evidence has its session's units
        case["units_for_evidence"] = units
    return compact_case(case, embedder)
