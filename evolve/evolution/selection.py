"""Which capability a refinement round targets (docs/design.md §4, stage 2).

Owns :func:`capability_fitness`, :func:`ranking` and :func:`dependency_aware` (the default),
:func:`round_robin` (an ablation) and :func:`spread` (K children of one round over the ranked
capabilities). All are deterministic functions of their inputs.

- **Capability fitness** on train groups the parent's per-question train fitness by each task's
  *primary* label (annotated, or native without an annotator).
- **Dependency-aware**: weak capabilities, and ones that many tasks need as a *secondary*
  capability, go first: priority(c) = (1 − fitness(c)) × (1 + share of train tasks listing c as
  secondary). A capability refined in the previous round without any gain for it drops behind
  the others for one round, so the loop does not keep hammering a capability it cannot move.
  Ties go to the order F, T, P, M, A.
- **Spread** of K children: the first capability of the ranking gets ceil(K/2) children, the
  next ceil(rest/2), and so on (K=1: the top one; 2: one each to the top two; 4: 2, 1, 1;
  5: 3, 1, 1): the weakest always gets most, and the next ones still get tried.
- **Round-robin**: F, T, P, M, A in turn, whatever the scores.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

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


def ranking(
    per_question: dict[str, float], labels: dict[str, Labels], stalled: Collection[str] = ()
) -> list[str]:
    """The capabilities with train tasks, the one to refine first first; ``stalled`` = those
    refined last round with no gain for them (they go last)."""
    fit = capability_fitness(per_question, labels)
    if not fit:
        return [CAPABILITIES[0]]
    secondary = {c: sum(1 for lab in labels.values() if c in lab.secondary) for c in CAPABILITIES}
    total = max(1, len(labels))

    def priority(c: str) -> tuple[bool, float, int]:
        value = (1 - fit[c]) * (1 + secondary[c] / total)
        return (c not in stalled, value, -CAPABILITIES.index(c))

    return sorted(fit, key=priority, reverse=True)


def dependency_aware(
    per_question: dict[str, float], labels: dict[str, Labels], stalled: str | None = None
) -> str:
    """The capability to refine next; ``stalled`` = refined last round with no gain for it."""
    return ranking(per_question, labels, () if stalled is None else (stalled,))[0]


def spread(ranked: list[str], k: int) -> list[str]:
    """``k`` targets over ``ranked`` (first = weakest): halving shares, see the module doc."""
    out: list[str] = []
    for i, cap in enumerate(ranked):
        left = k - len(out)
        out += [cap] * (left if i == len(ranked) - 1 else -(-left // 2))
    return out


def round_robin(refinements_done: int) -> str:
    return CAPABILITIES[refinements_done % len(CAPABILITIES)]
