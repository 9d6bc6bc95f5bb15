"""The archive: which candidates are kept — the best overall and the specialist per capability.

Owns :func:`fitness`, :func:`question_fitness`, :func:`improves` (the paired bootstrap test),
:class:`Archive` and :func:`archive`.

- **Fitness** of a score block (overall, one capability, or one question) is the value of the
  run's fitness mode (:mod:`evolve.scoring.fitness`: ``judged`` with a task model and a judge,
  ``answer-f1`` with a task model alone, ``retrieval`` offline), written by the executor; old
  blocks without it read as ``retrieval`` (mean of evidence similarity and hit rate). Under
  ``judged`` every question counts, abstention included.
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
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evolve.datasets.types import CAPABILITIES
from evolve.evolution.store import CandidateMeta
from evolve.scoring.fitness import KEY as FITNESS_KEY
from evolve.scoring.fitness import Fitness, retrieval_fitness
from evolve.trace import QuestionTrace

CONFIDENCE = 0.9  # share of bootstrap means that must lie above zero
RESAMPLES = 2000
RETRIEVAL = Fitness("retrieval", "")  # how traces from before modes were recorded read


def fitness(block: dict[str, Any] | None) -> float:
    """The selection fitness of a score block (overall, one capability, or one question's
    scores): the value of its run's mode (:mod:`evolve.scoring.fitness`, key ``fitness``);
    a block from before modes were recorded reads as ``retrieval``. 0 when missing or empty."""
    if block and FITNESS_KEY in block:
        value = block[FITNESS_KEY]
        return float(value) if isinstance(value, int | float) else 0.0
    return retrieval_fitness(block)


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


def improves(new: dict[str, float], old: dict[str, float], seed: str = "") -> bool:
    """Whether ``new`` beats ``old`` on their shared questions by the paired bootstrap."""
    shared = sorted(new.keys() & old.keys())
    if not shared:
        return False
    diffs = np.array([new[q] - old[q] for q in shared])
    if not diffs.any():
        return False
    rng = np.random.default_rng(int(hashlib.sha256(seed.encode()).hexdigest()[:16], 16))
    means = diffs[rng.integers(0, len(diffs), size=(RESAMPLES, len(diffs)))].mean(axis=1)
    return float((means > 0).mean()) >= CONFIDENCE


def _questions(c: CandidateMeta, capability: str | None) -> dict[str, float]:
    per = c.scores["valid"].get("questions") or {}
    caps = c.scores["valid"].get("question_capabilities") or {}
    return {q: v for q, v in per.items() if capability is None or caps.get(q) == capability}


def _beats(new: CandidateMeta, old: CandidateMeta, capability: str | None) -> bool:
    a, b = _questions(new, capability), _questions(old, capability)
    if a and b:
        return improves(a, b, f"{new.source_sha256}|{old.source_sha256}|{capability}")
    if capability is None:  # no per-question scores stored: the mean decides
        return fitness(new.scores["valid"]["overall"]) > fitness(old.scores["valid"]["overall"])
    by_new = new.scores["valid"]["by_capability"].get(capability)
    by_old = old.scores["valid"]["by_capability"].get(capability)
    return fitness(by_new) > fitness(by_old)


@dataclass
class Archive:
    """The kept candidates: the best overall and one specialist per capability."""

    best: CandidateMeta | None = None
    specialists: dict[str, CandidateMeta] = field(default_factory=dict)


def archive(candidates: list[CandidateMeta], paired: bool = True) -> Archive:
    """Replay ``candidates`` (creation order) into an archive. ``paired=False`` accepts any
    higher mean instead (the raw-difference rule, for comparison)."""
    kept = Archive()
    for c in candidates:
        if c.status != "evaluated":
            continue
        if kept.best is None or _accept(c, kept.best, None, paired):
            kept.best = c
        for cap in CAPABILITIES:
            if cap not in c.scores["valid"]["by_capability"]:
                continue
            holder = kept.specialists.get(cap)
            if holder is None or _accept(c, holder, cap, paired):
                kept.specialists[cap] = c
    return kept


def _accept(new: CandidateMeta, old: CandidateMeta, capability: str | None, paired: bool) -> bool:
    if paired:
        return _beats(new, old, capability)
    block = (lambda c: c.scores["valid"]["overall"]) if capability is None else (
        lambda c: c.scores["valid"]["by_capability"].get(capability))  # fmt: skip
    return fitness(block(new)) > fitness(block(old))
