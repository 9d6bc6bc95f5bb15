"""Evaluating candidates of a run: sandbox, score on the splits, file (docs/design.md §4).

Owns :class:`Evaluator`. The children of a round are handed over together and evaluated
together: one thread per child and split calls :func:`evolve.evaluation.executor.run_eval` on the
run's
one backend, so the conversation jobs of all of them are queued on the loky pool (or Ray) at
once, never one program or split after another. Results are filed by the calling thread as each
child finishes; only it writes the store. With ``RunConfig.cascade`` (never for the seed) each
child is screened on the round's minibatch first (the rules are :mod:`evolve.evolution.cascade`'s):

- a child the paired test finds worse than its parent is filed ``stopped`` with its minibatch
  scores (its block under :data:`~evolve.evolution.candidate.MINIBATCH`), the reason (in its
  message and ``cascade``) and its seconds, and costs nothing more; it is never an archive
  member (only ``evaluated`` ones are);
- otherwise it is *promoted*: its screen is recorded (``cascade["verdict"] == "promoted"``,
  status still ``proposed``) and it gets the full train + valid evaluation, where step reuse
  serves the minibatch conversations' steps.

**Guard sets** (:mod:`evolve.benches.guards`, the archive's rule): the seed's full
evaluation covers every guard of the run too (its figures are computed once). After a round's
children are filed, :meth:`Evaluator.score_pending_on_guards` replays the archive; while it
names a challenger that won valid but has no guard figures (``Archive.pending``), that one
candidate is evaluated on the guards (phase ``guard``: the same backend, step reuse, task model
and judge as valid, no diagnosis), its blocks filed under ``guard:<name>`` with the guard tests
it met (``guards``, event ``guarded``), and the archive replayed again. A child the cascade
stopped never reaches it, and only a candidate that would otherwise be promoted is ever scored
on a guard.

A candidate whose every question failed (a program that passes the sandbox but fails on real
conversations) is filed ``failed`` with the first error in its message, never ``evaluated``;
the loop stops the run when that candidate is the seed.

A candidate's ``seconds`` is everything its evaluations took (minibatch, full and guards).
Resume: a child whose screen is recorded is not screened again; a judged one (:data:`JUDGED`)
is left as it is, and :meth:`Evaluator.score_pending_on_guards` finishes any guard evaluation
an interruption cut off. Each evaluation logs ``evaluating`` (``phase``: ``minibatch``,
``full`` or ``guard``) when it starts, and ``screened``, ``evaluated`` or ``guarded`` when its
result is filed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from evolve.config import SPLITS, RunConfig
from evolve.datasets.types import TaskSet
from evolve.evaluation.distributed import JobBackend
from evolve.evaluation.executor import EvalError, ProgressFn, run_eval
from evolve.evaluation.report import EvalReport, ScoreBlock
from evolve.evaluation.setup import EvalSetup
from evolve.evolution.archive import archive, fitness, question_fitness
from evolve.evolution.candidate import MINIBATCH, TRAIN, VALID
from evolve.evolution.cascade import minibatch, verdict
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.models.llm import LLMClient
from evolve.trace import first_error
from sandbox.check import CheckedProgram, CheckReport, check_program

JUDGED = ("evaluated", "rejected", "failed", "stopped")  # statuses never evaluated again
Phase = list[tuple[str, TaskSet]]  # (name the scores are filed under, tasks)
# (slot: which of the concurrent evaluations, label e.g. "c0003 train", its questions) -> the
# progress function of that evaluation (a display row per slot)
EvalProgress = Callable[[int, str, int], ProgressFn]


def score_block(result: EvalReport) -> ScoreBlock:
    """What a candidate keeps of one split's evaluation."""
    return ScoreBlock.of(result, question_fitness(result.traces))


@dataclasses.dataclass
class _Job:
    candidate: CandidateMeta
    program: CheckedProgram
    report: CheckReport


