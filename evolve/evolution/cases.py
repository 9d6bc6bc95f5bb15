"""Cases shown to a proposer: the parent's failing train questions, and paired differential
cases between two programs, each cut to a compact size.

Owns :func:`failing_cases` and :func:`differential_cases`. A case holds what a coder needs to
see why retrieval missed: the question and reference answer, the evidence messages the answer
depends on, the query plan, the head of the retrieved text, the predicted answer and the scores.

Invariants: cases come from the train split only (the loop passes train traces and the train
task set). Selection is deterministic: ``"worst"`` takes the lowest mean of evidence similarity
and hit rate (ties by question id); ``"random"`` (an ablation) draws with a seeded generator.
With labels, a target capability selects the tasks whose primary or secondary label is that
capability. Every text is cut to a fixed number of characters, so a case's size is bounded
whatever the conversation.
"""

from __future__ import annotations

import random
from typing import Any

from evolve.datasets.types import Question, TaskSet
from evolve.evolution.annotate import Labels

EVIDENCE_CHARS = 400  # per evidence message
RETRIEVED_CHARS = 1_500  # head of the retrieved text
MAX_EVIDENCE = 4
CASE_CHARS = EVIDENCE_CHARS * (MAX_EVIDENCE + 1) + RETRIEVED_CHARS + 800  # a case, rendered


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more chars]"


def _badness(trace: dict[str, Any]) -> float:
    scores = trace.get("scores") or {}
    values = [scores.get("evidence_similarity"), scores.get("evidence_hit_rate")]
    return sum(v for v in values if isinstance(v, int | float)) / len(values)


def failing_cases(
    traces: list[dict[str, Any]],
    tasks: TaskSet,
    target: str | None,
    limit: int = 4,
    *,
    labels: dict[str, Labels] | None = None,
    mode: str = "worst",
    seed: str = "",
) -> tuple[dict[str, Any], ...]:
    """Up to ``limit`` questions of capability ``target`` (all when None): the worst-scored, or
    a seeded random draw (``mode="random"``)."""
    questions = {q.id: q for q in tasks.questions}
    pool = [t for t in traces if t.get("id") in questions]
    if target is not None:
        pool = [t for t in pool if _covers(questions[t["id"]], target, labels)]
    pool.sort(key=lambda t: (_badness(t), t["id"]))
    if mode == "random":
        random.Random(seed).shuffle(pool)
    return tuple(_case(trace, questions[trace["id"]], tasks) for trace in pool[:limit])


def differential_cases(
    mine: list[dict[str, Any]], theirs: list[dict[str, Any]], tasks: TaskSet, limit: int = 2
) -> tuple[dict[str, Any], ...]:
    """Paired cases: the questions where the other program beats this one most, then those
    where this one beats the other most (up to ``limit`` each), each with both traces."""
    questions = {q.id: q for q in tasks.questions}
    other = {t["id"]: t for t in theirs if t.get("id") in questions}
    pairs = [(t, other[t["id"]]) for t in mine if t.get("id") in other]
    gaps = sorted(pairs, key=lambda p: (_badness(p[0]) - _badness(p[1]), p[0]["id"]))
    chosen = [p for p in gaps[:limit] if _badness(p[1]) > _badness(p[0])]
    chosen += [p for p in gaps[::-1][:limit] if _badness(p[0]) > _badness(p[1])]
    out = []
    for a, b in chosen:
        case = _case(a, questions[a["id"]], tasks)
        theirs_case = _case(b, questions[b["id"]], tasks)
        case["other"] = {k: theirs_case[k] for k in ("query", "retrieved", "retrieved_chars",
                                                     "answer", "scores")}  # fmt: skip
        out.append(case)
    return tuple(out)


def _covers(q: Question, target: str, labels: dict[str, Labels] | None) -> bool:
    if labels is not None and q.id in labels:
        return labels[q.id].covers(target)
    return q.capability == target


def _case(trace: dict[str, Any], q: Question, tasks: TaskSet) -> dict[str, Any]:
    conv = next(c for c in tasks.conversations if c.id == q.conversation_id)
    found = conv.messages()
    evidence = [
        _cut(f"[{found[e][0].date or 'undated'}] {found[e][1].role}: {found[e][1].content}",
             EVIDENCE_CHARS)
        for e in q.evidence_ids[:MAX_EVIDENCE]
        if e in found
    ]  # fmt: skip
    retrieved = trace.get("retrieved") or ""
    return {
        "id": q.id,
        "capability": q.capability,
        "ability": q.ability,
        "question": q.question,
        "reference_answer": _cut(q.gold, EVIDENCE_CHARS),
        "evidence": evidence,
        "query": trace.get("query"),
        "retrieved": _cut(retrieved, RETRIEVED_CHARS),
        "retrieved_chars": len(retrieved),
        "answer": trace.get("answer"),
        "scores": {k: v for k, v in (trace.get("scores") or {}).items() if v is not None},
        "error": trace.get("error"),
    }
