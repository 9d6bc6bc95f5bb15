"""What each stage looks at before it asks for a child (docs/design.md §4): targets, history,
partners.

Owns :func:`refinement_targets`, :func:`history`, :func:`partners` and :func:`common_ancestor`.
All are pure functions of the store's candidates and the task labels, so a replayed round sees
exactly what the interrupted one saw.

- **Cold start** has no target; the proposer sees the parent's worst train cases overall.
- **Refinement** targets one capability (:mod:`evolve.evolution.selection`: dependency-aware by
  default, round-robin as an ablation); a round's K children are spread over the ranking, the
  weakest getting most. A capability that the last refinement round worked on (its K latest
  refinement candidates) without any child raising its own train fitness is *stalled* and waits
  one round. Its history is every earlier revision that
  targeted the capability, and the run's latest revisions: what changed and what it did to each
  capability (train fitness deltas against its parent; the proposer never sees valid numbers).
- **Integration** merges the best program with one specialist per child, rotating through the
  specialists (in capability order; child i of round r takes rotation r·K + i); the proposer
  also gets their latest common ancestor, so a coder can read each side's change against it.
- **Holistic** runs (an ablation) have no capabilities: no targets, no specialists.
"""

from __future__ import annotations

from typing import Any

from evolve.evolution.annotate import Labels
from evolve.evolution.archive import fitness
from evolve.evolution.selection import capability_fitness, ranking, round_robin, spread
from evolve.evolution.store import CandidateMeta

HISTORY = 8  # revisions shown to the proposer
RECENT = 3  # the run's latest revisions are shown whatever their target


def _train_by_capability(c: CandidateMeta, labels: dict[str, Labels]) -> dict[str, float]:
    per_question = c.scores.get("train", {}).get("questions")
    if per_question:
        return capability_fitness(per_question, labels)
    blocks = c.scores.get("train", {}).get("by_capability", {})
    return {cap: fitness(b) for cap, b in blocks.items()}


def refinement_targets(
    parent: CandidateMeta,
    candidates: list[CandidateMeta],
    labels: dict[str, Labels],
    selection: str,
    refinements_done: int,
    k: int = 1,
) -> list[str]:
    """The capability each of this refinement round's ``k`` children works on
    (:func:`~evolve.evolution.selection.spread` over the ranking; round-robin: the next ``k``)."""
    if selection == "round-robin":
        return [round_robin(refinements_done * k + i) for i in range(k)]
    stalled = _stalled(candidates, labels, k)
    per_question = parent.scores["train"].get("questions")
    if not per_question:  # evaluated before per-question scores were kept
        by_cap = _train_by_capability(parent, labels)
        ranked = sorted(by_cap, key=lambda cap: (cap in stalled, by_cap[cap], cap))
        return spread(ranked, k)
    return spread(ranking(per_question, labels, stalled), k)


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
            old = _train_by_capability(before, labels).get(c.capability, 0.0)
            if _train_by_capability(c, labels).get(c.capability, 0.0) > old:
                gained.add(c.capability)
    return tried - gained


def history(
    candidates: list[CandidateMeta], labels: dict[str, Labels], target: str | None
) -> tuple[dict[str, Any], ...]:
    """Earlier revisions of ``target`` (all when None) and the run's latest ones, newest last,
    with their effects."""
    by_id = {c.id: c for c in candidates}
    latest = {c.id for c in candidates[1:][-RECENT:]}
    pool = [c for c in candidates[1:] if target in (None, c.capability) or c.id in latest]
    out = []
    for c in pool[-HISTORY:]:
        before = by_id.get(c.parents[0]) if c.parents else None
        entry: dict[str, Any] = {
            "id": c.id, "stage": c.stage, "capability": c.capability, "message": c.message,
            "status": c.status, "train_delta": None, "by_capability": {},
        }  # fmt: skip
        if c.status == "evaluated" and before is not None and before.status == "evaluated":
            entry["train_delta"] = fitness(c.scores["train"]["overall"]) - fitness(
                before.scores["train"]["overall"]
            )
            mine, theirs = _train_by_capability(c, labels), _train_by_capability(before, labels)
            entry["by_capability"] = {
                cap: round(mine[cap] - theirs[cap], 4) for cap in mine if cap in theirs
            }
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
