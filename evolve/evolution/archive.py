"""The archive: which candidates are kept — the best overall and the specialist per capability.

Owns :func:`fitness`, :func:`score_fitness`, :func:`question_fitness`, :func:`improves` (the
paired bootstrap test), :class:`Archive` and :func:`archive`.

- **Fitness** of a score row (overall or one capability: :func:`fitness`) or of one question's
  scores (:func:`score_fitness`) is the value of the run's fitness mode
  (:mod:`evolve.scoring.fitness`: ``judged`` with a task model and a judge, ``answer-f1`` with
  a task model alone, ``retrieval`` offline), written by the executor; old rows without it
  read as ``retrieval`` (mean of evidence similarity and hit rate). Under ``judged`` every
  question counts, abstention included.
- **Acceptance is a paired test, not a raw difference** (docs/design.md §4, capability-level
  evaluation): a challenger replaces the holder only when, over the valid questions both were
  scored on (of the capability in question, or all of them for the best overall), the
  bootstrap of the mean per-question difference puts at least :data:`CONFIDENCE` of its mass
  above zero. Noise on 20-odd questions is not promoted.
- The archive is **derived from the store**, never kept separately: candidates are replayed in
  creation order, each challenging the current holders. So it cannot drift from the store, and
  the same candidates always give the same archive (the bootstrap is seeded by the two sources'
  hashes, not their ids: a run resumed after a crash may number its candidates differently).
- Candidates evaluated before per-question scores were stored fall back to comparing the mean.
- **Guard sets** (:mod:`evolve.benches.guards`; docs/design.md, "Guard sets"): the run's guards
  are the ``guard:*`` score blocks of its first evaluated candidate (the seed, scored on every
  guard once). A challenger that wins valid against a holder (the best, or a capability's
  specialist) replaces it only when, on every guard, it is **not worse** than that holder: the
  paired bootstrap of the mean per-question difference (challenger − holder) puts at least
  :data:`CONFIDENCE` of its mass above ``-margin`` (:data:`MARGIN`, 1 pp; :func:`non_inferior`).
  A specialist is compared on the guard's questions of its capability (all of them where the
  guard has none). A question the holder was scored on and the challenger was not counts 0 for
  the challenger. A challenger that wins valid but lacks guard figures is not promoted and is
  named :attr:`Archive.pending` (the first such, in creation order): the evaluator scores it on
  the guards and replays again. Every check made is in :attr:`Archive.checks`, so a candidate
  held back by a guard shows its figures and the reason. Guard scores reach nothing else here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evolve.benches.guards import KEY_PREFIX as GUARD_PREFIX
from evolve.datasets.types import CAPABILITIES
from evolve.evaluation.report import MetricRow
from evolve.evolution.candidate import VALID, CandidateMeta
from evolve.scoring.fitness import KEY as FITNESS_KEY
from evolve.scoring.fitness import Fitness, retrieval_fitness
from evolve.trace import QuestionTrace

CONFIDENCE = 0.9  # share of bootstrap means that must lie above zero (above -margin: guards)
MARGIN = 0.01  # how much worse than the holder a challenger may be on a guard (fitness, 1 pp)
RESAMPLES = 2000
RETRIEVAL = Fitness("retrieval")  # how traces from before modes were recorded read


def fitness(row: MetricRow | None) -> float:
    """The selection fitness of a score row (overall or one capability): the value of its
    run's mode; a row from before modes were recorded reads as ``retrieval``. 0 when missing
    or empty."""
    return score_fitness(None if row is None else row.as_scores())


def score_fitness(scores: dict[str, Any] | None) -> float:
    """The selection fitness of one question's scores, or a row's (:meth:`MetricRow.as_scores`):
    the value of the run's mode (:mod:`evolve.scoring.fitness`, key ``fitness``); scores from
    before modes were recorded read as ``retrieval``. 0 when missing or empty."""
    if scores and FITNESS_KEY in scores:
        value = scores[FITNESS_KEY]
        return float(value) if isinstance(value, int | float) else 0.0
    return retrieval_fitness(scores)


def question_fitness(traces: Iterable[QuestionTrace]) -> dict[str, float]:
    """Per-question fitness of scored traces. A question without a value under the mode (offline:
    one without any retrieval metric, such as BEAM's abstention questions) is left out."""
    out = {}
    for t in traces:
        value = t.scores.get(FITNESS_KEY) if FITNESS_KEY in t.scores else RETRIEVAL.question(
            t.scores)  # fmt: skip
        if isinstance(value, int | float):
            out[t.id] = float(value)
    return out


def _share_above(diffs: np.ndarray, floor: float, seed: str) -> float:
    """The share of bootstrap means of ``diffs`` that lie above ``floor`` (seeded by ``seed``)."""
    rng = np.random.default_rng(int(hashlib.sha256(seed.encode()).hexdigest()[:16], 16))
    means = diffs[rng.integers(0, len(diffs), size=(RESAMPLES, len(diffs)))].mean(axis=1)
    return float((means > floor).mean())


def improves(new: dict[str, float], old: dict[str, float], seed: str = "") -> bool:
    """Whether ``new`` beats ``old`` on their shared questions by the paired bootstrap."""
    shared = sorted(new.keys() & old.keys())
    if not shared:
        return False
    diffs = np.array([new[q] - old[q] for q in shared])
    if not diffs.any():
        return False
    return _share_above(diffs, 0.0, seed) >= CONFIDENCE


def non_inferior(
    new: dict[str, float], old: dict[str, float], margin: float = MARGIN, seed: str = ""
) -> bool:
    """Whether ``new`` is not worse than ``old`` by more than ``margin`` on ``old``'s questions
    (a question ``new`` lacks counts 0): the paired bootstrap puts at least
    :data:`CONFIDENCE` of the mean difference above ``-margin``. Nothing to compare: True."""
    if not old:
        return True
    diffs = np.array([new.get(q, 0.0) - old[q] for q in sorted(old)])
    return _share_above(diffs, -margin, seed) >= CONFIDENCE


def _beats(new: CandidateMeta, old: CandidateMeta, capability: str | None) -> bool:
    a, b = new.scores[VALID].questions_of(capability), old.scores[VALID].questions_of(capability)
    if a and b:
        return improves(a, b, f"{new.source_sha256}|{old.source_sha256}|{capability}")
    # no per-question scores stored: the mean decides
    return fitness(new.scores[VALID].row(capability)) > fitness(old.scores[VALID].row(capability))


@dataclass(frozen=True)
class GuardCheck:
    """One guard test of a challenger against the holder it would replace (``role``: ``best``
    or a capability), on ``questions`` of the guard; ``reason`` says why it failed."""

    candidate: str
    holder: str
    role: str
    guard: str  # the guard's name (its scores key without the prefix)
    questions: int
    fitness: float  # the challenger's mean on those questions
    holder_fitness: float
    passed: bool
    reason: str | None

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def guard_keys(candidates: list[CandidateMeta]) -> list[str]:
    """The run's guards: the ``guard:*`` score keys of its first evaluated candidate."""
    first = next((c for c in candidates if c.status == "evaluated"), None)
    return sorted(k for k in (first.scores if first else {}) if k.startswith(GUARD_PREFIX))


def _guard_questions(c: CandidateMeta, key: str, capability: str | None) -> dict[str, float]:
    block = c.scores.get(key)
    if block is None:
        return {}
    # a guard without the capability's questions: all of them
    return block.questions_of(capability) or dict(block.questions)


def guard_check(
    new: CandidateMeta, old: CandidateMeta, key: str, capability: str | None, margin: float
) -> GuardCheck:
    """The non-inferiority test of ``new`` against ``old`` on the guard ``key``."""
    theirs = _guard_questions(old, key, capability)
    mine = {q: v for q, v in _guard_questions(new, key, capability).items() if q in theirs}
    seed = f"{new.source_sha256}|{old.source_sha256}|{key}|{capability}"
    passed = non_inferior(mine, theirs, margin, seed)
    n = max(1, len(theirs))
    a, b = sum(mine.get(q, 0.0) for q in theirs) / n, sum(theirs.values()) / n
    role = "best" if capability is None else capability
    name = key.removeprefix(GUARD_PREFIX)
    reason = None if passed else (
        f"guard {name}: fitness {a:.4f} against {old.id}'s {b:.4f} on {len(theirs)} "
        f"{'' if capability is None else capability + ' '}questions, not shown within "
        f"{margin * 100:g} pp (paired bootstrap, confidence {CONFIDENCE})")  # fmt: skip
    return GuardCheck(new.id, old.id, role, name, len(theirs), round(a, 6), round(b, 6),
                      passed, reason)  # fmt: skip


@dataclass
class Archive:
    """The kept candidates: the best overall and one specialist per capability; ``checks``: the
    guard tests each challenger met (by candidate id); ``pending``: the first challenger that
    won valid but has no guard figures yet (None: none)."""

    best: CandidateMeta | None = None
    specialists: dict[str, CandidateMeta] = field(default_factory=dict)
    checks: dict[str, list[GuardCheck]] = field(default_factory=dict)
    pending: str | None = None

    def held_back(self, candidate_id: str) -> list[GuardCheck]:
        """The guard tests ``candidate_id`` failed (empty: none, or never tested)."""
        return [c for c in self.checks.get(candidate_id, []) if not c.passed]


def archive(
    candidates: list[CandidateMeta], paired: bool = True, margin: float = MARGIN
) -> Archive:
    """Replay ``candidates`` (creation order) into an archive. ``paired=False`` accepts any
    higher mean instead (the raw-difference rule, for comparison); guards apply either way."""
    kept = Archive()
    guards = guard_keys(candidates)
    for c in candidates:
        if c.status != "evaluated":
            continue
        wins: list[tuple[str | None, CandidateMeta | None]] = []
        if kept.best is None or _accept(c, kept.best, None, paired):
            wins.append((None, kept.best))
        for cap in CAPABILITIES:
            if cap not in c.scores[VALID].by_capability:
                continue
            holder = kept.specialists.get(cap)
            if holder is None or _accept(c, holder, cap, paired):
                wins.append((cap, holder))
        contested = [(role, h) for role, h in wins if h is not None] if guards else []
        if contested:
            if any(key not in c.scores for key in guards):
                if kept.pending is None:
                    kept.pending = c.id
                continue  # promoted only once its guard figures are in
            checks = [guard_check(c, h, key, role, margin) for role, h in contested
                      for key in guards if key in h.scores]  # fmt: skip
            kept.checks[c.id] = checks
            failed = {check.role for check in checks if not check.passed}
            wins = [(r, h) for r, h in wins if ("best" if r is None else r) not in failed]
        for role, _ in wins:
            if role is None:
                kept.best = c
            else:
                kept.specialists[role] = c
    return kept


def _accept(new: CandidateMeta, old: CandidateMeta, capability: str | None, paired: bool) -> bool:
    if paired:
        return _beats(new, old, capability)
    return fitness(new.scores[VALID].row(capability)) > fitness(old.scores[VALID].row(capability))
