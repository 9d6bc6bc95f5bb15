"""The loop's cursor in ``state.json``: what a valid one holds, and how its round counters are
rebuilt from the event log when it is damaged.

Owns :func:`state_problem` and :func:`finished_rounds`; :class:`evolve.evolution.store.RunStore`
reads and writes the file and calls these.

Invariants:

- A cursor is a JSON object whose ``rounds`` maps stage names to counts, ``best`` is a
  candidate id or null and ``round_costs`` is a list of objects of numbers; every field may be
  absent (a run before its first round). Anything else is damaged, with one reason.
- Rounds run one after another, each logging ``proposed`` or ``proposal_failed`` per child
  with the run-wide round number: every round before the last one logged is finished, and the
  last one only when all its children logged and every child it proposed is judged. Events
  that do not carry a round, a stage and a child index are ignored.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def _count(value: Any) -> bool:
    """Whether ``value`` is a count: an int (not a bool) >= 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def state_problem(state: Any) -> str | None:
    """Why a loaded ``state.json`` is not the loop's cursor (None when it is)."""
    if not isinstance(state, dict):
        return "not a JSON object"
    rounds = state.get("rounds", {})
    if not isinstance(rounds, dict) or not all(
        isinstance(k, str) and _count(v) for k, v in rounds.items()
    ):
        return f"rounds is not a map of stages to counts: {json.dumps(rounds)[:80]}"
    best = state.get("best")
    if best is not None and not isinstance(best, str):
        return f"best is not a candidate id: {json.dumps(best)[:80]}"
    costs = state.get("round_costs", [])
    if not isinstance(costs, list) or not all(
        isinstance(c, dict) and all(_number(v) for v in c.values()) for c in costs
    ):
        return f"round_costs is not a list of costs: {json.dumps(costs)[:80]}"
    return None


def finished_rounds(
    events: list[dict[str, Any]], status: dict[str, str], children: int | None = None
) -> dict[str, int]:
    """Rounds finished per stage, from the ``proposed`` and ``proposal_failed`` ``events`` and
    each candidate's ``status``; ``children``: the run's children per round (None: as many as
    any round logged)."""
    stage_of: dict[int, str] = {}
    seen: dict[int, set[int]] = {}
    members: dict[int, set[str]] = {}
    for event in events:
        data = event["data"]
        r, stage, child = data.get("round"), data.get("stage"), data.get("child")
        if not (_count(r) and isinstance(stage, str) and _count(child)):
            continue
        stage_of[r] = stage
        seen.setdefault(r, set()).add(child)
        if event["kind"] == "proposed" and isinstance(data.get("candidate"), str):
            members.setdefault(r, set()).add(data["candidate"])
    if not stage_of:
        return {}
    last = max(stage_of)
    k = children or max(max(c) + 1 for c in seen.values())
    done = [r for r in stage_of if r < last]
    if seen[last] >= set(range(k)) and all(
        status.get(c, "proposed") != "proposed" for c in members.get(last, set())
    ):
        done.append(last)
    return dict(Counter(stage_of[r] for r in sorted(done)))
