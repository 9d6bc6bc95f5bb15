"""Model-based constant proposer: optuna's TPE over a program's tunable constants (design §4).

Owns :class:`TPEProposer` (``--offline-search optuna``, the default; ``random`` is
:class:`~evolve.evolution.constants.ConstantProposer`, seeded random mutation, kept as an
ablation; :mod:`evolve.evolution.wiring` builds the one a run's config names).

The study. One optuna study per run, **derived from the run folder** every time a child is
asked for, never kept beside it (as the archive is derived from the store): its trials are the
run's evaluated candidates whose source the request counts as known (``Request.known``) but
this round's earlier children (``Request.siblings``: judged together with this one, after it
is proposed), in creation order; a trial's params are the candidate's tunable values
(:func:`~evolve.evolution.constants.tunables`), its value the round's objective read from
**train** scores only — the capability's fitness in refinement (``Request.target``), the
overall fitness otherwise (:func:`evolve.evolution.archive.fitness`). A child the cascade
stopped is a trial too: its value is its parent's objective plus its paired difference to the
parent on the minibatch questions (the target capability's, when the minibatch has some), so
the many children the cascade stops still teach the model where not to go. A candidate whose
values fall outside the space is left out.

The space. A child searches only :data:`SUBSPACE` of the parent's searchable tunables (without
the index moves unless the proposer allows them: :mod:`evolve.evolution.constants`) — the target
capability's guided ones (:data:`~evolve.evolution.constants.GUIDANCE`) first, then others drawn
by (seed, round, child) — and keeps the rest at the parent's values: TPE over all eighteen
tunables of the hybrid seed with a dozen trials samples nearly uniformly, and every such
child of a BEAM run (27 of 27, ``bench/search.py``) was far worse than its parent; a few
dimensions at a time it can place its samples. Each searched tunable spans its range
(declared, else inferred): ints as ints (log scale when the range spans at least
:data:`LOG_RATIO`), floats as floats (rounded to 3 significant digits once sampled), bools as a
categorical. Sampling is multivariate TPE seeded by (seed, round, child, partner). Until the
study holds :data:`STARTUP` trials the child is the random strategy's (local moves from the
parent, or crossover): TPE's own startup would sample the space uniformly, far from a tuned
seed, and a short run would spend its budget there.

Integration (``Request.specialists`` non-empty) is crossover followed by search: the space is
only the tunables where the parent and its partner (the first specialist that differs in some
live tunable) differ, each over the span between the two values (bools: both), the other
tunables stay the parent's.

Invariants:
- Exact replay and resume: a proposal depends only on (seed, request, the run folder's
  candidates the request knows). A replayed round's request leaves out its own children (the
  loop's rule) and the study its siblings even when they were judged before a kill, so a round
  asked, killed and asked again — or asked by a fresh proposer after ``--resume`` — proposes
  the same children; nothing is written, so nothing half-written exists.
- Every child is new (its sha256 not in ``request.known``) and changes at least one component
  fingerprint (only live tunables move); after :data:`ATTEMPTS` samples that give no new child
  the round falls back to the random mutation of :class:`ConstantProposer`.
- The proposer reads train scores only, never valid or test.
"""

from __future__ import annotations

import hashlib
import math
import random
import warnings
from pathlib import Path

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from evolve.evaluation.report import ScoreBlock
from evolve.evolution.archive import fitness
from evolve.evolution.candidate import MINIBATCH, TRAIN
from evolve.evolution.constants import (
    GUIDANCE,
    ConstantProposer,
    Tunable,
    Value,
    describe,
    patch,
    round3,
    searchable,
    tunables,
)
from evolve.evolution.proposer import CandidateView, Proposal, Request
from evolve.evolution.store import CandidateMeta, RunStore

ATTEMPTS = 8  # TPE samples tried per child before falling back to a random mutation
SUBSPACE = 3  # tunables one child searches, the rest stay the parent's (module docstring)
STARTUP = 6  # trials in the study before TPE proposes (the random strategy's moves until then)
LOG_RATIO = 20.0  # a positive range with high / low at least this is searched on a log scale

