"""The proposer interface: what the loop asks for a child program, and what it gets back.

Owns :class:`Request` (everything a proposer may look at for one round), :class:`Proposal`
(a child source, or the reason there is none) and the :class:`Proposer` protocol, implemented
by :class:`~evolve.evolution.coder.CoderProposer` (an LLM writing patches) and, without a coder
model, by the constant search the run's ``offline_search`` names (tunable constants, no LLM:
:class:`~evolve.evolution.tpe.TPEProposer`,
:class:`~evolve.evolution.constants.ConstantProposer`); :mod:`evolve.evolution.wiring` builds
the one a run uses.

Invariants:

- A proposer never runs candidate code and never reads the valid or test split: it sees the
  parent's source, its train scores and failing train cases, the run's earlier revisions, and
  for integration the specialists' sources. The loop sandbox-checks what it returns.
- Given the same request, a proposer returns the same proposal (the constant proposer is seeded;
  the coder's replies come from the request cache on a replay), which is what makes an
  interrupted round replay to the same candidate. A round's K children differ by
  ``Request.child``, so each is deterministic in (run seed, round, child index).
- The loop calls :meth:`Proposer.repair` at most ``RunConfig.repairs`` (default
  :data:`evolve.config.REPAIRS`) times per round, each time with the error of the previous
  attempt (the sandbox's repair text, or why a patch did not apply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from evolve.evaluation.report import Diagnostics, ScoreBlock


@dataclass(frozen=True)
class CandidateView:
    """A candidate the proposer may read: id, source and its scores (split -> blocks)."""

    id: str
    source: str
    scores: dict[str, ScoreBlock]
    message: str = ""


@dataclass(frozen=True)
class Revision:
    """An earlier revision of the run as a proposer sees it: what it was, and its effect (train
    fitness against its parent's, overall and per capability; None and empty where it or its
    parent was not evaluated)."""

    id: str
    stage: str
    capability: str | None
    message: str
    status: str
    train_delta: float | None = None
    by_capability: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """One round's question to a proposer."""

    stage: str  # "cold_start" | "refinement" | "integration"
    round_no: int  # rounds finished before this one, all stages together
    parent: CandidateView  # the best program overall, which the child revises
    target: str | None  # the capability to improve (refinement), else None
    specialists: tuple[CandidateView, ...] = ()  # best per capability but the parent; this round's
    # integration partner first
    cases: tuple[dict[str, Any], ...] = ()  # the parent's failing train cases (compact)
    history: tuple[Revision, ...] = ()  # earlier revisions (of the target): their effects
    ancestor: CandidateView | None = None  # integration: latest common ancestor of the two
    differential: tuple[dict[str, Any], ...] = ()  # integration: paired cases parent vs partner
    diagnostics: Diagnostics | None = None  # the parent's step diagnostics on train
    known: frozenset[str] = frozenset()  # sha256 of every source the run already holds, and
    # of this round's earlier children
    child: int = 0  # the index of this child within its round (0 .. RunConfig.children - 1)
    siblings: frozenset[str] = frozenset()  # sha256 of this round's earlier children (in known)


@dataclass(frozen=True)
class Proposal:
    """A child program (``source``), or ``source=None`` with ``error`` when none came out."""

    source: str | None
    message: str  # one line
    parents: tuple[str, ...]  # ids; the first is the program the source was patched from
    error: str | None = None  # why there is no source (a patch that did not apply, ...)
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # offline: name -> values
    transcript: tuple[dict[str, Any], ...] = ()  # coder: the conversation so far, for repair
    base: str | None = None  # coder: the program the next repair's edits apply to


class Proposer(Protocol):
    """Makes child programs. See the module docstring for what implementations guarantee.

    ``name`` says which proposer it is (``coder``, or the constant search's strategy);
    ``builds_cases`` whether it reads ``Request.cases`` and ``Request.differential`` (the loop
    builds them only for a proposer that does: they cost embedding work)."""

    name: str
    builds_cases: bool

    def propose(self, request: Request) -> Proposal:
        """A child of ``request.parent`` for this round (ideally one not in ``request.known``)."""
        ...

    def repair(self, request: Request, failed: Proposal, error: str) -> Proposal | None:
        """Another attempt after ``failed`` did not apply or failed the sandbox with ``error``;
        None when this proposer cannot repair (the round then ends with the failure)."""
        ...
