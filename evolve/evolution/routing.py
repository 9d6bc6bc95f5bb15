"""Routing baselines for integration (docs/design.md §4, stage 3): an integrated program must beat
sending each question to one specialist.

Owns :func:`routed_fitness`, :func:`question_routes` and :func:`compare`.

- A **router** maps each valid question to a capability; the routed score of a question is the
  valid fitness of that capability's specialist on it (the best program when the capability has
  no specialist). Routing needs no new execution: specialists already have per-question scores.
- The **oracle-label router** uses each question's native capability, which no real system
  knows: an upper bound for routing. The **question-only router** asks an LLM (role
  ``annotator``, purpose ``route``) for the capability from the question text alone; without a
  model it is not available and the comparison says so.
- :func:`compare` is recorded in the integrated candidate's valid scores (``routing``).
"""

from __future__ import annotations

from typing import Any

from evolve.datasets.types import CAPABILITIES, TaskSet
from evolve.evolution.annotate import DEFINITIONS
from evolve.evolution.archive import Archive, fitness
from evolve.evolution.candidate import VALID, CandidateMeta
from evolve.models.llm import LLMClient

PROMPT = """Which capability does a memory system mainly need to answer this question?
{definitions}

Question: {question}

Reply with JSON only: {{"capability": "<one letter>"}}"""

SCHEMA = {"type": "object", "properties": {"capability": {"type": "string",
          "enum": list(CAPABILITIES)}}, "required": ["capability"]}  # fmt: skip


def routed_fitness(routes: dict[str, str], kept: Archive) -> float | None:
    """Mean valid fitness when each routed question goes to its capability's specialist."""
    assert kept.best is not None
    values = []
    for qid, cap in routes.items():
        holder = kept.specialists.get(cap, kept.best)
        score = holder.scores[VALID].questions.get(qid)
        if score is not None:
            values.append(score)
    return sum(values) / len(values) if values else None


def _capability(data: Any) -> str:
    if not isinstance(data, dict) or data.get("capability") not in CAPABILITIES:
        raise ValueError(f'"capability" must be one of {", ".join(CAPABILITIES)}')
    return str(data["capability"])


def question_routes(tasks: TaskSet, llm: LLMClient | None) -> dict[str, str] | None:
    """The question-only router's choice per question; None without an LLM."""
    if llm is None or not llm.available("annotator"):
        return None
    definitions = "\n".join(f"- {c}: {d}" for c, d in DEFINITIONS.items())
    return {
        q.id: llm.complete_json(
            "annotator", "route", PROMPT.format(definitions=definitions, question=q.question),
            SCHEMA, _capability, max_tokens=20,
        )
        for q in tasks.questions
    }  # fmt: skip


def compare(
    integrated: CandidateMeta, kept: Archive, valid: TaskSet, llm: LLMClient | None
) -> dict[str, Any]:
    """The integrated program's valid fitness beside both routers' (over the same questions)."""
    scored = integrated.scores[VALID].questions
    oracle = {q.id: q.capability for q in valid.questions if q.id in scored}
    asked = question_routes(valid, llm)
    question = None if asked is None else {q: c for q, c in asked.items() if q in scored}
    own = sum(scored.values()) / len(scored) if scored else fitness(None)
    result: dict[str, Any] = {
        "integrated": own,
        "oracle_router": routed_fitness(oracle, kept),
        "question_router": None if question is None else routed_fitness(question, kept),
        "question_router_note": None if question is not None else "no model: not available",
    }
    baselines = [v for v in (result["oracle_router"], result["question_router"]) if v is not None]
    result["beats_routing"] = bool(baselines) and all(own > b for b in baselines)
    return result