class Evaluator:
    """Evaluates and files candidates of one run (see the module docstring). ``backend`` and
    ``tasks`` are the loop's (started / loaded on first use); ``after`` is called with the id
    of each candidate filed ``evaluated``; ``progress`` gives each evaluation of a split its
    progress function (``evolve run``'s display)."""

    def __init__(
        self,
        store: RunStore,
        config: RunConfig,
        setup: EvalSetup,
        judge: LLMClient | None,
        backend: Callable[[], JobBackend],
        tasks: Callable[[str], TaskSet],
        after: Callable[[str], None],
        progress: EvalProgress | None = None,
        guards: Callable[[], Phase] = list,
    ) -> None:
        self.store, self.config, self.setup, self.judge = store, config, setup, judge
        self.backend, self.tasks, self.after = backend, tasks, after
        self.progress = progress
        self.guards = guards  # (scores key, tasks) of each guard of the run, loaded on first use

    def judge_all(
        self, children: list[tuple[CandidateMeta, CheckReport | None]], parent: CandidateMeta | None
    ) -> None:
        """Sandbox (where no report is given), screen (cascade; ``parent`` None: none) and
        evaluate ``children`` concurrently; candidates already judged are left as they are."""
        jobs = [job for c, report in children if (job := self._checked(c, report))]
        if self.config.cascade and parent is not None:
            self._screen([j for j in jobs if j.candidate.cascade is None], parent)
        full = [dataclasses.replace(j, candidate=self.store.get(j.candidate.id)) for j in jobs]
        phase = [(split, self.tasks(split)) for split in SPLITS]
        if parent is None and all(j.candidate.stage == "seed" for j in full):
            phase += self.guards()  # the seed's guard figures, computed once
        for job, results in self._run([j for j in full if j.candidate.status == "proposed"],
                                      "full", phase):  # fmt: skip
            if results is not None:
                self._file(job, results)
        self.score_pending_on_guards()

    def score_pending_on_guards(self) -> None:
        """Score each challenger the archive holds back for want of guard figures on the guards,
        one at a time, until the archive's replay needs none (see the module docstring)."""
        while (pending := archive(self.store.candidates()).pending) is not None:
            meta = self.store.get(pending)
            report = check_program(self.store.source(meta.id), meta.id)
            if report.program is None:  # passed once: the checker has changed since
                self._give_up(meta, report, "rejected", report.repair_text())
                continue
            program = dataclasses.replace(report.program, path=str(self.store.source_path(meta.id)))
            for _, results in self._run([_Job(meta, program, report)], "guard", self.guards()):
                if results is None:  # failed on a guard: filed "failed", out of the archive
                    continue
                meta = self.store.get(pending)
                self.store.update(
                    meta.id,
                    scores={**meta.scores, **{k: score_block(r) for k, r in results.items()}},
                    usage={**meta.usage, **{k: r.usage for k, r in results.items()}},
                    seconds=meta.seconds + sum(r.meta.seconds for r in results.values()),
                )  # fmt: skip
                checks = archive(self.store.candidates()).checks.get(meta.id, [])
                self.store.update(meta.id, guards=[c.as_json() for c in checks])
                failed = [c.reason for c in checks if not c.passed]
                self.store.log_event("guarded", candidate=meta.id, passed=not failed,
                                     reasons=failed)  # fmt: skip

    def _checked(self, candidate: CandidateMeta, report: CheckReport | None) -> _Job | None:
        if candidate.status in JUDGED:
            return None
        if report is None:
            report = check_program(self.store.source(candidate.id), candidate.id)
        if report.program is None:
            self._give_up(candidate, report, "rejected", report.repair_text())
            return None
        path = str(self.store.source_path(candidate.id))
        program = dataclasses.replace(report.program, path=path)  # checked before it had a file
        return _Job(candidate, program, report)

    def _screen(self, jobs: list[_Job], parent: CandidateMeta) -> None:
        batch = minibatch(parent, self.tasks(TRAIN), self.config.minibatch)
        per = parent.scores[TRAIN].questions
        theirs = {q.id: per[q.id] for q in batch.questions if q.id in per}
        full = sum(len(self.tasks(s).questions) for s in SPLITS)  # fmt: skip
        for job, results in self._run(jobs, "minibatch", [(MINIBATCH, batch)]):
            if results is None:
                continue
            result = results[MINIBATCH]
            seconds = result.meta.seconds
            seed = f"{parent.source_sha256}|{job.candidate.source_sha256}|minibatch"
            why, mine, before = verdict(question_fitness(result.traces), theirs, seed)
            saved = seconds * full / max(1, len(batch.questions)) - seconds if why else 0.0
            record = {"parent": parent.id, "conversations": [c.id for c in batch.conversations],
                      "questions": len(batch.questions), "verdict": "stopped" if why else
                      "promoted", "reason": why, "fitness": round(mine, 6),
                      "parent_fitness": round(before, 6), "seconds": seconds,
                      "saved_seconds": round(max(0.0, saved), 3)}  # fmt: skip
            fields: dict[str, Any] = {
                "cascade": record, "scores": {MINIBATCH: score_block(result)},
                "usage": {**job.candidate.usage, MINIBATCH: result.usage}, "seconds": seconds,
            }  # fmt: skip
            if why:
                message = f"{job.candidate.message} [stopped: {why}]"
                fields |= {"status": "stopped", "sandbox": job.report.as_json(), "message": message}
            self.store.update(job.candidate.id, **fields)
            self.store.log_event("screened", candidate=job.candidate.id,
                                 verdict=record["verdict"], reason=why)  # fmt: skip

    def _run(
        self, jobs: list[_Job], phase: str, splits: Phase
    ) -> Iterator[tuple[_Job, dict[str, EvalReport] | None]]:
        """Evaluate every job's program on ``splits``, all jobs at once; yields each job with its
        results as it finishes (None: it failed, and is filed ``failed``)."""
        if not jobs:
            return
        for job in jobs:
            self.store.log_event("evaluating", candidate=job.candidate.id, phase=phase)
        backend = self.backend()
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="evaluate") as pool:
            futures = {pool.submit(self._evaluate, job, splits, backend, slot): job
                       for slot, job in enumerate(jobs)}  # fmt: skip
            for future in as_completed(futures):
                job = futures[future]
                try:
                    yield job, future.result()
                except EvalError as exc:
                    self._give_up(job.candidate, job.report, "failed", str(exc))
                    yield job, None

    def _evaluate(
        self, job: _Job, splits: Phase, backend: JobBackend, slot: int
    ) -> dict[str, EvalReport]:
        """One job's splits, all at once (their conversation jobs share the backend's queue, so
        a long conversation, such as a guard's, is encoded beside the others, not after them);
        each split's progress has a display row of its own."""

        def one(i: int, name: str, tasks: TaskSet) -> EvalReport:
            # step diagnostics steer cold start: computed for the seed and its revisions
            diagnose = name == TRAIN and job.candidate.stage in ("seed", "cold_start")
            setup = dataclasses.replace(self.setup, diagnose=diagnose)
            label = f"{job.candidate.id} {name.removeprefix('guard:')}"
            row = slot * len(splits) + i
            on_progress = self.progress and self.progress(row, label, len(tasks.questions))
            judge = self.judge.view() if self.judge else None  # its own records: its calls only
            return run_eval(job.program, tasks, setup, judge=judge, backend=backend,
                            on_progress=on_progress,
                            judge_variant=self.config.judge_variant)  # fmt: skip

        with ThreadPoolExecutor(len(splits), thread_name_prefix="split") as pool:
            futures = {name: pool.submit(one, i, name, tasks)
                       for i, (name, tasks) in enumerate(splits)}  # fmt: skip
            return {name: future.result() for name, future in futures.items()}

    def _file(self, job: _Job, results: dict[str, EvalReport]) -> None:
        asked = sum(r.meta.questions for r in results.values())
        if asked and sum(r.meta.errors for r in results.values()) == asked:
            first = next((e for r in results.values() if (e := first_error(r.traces))), "")
            self._give_up(job.candidate, job.report, "failed",
                          f"every question failed; first: {first}"[:500])  # fmt: skip
            self.store.log_event("evaluated", candidate=job.candidate.id, valid=None)
            return
        meta = self.store.get(job.candidate.id)
        self.store.write_traces(meta.id, TRAIN, results[TRAIN].traces)
        self.store.update(
            meta.id,
            status="evaluated",
            sandbox=job.report.as_json(),
            scores={**meta.scores, **{s: score_block(r) for s, r in results.items()}},
            usage={**meta.usage, **{s: r.usage for s, r in results.items()}},
            seconds=meta.seconds + sum(r.meta.seconds for r in results.values()),
        )
        valid = fitness(results[VALID].scores.overall)
        self.store.log_event("evaluated", candidate=meta.id, valid=valid)
        self.after(meta.id)

    def _give_up(
        self, candidate: CandidateMeta, report: CheckReport, status: str, why: str
    ) -> None:
        """File a candidate that will not be evaluated (``rejected`` by the sandbox, or
        ``failed`` in evaluation), with its sandbox report and the reason in its message."""
        self.store.update(
            candidate.id,
            status=status,
            sandbox=report.as_json(),
            message=f"{candidate.message} [{status}: {why}]",
        )
