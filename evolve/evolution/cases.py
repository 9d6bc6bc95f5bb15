"""Failing cases shown to a proposer: the parent's worst train questions, cut to a compact size.

Owns :func:`failing_cases`. A case holds what a coder needs to see why retrieval missed: the
question and reference answer, the evidence messages the answer depends on, the query plan, the
head of the retrieved text, the predicted answer and the scores.

Invariants: cases come from the train split only (the loop passes train traces and the train
task set); they are chosen deterministically (lowest mean of evidence similarity and hit rate,
ties by question id); every text is cut to a fixed number of characters, so a case's size is
bounded whatever the conversation. The design's span-selected compact cases (§4) replace the
plain cuts when the diagnosis stage lands.
"""

from __future__ import annotations

from typing import Any

from evolve.datasets.types import TaskSet

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
    traces: list[dict[str, Any]], tasks: TaskSet, target: str | None, limit: int = 4
) -> tuple[dict[str, Any], ...]:
    """Up to ``limit`` of the worst-scored questions (of capability ``target`` when given)."""
    questions = {q.id: q for q in tasks.questions}
    messages = {c.id: c.messages() for c in tasks.conversations}
    pool = [t for t in traces if t.get("id") in questions]
    if target is not None:
        pool = [t for t in pool if questions[t["id"]].capability == target]
    cases = []
    for trace in sorted(pool, key=lambda t: (_badness(t), t["id"]))[:limit]:
        q = questions[trace["id"]]
        found = messages.get(q.conversation_id, {})
        evidence = [
            _cut(f"[{found[e][0].date or 'undated'}] {found[e][1].role}: {found[e][1].content}",
                 EVIDENCE_CHARS)
            for e in q.evidence_ids[:MAX_EVIDENCE]
            if e in found
        ]  # fmt: skip
        retrieved = trace.get("retrieved") or ""
        cases.append({
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
        })  # fmt: skip
    return tuple(cases)
