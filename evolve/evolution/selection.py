"""Which capability a refinement round targets (docs/design.md §4, stage 2).

Owns the :class:`Selection` protocol (what ``RunConfig.selection`` / ``--selection`` names) and
its two strategies, :class:`DependencyAware` (``dependency``, the default) and
:class:`RoundRobin` (``round-robin``, an ablation), with what they rank by:
:func:`capability_fitness`, :func:`train_by_capability`, :func:`ranking`,
:func:`dependency_aware`, :func:`round_robin` and :func:`spread` (K children of one round over
the ranked capabilities). All are deterministic functions of their inputs, so a replayed round
gets the targets the interrupted one got; a strategy object holds no state.

- **Capability fitness** on train groups the parent's per-question train fitness by each task's
  *primary* label (annotated, or native without an annotator). A task with no label (a user's
  question with no capability and no annotator) counts in no capability, so no target is ever
  chosen for it; where no train task has a label, a refinement has no target (the loop's rule).
- **Dependency-aware**: weak capabilities, and ones that many tasks need as a *secondary*
  capability, go first: priority(c) = (1 − fitness(c)) × (1 + share of train tasks listing c as
  secondary). A capability is *stalled* when the last refinement round (its K latest refinement
  candidates) worked on it without any child raising its own train fitness; it drops behind
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
from typing import Protocol

from evolve.datasets.types import CAPABILITIES
from evolve.evaluation.report import ScoreBlock
from evolve.evolution.annotate import Labels
from evolve.evolution.archive import fitness
from evolve.evolution.candidate import TRAIN, CandidateMeta


class Selection(Protocol):
    """How a refinement round picks the capability each of its children works on
    (``RunConfig.selection`` names one, by its ``name``)."""

    name: str

    def targets(
        self,
        parent: CandidateMeta,
        candidates: list[CandidateMeta],
        labels: dict[str, Labels],
        refinements_done: int,
        k: int,
    ) -> list[str]:
        """The target of each of the round's ``k`` children (the round's parent ``parent``,
        the run's ``candidates`` so far, the train and valid ``labels``; ``refinements_done``:
        refinement rounds before this one)."""
        ...


class DependencyAware:
    """The default: :func:`spread` over the :func:`ranking` of the parent's train fitness per
    capability, stalled capabilities last (see the module docstring)."""

    name = "dependency"

    def targets(
        self,
        parent: CandidateMeta,
        candidates: list[CandidateMeta],
        labels: dict[str, Labels],
        refinements_done: int,
        k: int,
    ) -> list[str]:
        stalled = _stalled(candidates, labels, k)
        per_question = parent.scores[TRAIN].questions
        if not per_question:  # evaluated before per-question scores were kept
            by_cap = train_by_capability(parent, labels)
            ranked = sorted(by_cap, key=lambda cap: (cap in stalled, by_cap[cap], cap))
            return spread(ranked, k)
        return spread(ranking(per_question, labels, stalled), k)


class RoundRobin:
    """An ablation: the next ``k`` capabilities of F, T, P, M, A in turn, whatever the
    scores."""

    name = "round-robin"

    def targets(
        self,
        parent: CandidateMeta,
        candidates: list[CandidateMeta],
        labels: dict[str, Labels],
        refinements_done: int,
        k: int,
    ) -> list[str]:
        return [round_robin(refinements_done * k + i) for i in range(k)]


def capability_fitness(
    per_question: dict[str, float], labels: dict[str, Labels]
) -> dict[str, float]:
    """Mean per-question fitness grouped by primary label (capabilities without tasks left out,
    and unlabelled tasks)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for qid, value in per_question.items():
        if qid in labels and labels[qid].primary in CAPABILITIES:
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


def train_by_capability(c: CandidateMeta, labels: dict[str, Labels]) -> dict[str, float]:
    """A candidate's train fitness per capability (by primary label where it kept per-question
    fitness, else its stored rows; never the ``unlabelled`` row)."""
    train = c.scores.get(TRAIN, ScoreBlock())
    if train.questions:
        return capability_fitness(train.questions, labels)
    return {cap: fitness(row) for cap, row in train.by_capability.items() if cap in CAPABILITIES}


def _stalled(candidates: list[CandidateMeta], labels: dict[str, Labels], k: int) -> set[str]:
    """Capabilities the last refinement round (its ``k`` latest refinement candidates) worked
    on without raising them: no child of that capability was evaluated with a gain for it."""
    by_id = {c.id: c for c in candidates}
    last = [c for c in candidates if c.stage == "refinement" and c.capability is not None][-k:]
    tried, gained = set(), set()
    for c in last:
        assert c.capability is not None
        tried.add(c.capability)
        before = by_id.get(c.parents[0]) if c.parents else None
        if c.status == "evaluated" and before is not None:
            old = train_by_capability(before, labels).get(c.capability, 0.0)
            if train_by_capability(c, labels).get(c.capability, 0.0) > old:
                gained.add(c.capability)
    return tried - gained
