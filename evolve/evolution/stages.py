"""What each stage looks at before it asks for a child (docs/design.md §4): history, partners.

Owns :func:`history`, :func:`partners` and :func:`common_ancestor`. All are pure functions of
the store's candidates and the task labels, so a replayed round sees exactly what the
interrupted one saw.

- **Cold start** has no target; the proposer sees the parent's worst train cases overall.
- **Refinement** targets one capability per child, chosen by the run's
  :class:`~evolve.evolution.selection.Selection` (dependency-aware by default, round-robin as
  an ablation). Its history is every earlier revision that targeted the capability, and the
  run's latest revisions: what changed and what it did to each capability (train fitness
  deltas against its parent; the proposer never sees valid numbers).
- **Integration** merges the best program with one specialist per child, rotating through the
  specialists (in capability order; child i of round r takes rotation r·K + i); the proposer
  also gets their latest common ancestor, so a coder can read each side's change against it.
- **Holistic** runs (an ablation) have no capabilities: no targets, no specialists.
"""

from __future__ import annotations

from dataclasses import replace

from evolve.evolution.annotate import Labels
from evolve.evolution.archive import fitness
from evolve.evolution.candidate import TRAIN, CandidateMeta
from evolve.evolution.proposer import Revision
from evolve.evolution.selection import train_by_capability

HISTORY = 8  # revisions shown to the proposer
RECENT = 3  # the run's latest revisions are shown whatever their target


def history(
    candidates: list[CandidateMeta], labels: dict[str, Labels], target: str | None
) -> tuple[Revision, ...]:
    """Earlier revisions of ``target`` (all when None) and the run's latest ones, newest last,
    with their effects."""
    by_id = {c.id: c for c in candidates}
    latest = {c.id for c in candidates[1:][-RECENT:]}
    pool = [c for c in candidates[1:] if target in (None, c.capability) or c.id in latest]
    out = []
    for c in pool[-HISTORY:]:
        before = by_id.get(c.parents[0]) if c.parents else None
        entry = Revision(c.id, c.stage, c.capability, c.message, c.status)
        if c.status == "evaluated" and before is not None and before.status == "evaluated":
            delta = fitness(c.scores[TRAIN].overall) - fitness(before.scores[TRAIN].overall)
            mine, theirs = train_by_capability(c, labels), train_by_capability(before, labels)
            effects = {cap: round(mine[cap] - theirs[cap], 4) for cap in mine if cap in theirs}
            entry = replace(entry, train_delta=delta, by_capability=effects)
        out.append(entry)
    return tuple(out)


def partners(
    parent: CandidateMeta, kept: dict[str, CandidateMeta], round_no: int
) -> list[CandidateMeta]:
    """The specialists other than the parent (each once), rotated so that this round's
    partner comes first."""
    unique = list({c.id: c for c in kept.values() if c.id != parent.id}.values())
    if not unique:
        return []
    k = round_no % len(unique)
    return unique[k:] + unique[:k]


def common_ancestor(
    candidates: list[CandidateMeta], a: CandidateMeta, b: CandidateMeta
) -> CandidateMeta | None:
    """The most recent candidate that is an ancestor of (or equal to) both."""
    by_id = {c.id: c for c in candidates}

    def lineage(c: CandidateMeta) -> set[str]:
        seen, todo = set(), [c.id]
        while todo:
            cid = todo.pop()
            if cid in seen or cid not in by_id:
                continue
            seen.add(cid)
            todo.extend(by_id[cid].parents)
        return seen

    shared = lineage(a) & lineage(b)
    return max((by_id[i] for i in shared), key=lambda c: c.number, default=None)
