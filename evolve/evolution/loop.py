"""The evolution loop: cold start, refinement, trace-guided integration (docs/design.md §4).

Owns :class:`Evolution` (the rounds, the repairs, the budget checks, the filing) and
:func:`best_overall` / :func:`specialists`; what a run is assembled from (clients, proposer,
strategies, evaluation setup, task sets, backend) is built from its config by
:mod:`evolve.evolution.wiring`.

One round = ask the proposer for ``RunConfig.children`` children (K; :class:`~evolve.evolution.
proposer.Proposer`: the LLM coder when a coder model is configured, else the constant proposer),
one after another, each checked in the sandbox (up to ``RunConfig.repairs`` repair attempts fed
by the error) and filed; then judge them together (:mod:`evolve.evolution.evaluator`: evaluated
concurrently on the backend, each screened on the round's train minibatch first when
``RunConfig.cascade`` is on, the rest on train and valid with step reuse). Selection never
reads the test split. Train and valid are the splits of the run's bench (``RunConfig.bench``)
that its entry in the bench registry names (:meth:`evolve.benches.registry.Bench.run_split`), so
their questions carry that bench's native capabilities.

- **K children**: child ``i`` of a round gets ``Request.child == i``, so its proposal is
  deterministic in (run seed, round, child index); the earlier children's sources count as
  known, so siblings differ. Refinement spreads the K children over capabilities (the run's
  :class:`~evolve.evolution.selection.Selection`; by default the weakest gets most),
  integration over the specialists (child i pairs with rotation r·K + i), cold start makes K
  revisions.
- **Fitness** of a score block (overall, one capability, one question) is the value of the run's
  fitness mode (:meth:`~evolve.config.RunConfig.fitness`, :mod:`evolve.scoring.fitness`):
  evidence coverage offline, the judged score with a task model and a judge, answer F1 with a
  task model alone. The coder's system prompt states the mode in force.
- **Best overall** and the **specialist** per capability come from
  :mod:`evolve.evolution.archive`: a challenger replaces a holder only when a paired bootstrap
  test on the valid questions says it is better. Both are derived from the store, never kept
  separately, so they cannot drift from it. Each evaluation stores per-question fitness.
- **Cold start** revises the best program with no target; **refinement** targets the best
  program's weakest capability on train (none where no train task has a label: a user's
  questions with no capability and no annotator); **integration** merges the best program
  with the specialists (the constant proposer crosses constants over; the coder merges code).
- A child that fails the sandbox after its repairs is filed as ``rejected`` with the sandbox
  report, one the cascade stops as ``stopped``; a child whose proposals never produced a
  program files nothing and logs ``proposal_failed``. Each candidate records the errors of its
  earlier attempts and what its proposal and evaluations spent (and took: ``seconds``).

- **Guard sets** (``RunConfig.guards``, :mod:`evolve.benches.guards`): data the loop never
  diagnoses, builds cases from, annotates or shows a proposer; the seed is scored on them once,
  and a challenger that wins valid must also be not worse there than the holder it replaces
  (the archive's rule; the evaluator scores it on the guards only then).

Budget: before each round :meth:`~evolve.evolution.budget.Budget.stop_reason` is asked; when a
cap would be passed the run stops cleanly (:attr:`Evolution.stopped`) and resumes later with a
higher cap. Within a round the caps hold at every model call (:mod:`evolve.models.spendcap`,
in-flight calls counted, in every process of the run): a call the caps refuse ends the round
where it is — its children stay ``proposed``, nothing is filed from the refused evaluation —
and the run stops the same way; the resumed run redoes that round. Spend lives in the run's
call log, so it is never reset.

Resume invariants: the state (``state.json``) holds the round counters and what each round
spent, and is saved after each finished round (all its K children judged). Proposals are
deterministic in the request (offline: seeded; coder: its replies come from the request cache on
a replay), and the store returns the existing candidate for a source it already holds, so a
round interrupted anywhere — even by SIGKILL, before, during or after its cascade, even after
all its children were evaluated — is replayed to the same children: each replayed request
leaves out the round's own children (found by their ``proposed`` events) and sees the same
earlier siblings. A child already judged (``evaluated``, ``stopped``, ``rejected``,
``failed``) is never evaluated again, and a promoted child (its screen recorded) is not
screened again. A candidate whose record the store rebuilt from its intact source
(``recovered``, status ``proposed``) is scored again right after the seed. Each evaluation
logs ``evaluating`` (with its ``phase``) when it starts and
``screened`` or ``evaluated`` when it is filed, so a run's event log shows what was evaluated
how often.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evolve.config import SPLITS, STAGES, RunConfig
from evolve.datasets.types import TaskSet
from evolve.evaluation.distributed import JobBackend
from evolve.evaluation.executor import EvalError
from evolve.evaluation.identity import pipeline_version
from evolve.evaluation.report import ScoreBlock
from evolve.evaluation.setup import reset_endpoint
from evolve.evaluation.stepcache import program_steps
from evolve.evolution.annotate import Labels, annotate
from evolve.evolution.archive import archive
from evolve.evolution.budget import Budget, calls_path, read_spend
from evolve.evolution.candidate import TRAIN, VALID
from evolve.evolution.cases import UnitsOf, differential_cases, failing_cases
from evolve.evolution.evaluator import EvalProgress, Evaluator, Phase
from evolve.evolution.proposer import CandidateView, Proposal, Request
from evolve.evolution.routing import compare
from evolve.evolution.stages import common_ancestor, history, partners
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.wiring import assemble, guard_sets, job_backend, task_set
from evolve.models.llm import LLMClient
from evolve.models.spendcap import Caps, SpendCapReached, write_caps
from evolve.models.usage import Tally
from evolve.trace import QuestionTrace
from sandbox.check import CheckReport, check_program
from sandbox.fingerprint import fingerprints


def best_overall(candidates: list[CandidateMeta]) -> CandidateMeta | None:
    """The best program overall (:mod:`evolve.evolution.archive`: paired test on valid)."""
    return archive(candidates).best


def specialists(candidates: list[CandidateMeta]) -> dict[str, CandidateMeta]:
    """The specialist per capability (:mod:`evolve.evolution.archive`)."""
    return archive(candidates).specialists


Progress = Callable[[str, int, int], None]  # (description, rounds done, rounds in total)


class Evolution:
    """Runs (or resumes) the loop of one run store.

    Its parts come from :func:`~evolve.evolution.wiring.assemble`: ``coder`` and ``annotator``
    replace the clients built from ``config.coder_model``, and ``judge`` the one built from
    ``config.judge_model`` (tests pass a :class:`~evolve.models.testing.ScriptedLLM` logging to
    the run's call log); ``task_script`` makes the evaluation workers answer task prompts from
    a script (tests only).
    """

    def __init__(
        self,
        store: RunStore,
        config: RunConfig,
        progress: Progress | None = None,
        *,
        eval_progress: EvalProgress | None = None,
        coder: LLMClient | None = None,
        annotator: LLMClient | None = None,
        judge: LLMClient | None = None,
        task_script: Callable[..., str] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.progress = progress or (lambda *_: None)
        self.stopped: str | None = None  # why the run stopped before its last round
        self.budget = Budget(config.max_usd, config.max_tokens)
        parts = assemble(config, store.root, coder=coder, annotator=annotator, judge=judge,
                         task_script=task_script)  # fmt: skip
        self.coder, self.annotator, self.judge = parts.coder, parts.annotator, parts.judge
        self.proposer, self.selection = parts.proposer, parts.selection
        self.case_order, self.setup, self.embedder = parts.case_order, parts.setup, parts.embedder
        self._backend: JobBackend | None = None  # started on the first evaluation
        self.evaluator = Evaluator(store, config, self.setup, self.judge, lambda: self.backend,
                                   self.tasks, self.compare_routing, eval_progress,
                                   self.guards)  # fmt: skip
        self._tasks: dict[str, TaskSet] = {}
        self._guards: Phase | None = None
        self._labels: dict[str, Labels] | None = None

    @property
    def backend(self) -> JobBackend:
        if self._backend is None:
            self._backend = job_backend(self.config)
        return self._backend

    def tasks(self, split: str) -> TaskSet:
        if split not in self._tasks:
            self._tasks[split] = task_set(self.config, split)
        return self._tasks[split]

    def guards(self) -> Phase:
        """The run's guards (:func:`~evolve.evolution.wiring.guard_sets`), loaded on first use;
        the evaluator alone reads them."""
        if self._guards is None:
            self._guards = guard_sets(self.config)
        return self._guards

    def run(self, seed_report: CheckReport | None = None) -> CandidateMeta:
        """Run every remaining round (or until a budget cap); returns the best program overall.
        ``seed_report``: the seed's sandbox report where the caller has checked it already
        (used only when it passed on the seed's source as it reads now)."""
        write_caps(calls_path(self.store.root), Caps(self.config.max_usd, self.config.max_tokens))
        reset_endpoint(self.setup)  # tripped by an earlier process: the endpoint may be back
        seed_source = Path(self.config.seed_program).read_text()
        seed = self.store.add_candidate(
            seed_source,
            parents=[],
            stage="seed",
            capability=None,
            message=f"seed {Path(self.config.seed_program).name}",
        )
        try:
            checked = seed_report.program if seed_report is not None else None
            reuse = checked is not None and checked.source == seed_source
            self.evaluator.judge_all([(seed, seed_report if reuse else None)], None)
        except SpendCapReached as exc:
            raise EvalError(f"the seed could not be evaluated: {exc}") from None
        if self.store.get(seed.id).status != "evaluated":
            raise EvalError(f"the seed program failed: {self.store.get(seed.id).message}")
        recovered = [c for c in self.store.candidates() if c.recovered and c.status == "proposed"]
        self.evaluator.judge_all([(c, None) for c in recovered], None)  # damaged records: rescored
        state = self.store.load_state(self.config.children)
        rounds = dict(state.get("rounds", {}))
        costs: list[dict[str, float]] = list(state.get("round_costs", []))
        total = sum(self.config.rounds.values())
        for stage in STAGES:
            while rounds.get(stage, 0) < self.config.rounds.get(stage, 0):
                done = sum(rounds.values())
                spend = read_spend(self.store.root)
                before = spend.total
                self.stopped = self.budget.stop_reason(spend, costs)
                if self.stopped:
                    self.store.log_event("budget_stop", reason=self.stopped, round=done)
                    return self._best()
                money = f" · ${before.cost_usd:.4f}" if before.calls else ""
                self.progress(f"{stage} {rounds.get(stage, 0) + 1}{money}", done, total)
                try:
                    self.round(stage, done, rounds.get(stage, 0))
                except SpendCapReached as exc:  # mid-round: the round is redone on resume
                    self.stopped = str(exc)
                    self.store.log_event("budget_stop", reason=self.stopped, round=done)
                    return self._best()
                after = read_spend(self.store.root).total
                costs.append({"usd": after.cost_usd - before.cost_usd,
                              "tokens": after.tokens - before.tokens})  # fmt: skip
                rounds[stage] = rounds.get(stage, 0) + 1
                best = best_overall(self.store.candidates())
                self.store.save_state({"rounds": rounds, "best": best.id if best else None,
                                       "round_costs": costs})  # fmt: skip
        self.progress("done", total, total)
        return self._best()

    def _best(self) -> CandidateMeta:
        best = best_overall(self.store.candidates())
        assert best is not None  # the seed is evaluated
        return best

    def labels(self) -> dict[str, Labels]:
        """Capability labels of the train and valid tasks (annotated once per run object)."""
        if self._labels is None:
            self._labels = {}
            for split in SPLITS:
                self._labels.update(annotate(self.tasks(split), self.annotator))
            sources = sorted({lab.source for lab in self._labels.values()})
            self.store.log_event("annotated", tasks=len(self._labels), sources=sources)
        return self._labels

    def request(
        self, stage: str, round_no: int, stage_round: int = 0, child: int = 0,
        siblings: frozenset[str] = frozenset(),
    ) -> Request:  # fmt: skip
        """What the proposer sees for child ``child`` of this round (train only; never valid
        cases, never test); failing and differential cases only for a proposer that reads them.
        ``siblings``: the sha256 of this round's earlier children, counted as known.

        A candidate still "proposed", or first proposed by this very round (its ``proposed``
        event), is this round's own child from before an interruption — the round is saved
        only after its children are judged. The request is built without them, exactly as the
        uninterrupted round saw the run, and they do not count as known, so the replay
        proposes them again (and evaluates each only if it was not judged yet)."""
        own = self._children_of(round_no)
        candidates = [c for c in self.store.candidates()
                      if c.status != "proposed" and c.id not in own]  # fmt: skip
        kept = archive(candidates)
        parent = kept.best
        assert parent is not None
        holistic, k = self.config.holistic, self.config.children
        labels = self.labels()
        train = self.tasks("train")
        labelled = any(labels[q.id].labelled for q in train.questions)
        target = None  # also where no train task has a label: nothing to target
        if stage == "refinement" and not holistic and labelled:
            target = self.selection.targets(parent, candidates, labels, stage_round, k)[child]
        traces = self.store.traces(parent.id, "train")
        others = [] if holistic or stage != "integration" else partners(
            parent, kept.specialists, round_no * k + child)  # fmt: skip
        ancestor: CandidateView | None = None
        differential: tuple[dict[str, Any], ...] = ()
        cases: tuple[dict[str, Any], ...] = ()
        if others:
            common = common_ancestor(candidates, parent, others[0])
            ancestor = self._program(common) if common is not None else None
        if others and self.proposer.builds_cases:
            differential = differential_cases(
                traces, self.store.traces(others[0].id, "train"), train, self.embedder
            )
        if self.proposer.builds_cases:
            cases = self._failing_cases(parent, traces, target, labels, round_no)
        return Request(
            stage=stage,
            round_no=round_no,
            parent=self._program(parent),
            target=target,
            specialists=tuple(self._program(s) for s in others),
            cases=cases,
            history=history(candidates, labels, target),
            ancestor=ancestor,
            differential=differential,
            diagnostics=parent.scores[TRAIN].diagnostics,
            known=frozenset(c.source_sha256 for c in candidates) | siblings,
            child=child,
            siblings=siblings,
        )

    def _children_of(self, round_no: int) -> set[str]:
        """Ids of the candidates first proposed by round ``round_no`` (from the event log)."""
        first: dict[str, int] = {}
        for event in self.store.events("proposed"):
            first.setdefault(event["data"]["candidate"], event["data"]["round"])
        return {c for c, r in first.items() if r == round_no}

    def _failing_cases(
        self,
        parent: CandidateMeta,
        traces: list[QuestionTrace],
        target: str | None,
        labels: dict[str, Labels],
        round_no: int,
    ) -> tuple[dict[str, Any], ...]:
        """The parent's failing train cases, in the run's case order (``config.cases``: the
        worst first, or a draw seeded by the run seed and the round)."""
        return failing_cases(
            traces,
            self.tasks("train"),
            target,
            labels=labels,
            order=self.case_order,
            seed=f"{self.config.rng_seed}:{round_no}",
            embedder=self.embedder,
            units_of=self._units_of(self.store.source(parent.id)),
        )

    def _units_of(self, source: str) -> UnitsOf:
        """Where a case finds the units the program extracted from a train session: the step
        store (trusted side), under the program's own extraction keys."""
        keys, steps = program_steps(self.setup, fingerprints(source), pipeline_version())
        convs = {c.id: c for c in self.tasks("train").conversations}

        def units(conv_id: str, i: int) -> list[dict[str, Any]] | None:
            found = steps.get_json("extract", keys.extract(convs[conv_id].sessions[i].digest()))
            return None if found is None else list(found)

        return units

    def _program(self, meta: CandidateMeta) -> CandidateView:
        train = {TRAIN: meta.scores.get(TRAIN, ScoreBlock())}  # proposers see train scores only
        return CandidateView(meta.id, self.store.source(meta.id), train, meta.message)

    def round(self, stage: str, round_no: int, stage_round: int = 0) -> None:
        """Propose ``config.children`` children one after another, then judge them together
        (:class:`~evolve.evolution.evaluator.Evaluator`: concurrently, through the cascade)."""
        children: dict[str, tuple[CandidateMeta, CheckReport | None]] = {}
        siblings: frozenset[str] = frozenset()
        parent: CandidateMeta | None = None
        for i in range(self.config.children):
            request = self.request(stage, round_no, stage_round, i, siblings)
            parent = self.store.get(request.parent.id)
            filed = self.propose(request)
            if filed is None:
                continue
            siblings |= {filed[0].source_sha256}
            if filed[0].status == "proposed":
                children.setdefault(filed[0].id, filed)
        self.evaluator.judge_all(list(children.values()), parent)

    def propose(self, request: Request) -> tuple[CandidateMeta, CheckReport | None] | None:
        """One child of the round, filed (None when no program came out), with its sandbox
        report."""
        stage, round_no = request.stage, request.round_no
        proposal, report, failures = self.attempt(request)
        spent = Tally()
        for record in self.coder.drain_records() if self.coder else []:
            spent.add(dataclasses.asdict(record))
        if proposal.source is None:
            self.store.log_event("proposal_failed", stage=stage, round=round_no,
                                 child=request.child, errors=failures,
                                 usage=spent.as_json())  # fmt: skip
            return None
        child = self.store.add_candidate(
            proposal.source,
            parents=list(proposal.parents),
            stage=stage,
            capability=request.target,
            message=proposal.message,
        )
        self.store.log_event("proposed", candidate=child.id, stage=stage, round=round_no,
                             child=request.child,
                             cases=[case["id"] for case in request.cases])  # fmt: skip
        if child.status == "proposed" and child.cascade is None:
            passed = report is not None and report.passed
            earlier = failures if passed else failures[:-1]
            child = self.store.update(child.id, attempts=earlier,
                                      usage={"proposal": spent.as_json()})  # fmt: skip
        return child, report

    def attempt(self, request: Request) -> tuple[Proposal, CheckReport | None, list[str]]:
        """The proposal, then up to ``config.repairs`` repairs; returns the last proposal, its
        sandbox report (None when it has no source) and the error of every failed attempt."""
        proposal = self.proposer.propose(request)
        failures: list[str] = []
        for attempt in range(self.config.repairs + 1):
            report = None
            if proposal.source is not None:
                report = check_program(proposal.source, "candidate", request.parent.source)
                if report.passed:
                    return proposal, report, failures
            error = report.repair_text() if report else (proposal.error or "no program")
            failures.append(error)
            self.store.log_event("attempt_failed", stage=request.stage, round=request.round_no,
                                 attempt=attempt, error=error)  # fmt: skip
            spent = self.budget.exhausted(read_spend(self.store.root))
            can_repair = attempt < self.config.repairs and not spent
            repaired = self.proposer.repair(request, proposal, error) if can_repair else None
            if repaired is None:
                return proposal, report, failures
            proposal = repaired
        raise AssertionError("unreachable")

    def compare_routing(self, candidate_id: str) -> None:
        """Record an integrated program beside the two routing baselines (valid)."""
        meta = self.store.get(candidate_id)
        if meta.stage != "integration":
            return
        kept = archive([c for c in self.store.candidates() if c.id != candidate_id])
        result = compare(meta, kept, self.tasks("valid"), self.annotator)
        valid = meta.scores[VALID].model_copy(update={"routing": result})
        self.store.update(candidate_id, scores={**meta.scores, VALID: valid})
        self.store.log_event("routing", candidate=candidate_id, **result)
