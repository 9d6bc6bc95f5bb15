"""The archive: paired bootstrap acceptance; best overall and specialists replayed in order."""

from __future__ import annotations

from typing import Any

from evolve.evolution.archive import archive, fitness, improves, question_fitness
from evolve.evolution.store import CandidateMeta
from evolve.trace import QuestionTrace

CAPS = {f"q{i}": "FT"[i % 2] for i in range(24)}  # 12 F questions, 12 T questions


def candidate(number: int, per_question: dict[str, float]) -> CandidateMeta:
    def block(ids: list[str]) -> dict[str, Any]:
        mean = sum(per_question[q] for q in ids) / len(ids)
        return {"evidence_similarity": mean, "evidence_hit_rate": mean, "n": len(ids)}

    by_cap = {c: block([q for q in per_question if CAPS[q] == c]) for c in "FT"}
    valid = {"overall": block(list(per_question)), "by_capability": by_cap,
             "questions": per_question, "question_capabilities": CAPS}  # fmt: skip
    return CandidateMeta(
        id=f"c{number:04d}-{number:08x}", number=number, parents=[], stage="seed",
        capability=None, message="m", source_sha256="0" * 64, status="evaluated",
        sandbox=None, scores={"valid": valid}, usage={}, seconds=0.0, created=0.0,
    )  # fmt: skip


BASE = {q: 0.5 for q in CAPS}


def test_paired_bootstrap_accepts_consistent_gains_only():
    assert improves({q: v + 0.05 for q, v in BASE.items()}, BASE)
    noisy = {q: v + (0.2 if i % 2 else -0.19) for i, (q, v) in enumerate(BASE.items())}
    assert fitness({"evidence_similarity": 0.5, "evidence_hit_rate": 0.5}) == 0.5
    assert sum(noisy.values()) > sum(BASE.values())  # a higher mean ...
    assert not improves(noisy, BASE)  # ... that is noise
    assert not improves(BASE, BASE) and not improves({"x": 1.0}, BASE)
    assert improves(noisy, BASE, "s") == improves(noisy, BASE, "s")  # seeded


def test_archive_keeps_specialists_on_their_capability_even_when_overall_drops():
    seed = candidate(0, BASE)
    t_better = {q: (v + 0.1 if CAPS[q] == "T" else v - 0.15) for q, v in BASE.items()}
    all_better = {q: v + 0.05 for q, v in BASE.items()}
    kept = archive([seed, candidate(1, t_better), candidate(2, all_better)])
    assert kept.best is not None and kept.best.number == 2
    assert kept.specialists["T"].number == 1  # 0.6 on T beats 0.55
    assert kept.specialists["F"].number == 2
    raw = archive([seed, candidate(1, {q: v + 0.001 for q, v in BASE.items()})], paired=False)
    assert raw.best is not None and raw.best.number == 1  # any higher mean, without the test


def test_question_fitness_skips_questions_without_evidence():
    traces = [
        QuestionTrace(id="a", conversation_id="c",
                      scores={"evidence_similarity": 0.8, "evidence_hit_rate": 0.5}),
        QuestionTrace(id="b", conversation_id="c",
                      scores={"evidence_similarity": None, "evidence_hit_rate": None}),
    ]  # fmt: skip
    assert question_fitness(traces) == {"a": 0.65}  # fmt: skip