Space = dict[str, BaseDistribution]

optuna.logging.set_verbosity(optuna.logging.WARNING)


class TPEProposer(ConstantProposer):
    """TPE over the tunables, its study derived from the run folder; see the module docstring.

    Its ``mutate`` and ``crossover`` (the random strategy's) serve as the fallback."""

    name = "optuna"

    def __init__(self, seed: int, run_dir: Path, index_moves: bool = True) -> None:
        super().__init__(seed, index_moves)
        self.run_dir = Path(run_dir)

    def propose(self, request: Request) -> Proposal:
        parent = request.parent
        found = {t.name: t for t in searchable(parent.source, self.index_moves)}
        partner, space = _integration_space(found, request.specialists)
        if partner is None:
            movable = {n: d for n, t in found.items() if (d := _distribution(t)) is not None}
            space = {n: movable[n] for n in self._subspace(request, sorted(movable))}
        if not space:
            return super().propose(request)
        study = self._study(request, space, partner)
        if len(study.trials) < STARTUP:
            return super().propose(request)
        for _ in range(ATTEMPTS):
            trial = study.ask(space)
            edits = {found[n]: _value(found[n], v, space[n]) for n, v in trial.params.items()}
            edits = {t: v for t, v in edits.items() if v != t.value}
            source = patch(parent.source, edits)
            if edits and _sha256(source) not in request.known:
                return self._proposal(request, partner, source, edits)
        return super().propose(request)

    def _subspace(self, request: Request, names: list[str]) -> list[str]:
        """The :data:`SUBSPACE` tunables this child searches: the target capability's guided
        ones (:data:`~evolve.evolution.constants.GUIDANCE`) first, then others, each group in an
        order drawn from (seed, round, child)."""
        keywords = [k for k, _ in GUIDANCE.get(request.target or "", ())]
        rng = random.Random(f"{self.seed}:{request.round_no}:{request.child}:subspace")
        guided = [n for n in names if any(k in n for k in keywords)]
        rest = [n for n in names if n not in guided]
        rng.shuffle(guided)
        rng.shuffle(rest)
        return (guided + rest)[:SUBSPACE]

    def _study(self, request: Request, space: Space, partner: CandidateView | None) -> optuna.Study:
        """The run's study for this child: a seeded sampler, the known candidates as trials."""
        key = f"{self.seed}:{request.round_no}:{request.child}:{partner.id if partner else ''}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=int(hashlib.sha256(key.encode()).hexdigest()[:8], 16),
                n_startup_trials=STARTUP,
                multivariate=True,
            )
        study = optuna.create_study(direction="maximize", sampler=sampler)
        for params, value in self._trials(request, space):
            study.add_trial(optuna.trial.create_trial(params=params, distributions=space,
                                                      value=value))  # fmt: skip
        return study

    def _trials(self, request: Request, space: Space) -> list[tuple[dict[str, Value], float]]:
        """(params, objective) of every candidate the request knows that has an objective
        (evaluated, or stopped by the cascade: :func:`_objective`), in creation order; one
        whose values lie outside ``space`` is left out."""
        store = RunStore(self.run_dir)
        metas = {meta.id: meta for meta in store.candidates()}
        out = []
        for meta in metas.values():
            sha = meta.source_sha256
            if sha not in request.known or sha in request.siblings:
                continue
            value = _objective(meta, request.target, metas)
            if value is None:
                continue
            values = {t.name: t.value for t in tunables(store.source(meta.id))}
            params = {n: values[n] for n in space if n in values}
            if len(params) == len(space) and all(_inside(space[n], v) for n, v in params.items()):
                out.append((params, value))
        return out

    def _proposal(
        self,
        request: Request,
        partner: CandidateView | None,
        source: str,
        edits: dict[Tunable, Value],
    ) -> Proposal:
        changes = {t.name: (t.value, new) for t, new in edits.items()}
        parents: tuple[str, ...]
        if partner is not None:
            suffix, parents = f" (crossover with {partner.id})", (request.parent.id, partner.id)
        else:
            target = f" (target {request.target})" if request.target else ""
            suffix, parents = target, (request.parent.id,)
        return Proposal(source, f"optuna: {describe(changes)}{suffix}", parents, changes=changes)


