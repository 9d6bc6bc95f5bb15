"""What a synth run kept and dropped, counted per check, per capability and per kind.

Owns :class:`Rejection` (a dropped question with its check and reason), :class:`Counts` (one
group's counts), :class:`RejectionTally` (the groups, by capability and by kind) and :func:`tally`
(counting them), :func:`table_rows` (the rejection table as printed), :func:`write_json` and
:func:`write_jsonl` (the workspace's JSON files, written atomically).

Invariants: in every group, ``written`` = the sum of the checks' rejections + ``kept``: each
written question is either kept or dropped by exactly one check (the first it fails). A
check's rate is its rejections over the group's ``written`` questions, so a row's rates and
the kept share sum to 1. The table shows the counts the report stores, never recomputed. A
group's JSON (:meth:`Counts.as_json`) is flat: ``written``, each check's name, ``kept``,
``rates``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.datasets.types import CAPABILITIES
from evolve.files import plain_mode, write_atomic
from evolve.synth.checks import CHECKS
from evolve.synth.kinds import KINDS

ALL = "all"
KEPT = "kept"
OUTCOMES = (*CHECKS, KEPT)  # what becomes of a written question, in table order


@dataclass(frozen=True)
class Rejection:
    id: str
    conversation: str
    window: str
    kind: str
    capability: str
    question: str
    answer: str
    evidence: tuple[str, ...]  # the cited ids that name messages of its window
    unknown_evidence: tuple[str, ...]  # the cited ids that do not
    check: str
    reason: str


@dataclass(frozen=True)
class Counts:
    """One group's counts: questions written, each check's rejections (every name of
    :data:`~evolve.synth.checks.CHECKS`), kept."""

    written: int
    rejected: dict[str, int]
    kept: int

    @classmethod
    def of(cls, outcomes: Iterable[str]) -> Counts:
        """The counts of the group's outcomes, each a check's name (a rejection) or
        :data:`KEPT`."""
        rejected, kept = dict.fromkeys(CHECKS, 0), 0
        for outcome in outcomes:
            if outcome == KEPT:
                kept += 1
            else:
                rejected[outcome] += 1  # KeyError: no such check
        return cls(kept + sum(rejected.values()), rejected, kept)

    def count(self, outcome: str) -> int:
        """The questions of one outcome: a check's name (its rejections) or :data:`KEPT`."""
        return self.kept if outcome == KEPT else self.rejected[outcome]

    def rate(self, outcome: str) -> float:
        """:meth:`count` over ``written`` (0.0 when none was written)."""
        return self.count(outcome) / self.written if self.written else 0.0

    def as_json(self) -> dict[str, Any]:
        rates = {o: self.rate(o) for o in OUTCOMES}
        return {"written": self.written, **self.rejected, KEPT: self.kept, "rates": rates}


@dataclass(frozen=True)
class RejectionTally:
    """The counts by capability (``F`` … ``A`` and :data:`ALL`) and by kind."""

    by_capability: dict[str, Counts]
    by_kind: dict[str, Counts]

    def as_json(self) -> dict[str, Any]:
        return {
            "by_capability": {c: g.as_json() for c, g in self.by_capability.items()},
            "by_kind": {k: g.as_json() for k, g in self.by_kind.items()},
        }


def tally(kept: Iterable[tuple[str, str]], rejected: Iterable[Rejection]) -> RejectionTally:
    """The counts (and rates) from the kept questions' ``(capability, kind)`` and the
    rejections."""
    outcomes = [(cap, kind, KEPT) for cap, kind in kept]
    outcomes += [(r.capability, r.kind, r.check) for r in rejected]
    by_cap: dict[str, list[str]] = {c: [] for c in (*CAPABILITIES, ALL)}
    by_kind: dict[str, list[str]] = {k: [] for k in KINDS}
    for cap, kind, outcome in outcomes:
        for group in (by_cap[cap], by_cap[ALL], by_kind[kind]):
            group.append(outcome)
    return RejectionTally({c: Counts.of(o) for c, o in by_cap.items()},
                 {k: Counts.of(o) for k, o in by_kind.items()})  # fmt: skip


def table_rows(counts: RejectionTally) -> list[list[str]]:
    """One row per capability with questions written (and ``all``): the capability, written,
    each check's rejections as ``n (p %)``, kept; the header is ``["capability", "written",
    *CHECKS, "kept"]``."""
    rows = []
    for cap, group in counts.by_capability.items():
        if not group.written and cap != ALL:
            continue
        cells = [f"{group.count(o)} ({group.rate(o):.0%})" for o in OUTCOMES]
        rows.append([cap, str(group.written), *cells])
    return rows


def write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON at ``path``, atomically (:func:`evolve.files.write_atomic`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        path, (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode(), mode=plain_mode()
    )


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """``records`` one per line at ``path``, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    write_atomic(path, lines.encode(), mode=plain_mode())
