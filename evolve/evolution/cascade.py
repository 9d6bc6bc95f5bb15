"""Evaluating a round's children: concurrently, through the evaluation cascade (docs/design.md §4).

Owns the cascade's rules: the round's train minibatch (:func:`minibatch`), the verdict on a
child (:func:`verdict`) and what the cascade saved in a run (:func:`saved_seconds`). The
evaluations themselves are :class:`evolve.evolution.evaluator.Evaluator`'s. This module imports
no part of the engine (``evolve status`` reads :func:`saved_seconds`).

- **Minibatch**: the ``RunConfig.minibatch`` train conversations where the parent's mean
  per-question train fitness is lowest (ties by conversation id): fixed per round (a round's
  children share their parent) and deterministic.
- **Verdict**: the child stops when the archive's paired bootstrap
  (:func:`~evolve.evolution.archive.improves`, the one implementation) says the parent beats it
  on the minibatch questions both were scored on; otherwise it is promoted to full train + valid.
- **Saved seconds**: a stopped child records ``saved_seconds`` in its ``cascade`` record: its
  minibatch seconds scaled by the question count to full train + valid, minus what it spent;
  :func:`saved_seconds` sums a run's.
"""

from __future__ import annotations

from evolve.datasets.types import TaskSet
from evolve.evolution.archive import CONFIDENCE, improves
from evolve.evolution.candidate import TRAIN, CandidateMeta


def minibatch(parent: CandidateMeta, train: TaskSet, n: int) -> TaskSet:
    """The ``n`` train conversations (with questions) where ``parent`` fails most."""
    block = parent.scores.get(TRAIN)
    per = block.questions if block is not None else {}
    by_conv = train.by_conversation()

    def failing(conv_id: str) -> tuple[float, str]:
        values = [per[q.id] for q in by_conv[conv_id] if q.id in per]
        return (sum(values) / len(values) if values else 1.0, conv_id)

    chosen = set(sorted((c for c in by_conv if by_conv[c]), key=failing)[:n])
    return TaskSet(train.bench, train.split,
                   tuple(c for c in train.conversations if c.id in chosen),
                   tuple(q for q in train.questions if q.conversation_id in chosen))  # fmt: skip


def verdict(
    child: dict[str, float], parent: dict[str, float], seed: str
) -> tuple[str | None, float, float]:
    """Why the child stops (None: promoted), and the child's and parent's mean fitness on the
    questions both were scored on (the paired test reads those only)."""
    shared = sorted(child.keys() & parent.keys())
    mine = sum(child[q] for q in shared) / max(1, len(shared))
    theirs = sum(parent[q] for q in shared) / max(1, len(shared))
    if not improves(parent, child, seed):
        return None, mine, theirs
    return (f"worse than its parent on the train minibatch ({len(shared)} questions: fitness "
            f"{mine:.4f} vs {theirs:.4f}; paired bootstrap, confidence {CONFIDENCE})",
            mine, theirs)  # fmt: skip


def saved_seconds(candidates: list[CandidateMeta]) -> float:
    """Evaluation seconds the cascade saved in a run (estimated per stopped child)."""
    return round(sum(float((c.cascade or {}).get("saved_seconds", 0.0)) for c in candidates), 3)