def _integration_space(
    found: dict[str, Tunable], specialists: tuple[CandidateView, ...]
) -> tuple[CandidateView | None, Space]:
    """The first specialist that differs from the parent in a live tunable, and the space of
    the differing tunables (each over the span of the two values); (None, {}) when none does."""
    for other in specialists:
        theirs = {t.name: t for t in tunables(other.source)}
        space: Space = {}
        for name, t in found.items():
            o = theirs.get(name)
            if o is None or o.kind != t.kind or o.value == t.value:
                continue
            if t.kind == "bool":
                space[name] = CategoricalDistribution((False, True))
            else:
                low, high = sorted((t.value, o.value))
                space[name] = (IntDistribution(int(low), int(high)) if t.kind == "int"
                               else FloatDistribution(float(low), float(high)))  # fmt: skip
        if space:
            return other, space
    return None, {}


def _distribution(t: Tunable) -> BaseDistribution | None:
    """The search range of a tunable (None when it cannot move)."""
    if t.kind == "bool":
        return CategoricalDistribution((False, True))
    assert t.low is not None and t.high is not None
    log = t.low > 0 and t.high / t.low >= LOG_RATIO
    if t.kind == "int":
        low, high = math.ceil(t.low), math.floor(t.high)
        return IntDistribution(low, high, log=log) if low < high else None
    return FloatDistribution(t.low, t.high, log=log) if t.low < t.high else None


def _value(t: Tunable, sampled: Value, space: BaseDistribution) -> Value:
    """A sampled value in the tunable's type (floats to 3 significant digits, kept in range)."""
    if t.kind == "bool":
        return bool(sampled)
    if t.kind == "int":
        return int(sampled)
    assert isinstance(space, FloatDistribution)
    return min(max(round3(float(sampled)), space.low), space.high)


def _inside(space: BaseDistribution, value: Value) -> bool:
    """Whether a candidate's value is a point of the space, of the same type."""
    if isinstance(space, CategoricalDistribution):
        return isinstance(value, bool)
    kind = int if isinstance(space, IntDistribution) else float
    low, high = space.low, space.high  # type: ignore[attr-defined]
    return type(value) is kind and low <= value <= high


def _objective(
    meta: CandidateMeta, target: str | None, metas: dict[str, CandidateMeta]
) -> float | None:
    """The round's objective on a candidate's train scores (never valid); for a child the
    cascade stopped, its parent's objective plus the child's paired difference to it on the
    minibatch questions (of the target capability, when the minibatch has some); None for a
    candidate with neither."""
    if meta.status == "evaluated":
        return _train_objective(meta, target)
    parent = metas.get((meta.cascade or {}).get("parent", ""))
    mine = meta.scores.get(MINIBATCH, ScoreBlock()).questions
    if meta.status != "stopped" or parent is None or parent.status != "evaluated" or not mine:
        return None
    train = parent.scores.get(TRAIN, ScoreBlock())
    theirs, capability = train.questions, train.question_capabilities
    shared = [q for q in mine if q in theirs]
    aimed = [q for q in shared if capability.get(q) == target] if target else []
    paired = aimed or shared
    if not paired:
        return None
    difference = sum(mine[q] - theirs[q] for q in paired) / len(paired)
    return _train_objective(parent, target) + difference


def _train_objective(meta: CandidateMeta, target: str | None) -> float:
    return fitness(meta.scores.get(TRAIN, ScoreBlock()).row(target or None))


def _sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()
