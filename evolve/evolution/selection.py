"""Which capability a refinement round targets (docs/design.md §4, stage 2).

Owns :func:`capability_fitness`, :func:`dependency_aware` (the default) and
:func:`round_robin` (an ablation). Both are deterministic functions of their inputs.

- **Capability fitness** on train groups the parent's per-question train fitness by each task's
  *primary* label (annotated, or native without an annotator).
- **Dependency-aware**: weak capabilities, and ones that many tasks need as a *secondary*
  capability, go first: priority(c) = (1 − fitness(c)) × (1 + share of train tasks listing c as
  secondary). A capability refined in the previous round without any gain for it drops behind
  the others for one round, so the loop does not keep hammering a capability it cannot move.
  Ties go to the order F, T, P, M, A.
- **Round-robin**: F, T, P, M, A in turn, whatever the scores.
"""

from __future__ import annotations

from collections import defaultdict

from evolve.datasets.types import CAPABILITIES
from evolve.evolution.annotate import Labels


def capability_fitness(
    per_question: dict[str, float], labels: dict[str, Labels]
) -> dict[str, float]:
    """Mean per-question fitness grouped by primary label (capabilities without tasks left out)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for qid, value in per_question.items():
        if qid in labels:
            groups[labels[qid].primary].append(value)
    return {c: sum(v) / len(v) for c, v in groups.items() if v}


def dependency_aware(
    per_question: dict[str, float], labels: dict[str, Labels], stalled: str | None = None
) -> str:
    """The capability to refine next; ``stalled`` = refined last round with no gain for it."""
    fit = capability_fitness(per_question, labels)
    if not fit:
        return CAPABILITIES[0]
    secondary = {c: sum(1 for lab in labels.values() if c in lab.secondary) for c in CAPABILITIES}
    total = max(1, len(labels))

    def priority(c: str) -> tuple[bool, float, int]:
        value = (1 - fit[c]) * (1 + secondary[c] / total)
        return (c != stalled, value, -CAPABILITIES.index(c))

    return max(fit, key=priority)


def round_robin(refinements_done: int) -> str:
    return CAPABILITIES[refinements_done % len(CAPABILITIES)]
