"""The archive: paired bootstrap acceptance; best overall and specialists replayed in order."""

from __future__ import annotations

from typing import Any

from evolve.evaluation.report import MetricRow
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


def shifted(diffs: list[float], base: dict[str, float] = BASE) -> dict[str, float]:
    """``base`` plus one difference per question, in question order."""
    assert len(diffs) == len(base)
    return {q: v + d for (q, v), d in zip(base.items(), diffs, strict=True)}


# Two-valued differences: the bootstrap mean is above zero exactly when fewer than 8 of its
# 24 draws are negative, so its confidence is a binomial tail (no number copied from a run).
SURE = [0.1] * 20 + [-0.2] * 4  # P(Bin(24, 4/24) < 8) = 0.96: accepted
UNSURE = [0.1] * 18 + [-0.2] * 6  # P(Bin(24, 6/24) < 8) = 0.75: a higher mean, refused
BORDER = [0.1] * 19 + [-0.2] * 5  # P(Bin(24, 5/24) < 8) = 0.89: the seed decides
# One question carries the whole gain: the mean rises, but only the resamples that draw it
# (1 - (23/24)^24 = 64 %) come out above zero.
OUTLIER = [-0.02] * 23 + [0.6]


def test_paired_bootstrap_accepts_consistent_gains_only():
    assert fitness(MetricRow(evidence_similarity=0.5, evidence_hit_rate=0.5)) == 0.5
    assert improves({q: v + 0.05 for q, v in BASE.items()}, BASE)
    assert improves(shifted(SURE), BASE)
    for diffs in (UNSURE, OUTLIER):
        assert sum(diffs) > 0  # a higher mean ...
        assert not improves(shifted(diffs), BASE)  # ... that is noise
    assert not improves(BASE, BASE) and not improves({"x": 1.0}, BASE)


def test_paired_bootstrap_pairs_questions_and_ignores_unshared_ones():
    """A consistent gain on every shared question is accepted even when the challenger's
    mean is lower: the holder's extra (easy) questions and the spread between questions are
    not differences between the two programs."""
    spread = {q: 0.05 + 0.9 * i / 23 for i, q in enumerate(BASE)}
    better = {q: v + 0.01 for q, v in spread.items()}
    holder = {**spread, **{f"extra{i}": 1.0 for i in range(24)}}
    assert sum(better.values()) / len(better) < sum(holder.values()) / len(holder)
    assert improves(better, holder)
    worse = {q: v - 0.01 for q, v in spread.items()}
    assert not improves(worse, {q: v for q, v in holder.items() if q in spread})


def test_paired_bootstrap_is_seeded_by_its_seed_string():
    """A borderline challenger: each seed gives one verdict every time, and the seed matters."""
    border = shifted(BORDER)
    verdicts = {}
    for s in range(30):
        repeated = {improves(border, BASE, str(s)) for _ in range(3)}
        assert len(repeated) == 1
        verdicts[s] = repeated.pop()
    assert set(verdicts.values()) == {True, False}


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


def test_archive_refuses_a_higher_mean_the_paired_test_calls_noise():
    seed = candidate(0, BASE)
    lucky = candidate(1, shifted(OUTLIER))  # the outlier question is a T question
    kept = archive([seed, lucky])
    assert kept.best is not None and kept.best.number == 0
    assert {c.number for c in kept.specialists.values()} == {0}
    raw = archive([seed, lucky], paired=False)
    assert raw.best is not None and raw.best.number == 1 and raw.specialists["T"].number == 1


def test_question_fitness_skips_questions_without_evidence():
    traces = [
        QuestionTrace(id="a", conversation_id="c",
                      scores={"evidence_similarity": 0.8, "evidence_hit_rate": 0.5}),
        QuestionTrace(id="b", conversation_id="c",
                      scores={"evidence_similarity": None, "evidence_hit_rate": None}),
    ]  # fmt: skip
    assert question_fitness(traces) == {"a": 0.65}  # fmt: skip
