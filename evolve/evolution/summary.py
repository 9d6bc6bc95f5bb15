"""A run seen from outside: summaries of runs, candidates and their ancestry.

Owns the views the inspect commands (:mod:`evolve.cli.inspect`), exports (:mod:`.export`) and
the run report show: :class:`Figures` (one score row's figures), :class:`RunStatus`,
:class:`Transfer`, :class:`CandidateRow` and :class:`Evaluation`, each typed, with
``as_json()`` for ``--json`` output, and the functions that derive them. Nothing
here writes to a run. Everything is derived from the store on each call — best overall and
specialists come from :func:`~evolve.evolution.archive.archive` (the loop's own selection),
spend from the call log — so a summary can never disagree with the run it describes. Fitness is
always :func:`~evolve.evolution.archive.fitness` (the loop's selection signal: the run's fitness
mode, :func:`fitness_mode`) and ``None`` where a candidate has no score on that split; the
retrieval fitness (evidence coverage) with its ceiling (:func:`split_ceiling`: the gold
evidence packed into the budget), similarity and hit rate stay beside it as diagnostics.
Damaged candidates are left out as the store leaves them out (an ancestor that does not load
ends its branch). :func:`evaluation` describes an ``evolve eval`` folder. :func:`transfer` is
the best's fitness on valid and on each guard set beside the seed's and the ceiling (where a
program gained and where it lost), the one table ``run``, ``status``, ``programs``, ``report``,
``export`` and ``freeze`` all show (:func:`transfer_lines` as text).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evolve.benches.guards import KEY_PREFIX as GUARD_PREFIX
from evolve.config import STAGES
from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES, UNLABELLED
from evolve.evaluation.report import (
    Diagnostics,
    FitnessMode,
    MetricRow,
    ReportMeta,
    ScoreBlock,
    read_report,
)
from evolve.evolution.archive import Archive, archive, fitness, guard_keys
from evolve.evolution.budget import read_spend
from evolve.evolution.candidate import TEST, TRAIN, VALID
from evolve.evolution.cascade import saved_seconds
from evolve.evolution.store import STATUSES, CandidateMeta, DamagedFile, RunNotFound, RunStore
from evolve.models import damaged, why
from evolve.scoring import fmt_score
from evolve.scoring.fitness import mode_of, retrieval_fitness


def local_time(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@dataclass(frozen=True)
class Figures:
    """Fitness (the run's mode), retrieval fitness (evidence coverage) and its ceiling, evidence
    similarity and hit rate of one score row (None where missing)."""

    fitness: float | None = None
    retrieval_fitness: float | None = None
    ceiling: float | None = None
    similarity: float | None = None
    hit_rate: float | None = None

    def as_json(self) -> dict[str, float | None]:
        return asdict(self)


def figures(row: MetricRow | None) -> Figures:
    """The :class:`Figures` of one score row (all None for none, or an empty one)."""
    if row is None or row.is_empty():
        return Figures()
    return Figures(fitness(row), retrieval_fitness(row.as_scores()), row.ceiling,
                   row.metric("evidence_similarity"), row.metric("evidence_hit_rate"))  # fmt: skip


def fitness_mode(manifest: dict[str, Any]) -> FitnessMode:
    """The fitness a run selects on, as its manifest records it (runs from before modes were
    recorded selected on ``retrieval``)."""
    recorded = manifest.get("fitness")
    return (
        FitnessMode.model_validate(recorded)
        if recorded
        else FitnessMode(name=mode_of(None), version=None)
    )


def _row(meta: CandidateMeta, split: str, cap: str | None) -> MetricRow | None:
    block = meta.scores.get(split)
    return None if block is None or block.is_empty() else block.row(cap)


def split_fitness(meta: CandidateMeta, split: str = VALID, cap: str | None = None) -> float | None:
    """Fitness on a split, overall or on one capability; None when not scored there."""
    row = _row(meta, split, cap)
    return None if row is None else fitness(row)


def split_ceiling(meta: CandidateMeta, split: str = VALID, cap: str | None = None) -> float | None:
    """The coverage ceiling of a split (overall or one capability) as the candidate's
    evaluation recorded it; None where it was not scored there or before ceilings were kept."""
    row = _row(meta, split, cap)
    return None if row is None else row.ceiling


def ancestry(store: RunStore, candidate_id: str) -> list[CandidateMeta]:
    """The candidate and all its ancestors, each once, breadth first (parents in stored order),
    ending with the seed. A crossover has two parents, so this walks a DAG, not a chain. An
    ancestor whose file is damaged is reported and left out."""
    order: list[CandidateMeta] = []
    seen: set[str] = set()
    todo = [candidate_id]
    while todo:
        ref = todo.pop(0)
        try:
            meta = store.get(ref)
        except DamagedFile as exc:
            if ref == candidate_id:
                raise
            damaged(f"{exc}: ancestor skipped")
            continue
        if meta.id not in seen:
            seen.add(meta.id)
            order.append(meta)
            todo += [p for p in meta.parents if p not in seen]
    return order


def runs(runs_dir: Path) -> list[dict[str, Any]]:
    """One row per run, newest first: id, created (unix and local), candidates, best overall
    and its valid fitness (derived from the candidates, so current even mid-round)."""
    rows = []
    for run in RunStore.list_runs(runs_dir):
        try:
            best = archive(RunStore.open(runs_dir, run["id"]).candidates()).best
        except (RunNotFound, OSError, ValueError):  # removed or corrupted since it was listed
            best = None
        rows.append({"id": run["id"], "created": run["created"],
                     "created_local": local_time(run["created"]), "candidates": run["candidates"],
                     "best": best.id if best else None,
                     "best_valid_fitness": split_fitness(best) if best else None})  # fmt: skip
    return rows


@dataclass(frozen=True)
class TransferRow:
    """One split of :class:`Transfer`: valid or a guard (its name), the seed's and the
    program's fitness, their difference, and the seed's ceiling (None where not scored)."""

    split: str
    guard: bool
    seed: float | None
    program: float | None
    delta: float | None
    ceiling: float | None


@dataclass(frozen=True)
class Transfer:
    """A program (the best, or a candidate) beside the seed on valid and on each guard, and
    the candidates a guard held back (id -> reasons)."""

    program: str
    role: str  # "best" or "candidate"
    seed: str
    rows: list[TransferRow]
    held_back: dict[str, list[str]]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunStatus:
    """Where a run stands (:func:`status`); ``as_json()`` is ``evolve status --json``."""

    run: str
    created: float | None
    created_local: str | None
    config: dict[str, Any]
    stage: str
    round: int | None
    rounds: dict[str, dict[str, int]]
    stopped: str | None
    fitness: FitnessMode
    best: str | None  # the best overall's id
    best_figures: Figures  # its figures on valid
    transfer: Transfer | None
    diagnostics: Diagnostics | None  # the best's step diagnostics on train
    specialists: dict[str, dict[str, Any]]  # capability -> id, name, valid_fitness
    candidates: int
    by_status: dict[str, int]
    cascade_saved_seconds: float
    spend: dict[str, Any]
    frozen: list[tuple[str, Figures]]  # frozen candidates' ids and test figures

    def as_json(self) -> dict[str, Any]:
        best = None if self.best is None else {"id": self.best, **self.best_figures.as_json()}
        return {
            "run": self.run, "created": self.created, "created_local": self.created_local,
            "config": self.config, "stage": self.stage, "round": self.round,
            "rounds": self.rounds, "stopped": self.stopped, "fitness": self.fitness.model_dump(),
            "best": best, "transfer": self.transfer and self.transfer.as_json(),
            "diagnostics": self.diagnostics, "specialists": self.specialists,
            "candidates": self.candidates, "by_status": self.by_status,
            "cascade_saved_seconds": self.cascade_saved_seconds, "spend": self.spend,
            "frozen": [{"id": c, "test": test.as_json()} for c, test in self.frozen],
        }  # fmt: skip


def status(store: RunStore) -> RunStatus:
    """Where a run stands. ``stage``: ``seed`` until the seed is evaluated, then the stage of the
    next round (``round``, 1-based) or ``finished``; ``rounds`` compares the state's counters
    with the manifest's plan (a resume with ``--rounds`` may have gone past the plan);
    ``stopped`` is why the run stopped where it stands (a budget cap), else None."""
    manifest, candidates = store.manifest, store.candidates()
    planned = manifest.get("config", {}).get("rounds", {})
    done = store.load_state().get("rounds", {})
    rounds = {s: {"done": done.get(s, 0), "planned": planned.get(s, 0)} for s in STAGES}
    stage = next((s for s in STAGES if rounds[s]["done"] < rounds[s]["planned"]), "finished")
    if not any(c.stage == "seed" and c.status == "evaluated" for c in candidates):
        stage = "seed"
    stops = [e["data"] for e in store.events("budget_stop")]  # logged by the loop at a cap
    stopped = None
    if stops and stage != "finished" and stops[-1].get("round") == sum(done.values()):
        stopped = stops[-1].get("reason")
    kept = archive(candidates)
    best = kept.best
    counts = Counter(c.status for c in candidates)
    return RunStatus(
        run=store.run_id,
        created=manifest.get("created"),
        created_local=local_time(manifest.get("created")),
        config=manifest.get("config", {}),
        stage=stage,
        round=rounds[stage]["done"] + 1 if stage in rounds else None,
        rounds=rounds,
        stopped=stopped,
        fitness=fitness_mode(manifest),
        best=best.id if best else None,
        best_figures=figures(best.scores[VALID].row(None)) if best else Figures(),
        transfer=transfer(candidates, kept),
        diagnostics=best.scores[TRAIN].diagnostics if best else None,
        specialists={
            cap: {"id": m.id, "name": CAPABILITY_NAMES[cap],
                  "valid_fitness": split_fitness(m, cap=cap)}
            for cap, m in kept.specialists.items()
        },
        candidates=len(candidates),
        by_status={s: counts[s] for s in STATUSES},
        cascade_saved_seconds=saved_seconds(candidates),
        spend=read_spend(store.root).as_json(),
        frozen=[(c.id, figures(c.scores.get(TEST, ScoreBlock()).row(None)))
                for c in candidates if c.frozen],
    )  # fmt: skip


def transfer(
    candidates: list[CandidateMeta], kept: Archive | None = None, of: CandidateMeta | None = None
) -> Transfer | None:
    """The best's (or ``of``'s) and the seed's fitness on valid and on each of the run's guards,
    with the ceiling (the seed's record: the gold evidence packed into the budget) and the
    candidates a guard held back; None before anything is evaluated. ``kept``: the archive, if
    at hand."""
    kept = kept or archive(candidates)
    best = of or kept.best
    if best is None:
        return None
    seed = next((c for c in candidates if c.stage == "seed" and c.status == "evaluated"), best)
    rows = []
    for key in [VALID, *guard_keys(candidates)]:
        mine, theirs = split_fitness(best, key), split_fitness(seed, key)
        rows.append(TransferRow(key.removeprefix(GUARD_PREFIX), key != VALID, theirs, mine,
                                None if mine is None or theirs is None else mine - theirs,
                                split_ceiling(seed, key)))  # fmt: skip
    held = [c for c in candidates if kept.held_back(c.id)]
    role = "best" if kept.best is not None and best.id == kept.best.id else "candidate"
    reasons = {c.id: [str(g.reason) for g in kept.held_back(c.id)] for c in held}
    return Transfer(best.id, role, seed.id, rows, reasons)


def transfer_lines(t: Transfer | None) -> list[str]:
    """:func:`transfer` as plain text lines (empty when there is nothing yet)."""
    if t is None:
        return []
    who = t.role
    lines = [f"{who} {t.program} against seed {t.seed} (fitness; of a possible: the ceiling):"]
    for r in t.rows:
        delta = "" if r.delta is None else f" ({r.delta * 100:+.1f} pp)"
        label = f"guard {r.split}" if r.guard else "valid"
        lines.append(f"  {label}: seed {fmt_score(r.seed)}, {who} {fmt_score(r.program)}"
                     f"{delta} of a possible {fmt_score(r.ceiling)}")  # fmt: skip
    if not any(r.guard for r in t.rows):
        lines.append("  no guard sets: nothing outside valid was checked")
    n = len(t.held_back)
    if n:
        lines.append(f"  {n} candidate{'s' * (n != 1)} won valid but a guard held "
                     f"{'them' if n != 1 else 'it'} back (evolve programs shows why)")  # fmt: skip
    return lines


GUARD_FIELDS = ("guard", "role", "passed", "fitness", "holder_fitness", "reason")  # shown of each


@dataclass(frozen=True)
class CandidateRow:
    """One candidate as a row (:func:`candidate`): identity, story, valid fitness overall and
    per capability, and the guard tests it met (:data:`GUARD_FIELDS` of each)."""

    id: str
    stage: str
    capability: str | None
    status: str
    parents: list[str]
    valid_fitness: float | None
    by_capability: dict[str, float | None]
    frozen: bool
    message: str
    guards: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def candidate(meta: CandidateMeta) -> CandidateRow:
    """One candidate as a row: identity, story, and valid fitness overall and per capability
    (and of the unlabelled questions, where valid has some)."""
    by_cap = {cap: split_fitness(meta, cap=cap) for cap in CAPABILITIES}
    if (unlabelled := split_fitness(meta, cap=UNLABELLED)) is not None:
        by_cap[UNLABELLED] = unlabelled
    return CandidateRow(
        meta.id, meta.stage, meta.capability, meta.status, meta.parents, split_fitness(meta),
        by_cap, meta.frozen, meta.message,
        [{k: g[k] for k in GUARD_FIELDS} for g in meta.guards],
    )  # fmt: skip


@dataclass(frozen=True)
class Evaluation:
    """What an ``evolve eval`` folder holds (:func:`evaluation`): its report's meta and overall
    scores, with the fitness of the overall row."""

    folder: str
    meta: ReportMeta
    overall: MetricRow
    report: str  # the report file

    @property
    def fitness(self) -> float | None:
        return None if self.overall.is_empty() else fitness(self.overall)

    def as_json(self) -> dict[str, Any]:
        m = self.meta
        return {"evaluation": self.folder, "program": m.program, "bench": m.bench,
                "split": m.split, "mode": m.mode, "questions": m.questions,
                "conversations": m.conversations, "errors": m.errors, "fitness": self.fitness,
                "overall": self.overall.model_dump(), "report": self.report}  # fmt: skip


def evaluation(folder: Path) -> Evaluation | None:
    """What an ``evolve eval`` folder (``report.json`` and ``questions.jsonl``, no manifest)
    holds: its meta and overall scores; None for any other folder. DamagedFile if the report
    does not load."""
    path = folder / "report.json"
    if (folder / "manifest.json").exists() or not path.is_file():
        return None
    try:
        saved = read_report(path)
    except (OSError, ValueError) as exc:
        raise DamagedFile(f"evaluation report {path} is damaged ({why(exc)})") from None
    return Evaluation(folder.name, saved.meta, saved.scores.overall, str(path))


def describe_evaluation(e: Evaluation) -> str:
    """One paragraph on an evaluation folder, for ``evolve status``."""
    m = e.meta
    return (
        f"{e.folder} is an evaluation folder (evolve eval), not an evolution run: "
        f"program {m.program} on {m.bench} {m.split} ({m.mode}), "
        f"{m.questions} questions in {m.conversations} conversations, {m.errors} "
        f"failed; fitness {fmt_score(e.fitness)}. Report: {e.report}"
    )
