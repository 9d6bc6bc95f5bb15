"""The evolution loop: cold start, capability refinement, trace-guided integration (design §4).

One round = propose a child (:mod:`evolve.evolution.offline` here; the LLM coder comes with its
own module), check it in the sandbox, evaluate it on train and valid with stage reuse, and file
it in the run store. Selection never reads the test split.

- **Fitness** of a score block (overall or one capability) is the mean of evidence similarity
  and evidence hit rate (:func:`fitness`), the offline retrieval signal.
- **Best overall** = the evaluated candidate with the highest valid fitness; a **specialist** for
  capability c = the one with the highest valid fitness on c (ties: the earlier candidate).
  Both are derived from the store, never kept separately, so they cannot drift from it.
- **Cold start** revises the best program with no target; **refinement** targets the best
  program's weakest capability on train; **integration** crosses the best program with each
  specialist in turn (falling back to a plain proposal when they do not differ). A round looks
  for a child the run does not hold yet (a crossover can reproduce a parent).

Resume invariants: the state (``state.json``) holds only the round counters and is saved after
each finished round. Proposals are deterministic in (seed, round, target), and the store
returns the existing candidate for a source it already holds, so a round interrupted anywhere —
even by SIGKILL — is replayed to the same candidate, and an evaluated candidate is never
evaluated again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.datasets.beam import load_taskset
from evolve.datasets.types import CAPABILITIES, TaskSet
from evolve.evolution.offline import OfflineProposer, Proposal
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.executor import EvalError, evaluate, sandbox_check
from evolve.worker import WorkerConfig

STAGES = ("cold_start", "refinement", "integration")
ATTEMPTS = 5  # proposals tried per round before accepting one the run already holds
SPLITS = ("train", "valid")


@dataclass(frozen=True)
class RunConfig:
    """What a run needs; stored (as JSON) in the run manifest."""

    data_dir: str
    seed_program: str
    cache_dir: str
    rounds: dict[str, int] = field(
        default_factory=lambda: {"cold_start": 2, "refinement": 6, "integration": 2}
    )
    jobs: int = 2
    rng_seed: int = 0
    embedder: str = "minilm"
    conversations: int | None = None  # only the first N conversations of each split (quick runs)

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def fitness(block: dict[str, Any] | None) -> float:
    """Mean of evidence similarity and hit rate; 0 for a missing or empty block."""
    if not block:
        return 0.0
    values = [block.get("evidence_similarity"), block.get("evidence_hit_rate")]
    present = [v for v in values if isinstance(v, int | float)]
    return sum(present) / len(values) if present else 0.0


def best_overall(candidates: list[CandidateMeta]) -> CandidateMeta | None:
    done = [c for c in candidates if c.status == "evaluated"]
    return max(done, key=lambda c: (fitness(c.scores["valid"]["overall"]), -c.number), default=None)


def specialists(candidates: list[CandidateMeta]) -> dict[str, CandidateMeta]:
    out = {}
    done = [c for c in candidates if c.status == "evaluated"]
    for cap in CAPABILITIES:
        scored = [c for c in done if cap in c.scores["valid"]["by_capability"]]
        if scored:
            out[cap] = max(
                scored, key=lambda c: (fitness(c.scores["valid"]["by_capability"][cap]), -c.number)
            )
    return out


def weakest(candidate: CandidateMeta) -> str:
    by_cap = candidate.scores["train"]["by_capability"]
    return min(by_cap, key=lambda cap: (fitness(by_cap[cap]), cap))


Progress = Callable[[str, int, int], None]  # (description, rounds done, rounds in total)


class Evolution:
    """Runs (or resumes) the loop of one run store."""

    def __init__(self, store: RunStore, config: RunConfig, progress: Progress | None = None):
        self.store = store
        self.config = config
        self.progress = progress or (lambda *_: None)
        self.proposer = OfflineProposer(config.rng_seed)
        self.worker = WorkerConfig(
            cache_dir=config.cache_dir,
            task_model=None,
            embedder=config.embedder,
            stage_label="evolve",
        )
        self._tasks: dict[str, TaskSet] = {}

    def tasks(self, split: str) -> TaskSet:
        if split not in self._tasks:
            tasks = load_taskset(Path(self.config.data_dir), split)
            if self.config.conversations is not None:
                keep = tasks.conversations[: self.config.conversations]
                ids = {c.id for c in keep}
                questions = tuple(q for q in tasks.questions if q.conversation_id in ids)
                tasks = TaskSet(tasks.bench, tasks.split, keep, questions)
            self._tasks[split] = tasks
        return self._tasks[split]

    def run(self) -> CandidateMeta:
        """Run every remaining round; returns the best program overall."""
        seed_source = Path(self.config.seed_program).read_text()
        seed = self.store.add_candidate(
            seed_source,
            parents=[],
            stage="seed",
            capability=None,
            message=f"seed {Path(self.config.seed_program).name}",
        )
        self.evaluate(seed, parent_source=None)
        if self.store.get(seed.id).status != "evaluated":
            raise EvalError(f"the seed program failed: {self.store.get(seed.id).message}")
        state = self.store.load_state()
        rounds = dict(state.get("rounds", {}))
        total = sum(self.config.rounds.values())
        for stage in STAGES:
            while rounds.get(stage, 0) < self.config.rounds.get(stage, 0):
                done = sum(rounds.values())
                self.progress(f"{stage} round {rounds.get(stage, 0) + 1}", done, total)
                self.round(stage, done)
                rounds[stage] = rounds.get(stage, 0) + 1
                best = best_overall(self.store.candidates())
                self.store.save_state({"rounds": rounds, "best": best.id if best else None})
        self.progress("done", total, total)
        best = best_overall(self.store.candidates())
        assert best is not None  # the seed is evaluated
        return best

    def round(self, stage: str, round_no: int) -> None:
        candidates = self.store.candidates()
        parent = best_overall(candidates)
        assert parent is not None
        parent_source = self.store.source(parent.id)
        target = weakest(parent) if stage == "refinement" else None
        proposal, parents = self.propose(stage, parent, parent_source, target, round_no)
        child = self.store.add_candidate(
            proposal.source,
            parents=parents,
            stage=stage,
            capability=target,
            message=proposal.message,
        )
        self.store.log_event("proposed", candidate=child.id, stage=stage, round=round_no)
        self.evaluate(child, parent_source)

    def propose(
        self,
        stage: str,
        parent: CandidateMeta,
        parent_source: str,
        target: str | None,
        round_no: int,
    ) -> tuple[Proposal, list[str]]:
        """A child that is new to the run (up to :data:`ATTEMPTS` tries, deterministically)."""
        # A candidate still "proposed" is this round's own child from before an interruption:
        # it must be proposed again, so it does not count as known.
        known = {c.source_sha256 for c in self.store.candidates() if c.status != "proposed"}

        def new(proposal: Proposal) -> bool:
            return hashlib.sha256(proposal.source.encode()).hexdigest() not in known

        if stage == "integration":
            others = [s for s in specialists(self.store.candidates()).values() if s.id != parent.id]
            for k in range(len(others)):
                other = others[(round_no + k) % len(others)]
                try:
                    proposal = self.proposer.crossover(
                        parent_source, self.store.source(other.id), round_no
                    )
                except ValueError:
                    continue
                if new(proposal):
                    return proposal, [parent.id, other.id]
        for attempt in range(ATTEMPTS):
            proposal = self.proposer.propose(parent_source, target, round_no + 1000 * attempt)
            if new(proposal):
                break
        return proposal, [parent.id]

    def evaluate(self, candidate: CandidateMeta, parent_source: str | None) -> None:
        """Sandbox, then train and valid; a candidate already judged is left as it is."""
        if candidate.status in ("evaluated", "rejected", "failed"):
            return
        source = self.store.source(candidate.id)
        report = sandbox_check(source, candidate.id, parent_source)
        if not report.passed:
            self.store.update(
                candidate.id,
                status="rejected",
                sandbox=report.as_json(),
                message=f"{candidate.message} [rejected: {report.repair_text()}]",
            )
            return
        path = self.store.root / "candidates" / f"{candidate.id}.py"
        scores: dict[str, dict[str, Any]] = {}
        seconds = 0.0
        try:
            for split in SPLITS:
                result = evaluate(path, self.tasks(split), self.worker, jobs=self.config.jobs)
                scores[split] = {
                    "overall": result.scores["overall"],
                    "by_capability": result.scores["by_capability"],
                    "errors": result.meta["errors"],
                }
                seconds += result.meta["seconds"]
        except EvalError as exc:
            self.store.update(
                candidate.id,
                status="failed",
                sandbox=report.as_json(),
                message=f"{candidate.message} [failed: {exc}]",
            )
            return
        self.store.update(
            candidate.id,
            status="evaluated",
            sandbox=report.as_json(),
            scores=scores,
            seconds=seconds,
        )
        self.store.log_event(
            "evaluated", candidate=candidate.id, valid=fitness(scores["valid"]["overall"])
        )
