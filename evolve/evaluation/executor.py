"""Evaluating a program over a task set: dispatch to worker processes, score, aggregate.

The executor is the parent side of execution (docs/design.md §2). It never runs program code
itself: each conversation is a job for :func:`evolve.evaluation.conversation.run_conversation`
on a backend (:mod:`evolve.evaluation.distributed`: joblib's loky pool, reused between
evaluations so the embedding model loads once per worker, or a Ray cluster). Workers decide per
step what to reuse from the step store; the executor sums their counters (the report's
``steps``), scores every question here with :mod:`evolve.scoring.coverage` (the retrieval
fitness) and :mod:`evolve.scoring.retrieval` (the diagnostics beside it) and, when the task
model answered, with the benchmark's answer scorer (:mod:`evolve.scoring.answers`; judge calls
are made here, in the parent) — scoring code never shares a process with a candidate — and
writes per-question traces. Every evaluation runs with one
:class:`~evolve.evaluation.setup.EvalSetup` (its ``setup``).

Invariants:
- No program is evaluated before it has passed the sandbox: :func:`run_eval` takes the
  :class:`~sandbox.check.CheckedProgram` a passing check returns (a path is checked first, by
  :func:`check_file`), and runs exactly the source that was checked: each worker gets that
  ``CheckedProgram`` whole (its fingerprints and imports too), so no worker parses it again.
- A failing conversation (program error, crashed worker) fails only its own questions; they
  score 0 on every retrieval metric they have, their answers are scored as empty answers, and
  they carry the error in their trace.
- The report's ``meta.mode`` is :data:`~evolve.evaluation.identity.OFFLINE_MODE` whenever no task
  model is set, else :data:`~evolve.evaluation.identity.ONLINE_MODE`.
- Every question's trace scores, and so every aggregate block, carry the fitness of the
  evaluation's mode (:mod:`evolve.scoring.fitness`) under ``fitness``; ``meta.fitness`` names
  the mode and its versions (the mode's and the coverage scorer's).
- Every question's trace scores, and so every aggregate block, carry the coverage ceiling of
  its questions under ``ceiling`` (:mod:`evolve.scoring.ceiling`: the gold evidence packed
  into the budget, cached per task set); ``meta.ceiling`` holds the overall one. A failed
  question keeps its ceiling.
- A task set with no question, or whose conversations hold no message text, is refused before
  any work starts (:func:`check_evaluable`): "nothing was evaluated", never a report of dashes.
- A model call the run's caps refuse (:mod:`evolve.models.spendcap`) fails the evaluation
  with :class:`~evolve.models.spendcap.SpendCapReached`: no report is made of it.
- A model endpoint found down (the run's breaker, :mod:`evolve.models.breaker`, tripped by
  any worker or the judge) fails the evaluation with
  :class:`~evolve.models.breaker.EndpointDown` within a quarter second of the trip, without
  waiting for the conversations still running: no report is made of it.
- A question whose judge reply never parses scores 0 on the judged metrics and is marked
  (:data:`~evolve.scoring.answers.UNJUDGED`); ``meta.unjudged`` counts them.
- Answers are judged up to ``setup.llm_concurrency`` questions at once; each question is
  scored on its own and the results are kept in trace order, so scores equal a sequential
  run's (:func:`evolve.fanout.ordered_map`).
- ``meta.time`` splits the workers' wall time, summed over conversations, into ``model_wait``,
  ``sandbox`` and ``local`` (:class:`~evolve.fanout.WallClock`), and gives ``judging``, the
  parent's wall seconds scoring answers; ``meta.seconds`` is the evaluation's wall time.
- Progress (``on_progress``): on the local backend workers report :data:`EVENTS` over a queue
  as they go, and :class:`WorkerEvents` makes one line of them (and of the judge calls made here);
  every question is counted once, a crashed worker's unreported ones when it is found dead.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, replace
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

from contract.spec import COMPONENTS
from evolve.benches.registry import bench
from evolve.datasets.types import Question, TaskSet
from evolve.evaluation import diagnostics
from evolve.evaluation.conversation import ConversationResult, run_conversation
from evolve.evaluation.distributed import JobBackend, die_with_parent, make_backend
from evolve.evaluation.identity import OFFLINE_MODE, ONLINE_MODE
from evolve.evaluation.report import (
    CeilingRecord,
    EvalReport,
    FitnessMode,
    JudgeRecord,
    ReportMeta,
    ReportScores,
)
from evolve.evaluation.setup import EvalSetup, check_endpoint, make_embedder
from evolve.fanout import ordered_map
from evolve.models.llm import LLMClient
from evolve.models.spendcap import SpendCapReached, is_spend_cap
from evolve.models.usage import by_role
from evolve.scoring import coverage
from evolve.scoring.answers import UNJUDGED, AnswerScorer, Judged, score_answer
from evolve.scoring.ceiling import KEY as CEILING_KEY
from evolve.scoring.ceiling import question_ceilings
from evolve.scoring.fitness import KEY as FITNESS_KEY
from evolve.scoring.fitness import Variant
from evolve.scoring.retrieval import METRICS, RetrievalScorer, ScoreInput, aggregate
from evolve.trace import QuestionTrace
from sandbox.check import CheckedProgram, check_program


class EvalError(Exception):
    """The evaluation could not start (unreadable program, bad configuration)."""


ProgressFn = Callable[[int, str | None], None]
"""``(questions finished since the last call, what the evaluation is doing now)``: called as
workers report (:func:`evolve.evaluation.conversation.run_conversation`'s events) and per judged
question."""
EVENTS = ("window", "session", "indexing", "indexed", "restored", "question")  # what workers report


class WorkerEvents:
    """What the workers of one evaluation reported so far, as one line for a progress display:
    sessions extracted, extraction windows the task model answered, memories indexed (and
    which conversations are being indexed now) or restored from the step store, judge calls;
    nothing (None) before the first of them."""

    def __init__(self, tasks: TaskSet) -> None:
        self.sessions = sum(len(c.sessions) for c in tasks.conversations)
        self.counts: Counter[str] = Counter()
        self.indexing: set[str] = set()
        self.judge_calls = 0

    def add(self, conv_id: str, event: str) -> None:
        self.counts[event] += 1
        if event == "indexing":
            self.indexing.add(conv_id)
        elif event == "indexed":
            self.indexing.discard(conv_id)

    def line(self) -> str | None:
        c = self.counts
        parts = [f"{c['session']}/{self.sessions} sessions extracted"] if c["session"] else []
        if c["window"]:
            parts.append(f"{c['window']} extraction windows")
        parts += [f"{c[e]} {e}" for e in ("indexed", "restored") if c[e]]
        if self.indexing:
            parts.append("indexing " + ", ".join(sorted(self.indexing)))
        if self.judge_calls:
            parts.append(f"{self.judge_calls} judge calls")
        return " · ".join(parts) or None


def run_eval(
    program: CheckedProgram | Path,
    tasks: TaskSet,
    setup: EvalSetup,
    *,
    jobs: int = 2,
    hit_threshold: float | None = None,
    on_progress: ProgressFn | None = None,
    judge: LLMClient | None = None,
    backend: JobBackend | None = None,
    judge_variant: Variant = "described",
) -> EvalReport:
    """Run every step for every question of ``tasks``, score the retrieved text and, when the
    task model answered, score the answers with the benchmark's own protocol (``judge``: the
    client holding the judge model; None scores without a judge), then each question's
    fitness under the mode this evaluation is in (:meth:`evolve.benches.registry.Bench.fitness`;
    ``judge_variant``: BEAM's rubric variant it reads). Jobs run on ``backend`` (default: the
    local pool with ``jobs`` workers). A ``program`` given as a path is checked first
    (:func:`check_file`)."""
    check_evaluable(tasks)
    started = time.perf_counter()
    if not isinstance(program, CheckedProgram):
        program = check_file(Path(program))
    backend = backend or make_backend("local", jobs)
    if backend.name != "local":  # other machines see the caches by absolute path only
        setup = replace(
            setup,
            cache_dir=str(Path(setup.cache_dir).resolve()),
            calls_log=str(Path(setup.calls_log).resolve()) if setup.calls_log else None,
        )
    tally = WorkerEvents(tasks)
    results = _run_jobs(backend, program, tasks, setup, tally, on_progress)

    embedder = make_embedder(setup.embedder, setup.cache_dir)
    scorer = RetrievalScorer(embedder, *(() if hit_threshold is None else (hit_threshold,)))
    by_id = {q.id: q for q in tasks.questions}
    evidence = tasks.evidence_texts()
    ceilings = question_ceilings(evidence, embedder, Path(setup.cache_dir))
    traces: list[QuestionTrace] = []
    for conv in tasks.conversations:
        result = results[conv.id]
        items = [ScoreInput(by_id[t.id], evidence[t.id], t.retrieved_text) for t in result.traces]
        for trace, item, scores in zip(result.traces, items, scorer.score(items), strict=True):
            if trace.error:  # a failed question scores 0 wherever it has a metric
                scores = {m: (0.0 if v is not None else None) for m, v in scores.items()}
            scores[CEILING_KEY] = ceilings[trace.id]  # what it could have scored, failed or not
            trace.ability, trace.capability = item.question.ability, item.question.capability
            trace.question, trace.scores = item.question.question, scores
            traces.append(trace)

    refused = next((t.error for t in traces if is_spend_cap(t.error)), None)
    if refused:  # the run's caps refused a model call: no report of this evaluation
        raise SpendCapReached(refused)
    check_endpoint(setup)  # the model endpoint went down: no report of this evaluation
    entry = bench(tasks.bench)
    answers = entry.scorer(judge)
    scorer_record = JudgeRecord.model_validate(answers.describe())
    judged = scorer_record.judge is not None
    fit = entry.fitness(None if setup.offline else setup.task_model, judged, judge_variant)
    metrics = [FITNESS_KEY, CEILING_KEY, *METRICS]
    usage = [u for r in results.values() for u in r.usage]
    judged_before = len(judge.records) if judge is not None else 0
    judging = time.perf_counter()
    if not setup.offline:
        metrics += answers.metrics

        def judged_one() -> None:  # progress after each question's judging (any thread)
            if judge is not None and on_progress:
                tally.judge_calls = len(judge.records) - judged_before
                on_progress(0, tally.line())

        _score_answers(answers, entry.scorer(None), traces, by_id, setup.llm_concurrency,
                       judged_one)  # fmt: skip
    judging = time.perf_counter() - judging
    check_endpoint(setup)  # it went down while the answers were judged
    for trace in traces:
        trace.scores[FITNESS_KEY] = fit.question(trace.scores)
    rows = [(by_id[t.id], t.scores) for t in traces]
    summary = ReportScores.model_validate(aggregate(rows, metrics))
    if not setup.offline:
        summary = summary.model_copy(update={"headline": answers.summarize(rows)})
    if judge is not None:
        usage += [asdict(r) for r in judge.records[judged_before:]]
    if setup.diagnose:
        summary = summary.model_copy(update={"diagnostics": diagnostics.summarize(traces)})
    return EvalReport(
        meta=ReportMeta(
            program=program.path,
            program_hash=program.digest,
            fingerprints=program.fingerprints,
            bench=tasks.bench,
            split=tasks.split,
            conversations=len(tasks.conversations),
            questions=len(tasks.questions),
            mode=OFFLINE_MODE if setup.offline else ONLINE_MODE,
            models={
                "task": setup.task_model.model if setup.task_model else None,
                "embedder": embedder.name,
                "judge": scorer_record.judge,
            },  # fmt: skip
            judge=scorer_record,
            fitness=FitnessMode.model_validate(fit.describe()),
            ceiling=CeilingRecord(
                fitness_version=coverage.FITNESS_VERSION,
                budget=coverage.BUDGET,
                overall=summary.overall.ceiling,
            ),
            metrics=metrics,
            hit_threshold=scorer.hit_threshold,
            errors=sum(1 for t in traces if t.error),
            # conversation -> why its built memory could not be stored (rebuilt every time)
            unstored_memory={
                r.conversation_id: r.notes["index_unstored"]
                for r in results.values()
                if "index_unstored" in r.notes
            },
            unjudged=sum(1 for t in traces if UNJUDGED in (t.judged or {})),
            seconds=round(time.perf_counter() - started, 3),
            time=_time_split(results.values(), judging),
        ),
        scores=summary,
        steps=_sum_counters(r.counters for r in results.values()),
        usage=_sum_usage(usage),
        work=_sum_work(results.values()),
        traces=traces,
    )


def check_evaluable(tasks: TaskSet) -> None:
    """Raise EvalError ("nothing was evaluated: ...") when ``tasks`` gives a program nothing to
    remember or nothing to answer."""
    n = len(tasks.conversations)
    where = f"nothing was evaluated: {tasks.bench} {tasks.split} ({n} conversation{'s' * (n != 1)})"
    if not tasks.questions:
        raise EvalError(f"{where} has no questions")
    if not any(c.n_chars for c in tasks.conversations):
        raise EvalError(f"{where} has no message text")


def check_file(path: Path) -> CheckedProgram:
    """Read a program file and run the sandbox on it; EvalError when it cannot be read or does
    not pass (the message is the check's repair text)."""
    try:
        source = path.read_text()
    except OSError as exc:
        raise EvalError(f"cannot read program {path}: {exc.strerror}") from None
    return check_program(source, str(path)).require(lambda why: EvalError(f"{path}: {why}"))


def _run_jobs(
    backend: JobBackend,
    program: CheckedProgram,
    tasks: TaskSet,
    setup: EvalSetup,
    tally: WorkerEvents,
    on_progress: ProgressFn | None,
) -> dict[str, ConversationResult]:
    by_conv = tasks.by_conversation()
    manager = SyncManager()
    manager.start(die_with_parent, (os.getpid(),))
    with manager:
        # workers put (conversation id, event) as they go (where they can reach the queue)
        ticks = manager.Queue() if backend.live_progress else None
        futures: dict[Future[ConversationResult], str] = {}
        for conv in sorted(tasks.conversations, key=lambda c: -c.n_chars):  # longest first
            qs = by_conv[conv.id]
            # the checked program crosses whole: the worker parses nothing
            job = backend.executor.submit(run_conversation, program, conv, qs, setup, ticks)
            futures[job] = conv.id
        results: dict[str, ConversationResult] = {}
        reported: Counter[str] = Counter()

        def drain() -> None:
            while ticks is not None and not ticks.empty():
                conv_id, event = ticks.get()
                tally.add(conv_id, event)
                reported[conv_id] += event == "question"
                if on_progress:
                    on_progress(int(event == "question"), tally.line())

        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            drain()
            check_endpoint(setup)  # the endpoint went down: stop now, not question by question
            for fut in done:
                conv_id = futures[fut]
                try:
                    results[conv_id] = fut.result()
                except Exception as exc:  # the worker died (crash, memory): fail this one only
                    error = f"worker: {type(exc).__name__}: {exc}"
                    results[conv_id] = _failed(conv_id, by_conv[conv_id], error)
                if on_progress:  # questions a crashed worker never reported
                    on_progress(max(0, len(by_conv[conv_id]) - reported[conv_id]), tally.line())
    return results


def _score_answers(
    answers: AnswerScorer,
    unjudged: AnswerScorer,
    traces: list[QuestionTrace],
    by_id: dict[str, Question],
    workers: int,
    after: Callable[[], None],
) -> None:
    """Score every trace's answer, up to ``workers`` questions at once (each judged on its own,
    so the scores are those of one after another; ``unjudged``: the bench's scorer without a
    judge, for a reply that never parses); a failed question counts as an empty answer.
    ``after`` is called once per question when it is scored (from the thread that scored it)."""

    def one(trace: QuestionTrace) -> Judged:
        text = trace.answer if trace.answer is not None and not trace.error else ""
        scored = score_answer(answers, unjudged, by_id[trace.id], text)
        after()
        return scored

    for trace, scored in zip(traces, ordered_map(one, traces, workers), strict=True):
        trace.scores.update(scored.scores)
        trace.judged = scored.detail


def _time_split(results: Any, judging: float) -> dict[str, float]:
    """``meta.time``: the workers' :class:`~evolve.fanout.WallClock` splits summed over
    conversations (``model_wait``, ``sandbox``, ``local``), and ``judging``, the parent's wall
    seconds scoring answers."""
    total = {"model_wait": 0.0, "sandbox": 0.0, "local": 0.0}
    for r in results:
        for k, v in r.time.items():
            total[k] += v
    return {**{k: round(v, 3) for k, v in total.items()}, "judging": round(judging, 3)}


def _failed(conv_id: str, questions: list[Question], error: str) -> ConversationResult:
    traces = [QuestionTrace(id=q.id, conversation_id=conv_id, error=error[:500]) for q in questions]
    return ConversationResult(conv_id, traces, {}, [])


def _sum_counters(all_counters: Any) -> dict[str, dict[str, int]]:
    outcomes = ("computed", "reused", "failed", "skipped", "invalid", "unstored")
    total = {c: dict.fromkeys(outcomes, 0) for c in COMPONENTS}
    for counters in all_counters:
        for step, counts in counters.items():
            for outcome, n in counts.items():
                total[step][outcome] += n
    return total


def _sum_usage(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per role: the :meth:`~evolve.models.usage.Tally.summary` and calls per purpose."""
    out = {role: {**t.summary(), "purposes": {}} for role, t in by_role(records).items()}
    for r in records:
        purposes = out[r["role"]]["purposes"]
        purposes[r["purpose"]] = purposes.get(r["purpose"], 0) + 1
    return out


def _sum_work(results: Any) -> dict[str, Any]:
    """Seconds per step and embedding work, summed over the workers' jobs."""
    seconds: dict[str, float] = {}
    embedding: dict[str, float] = {}
    for r in results:
        for k, v in r.seconds.items():
            seconds[k] = round(seconds.get(k, 0.0) + v, 3)
        for k, v in r.embedding.items():
            embedding[k] = round(embedding.get(k, 0) + v, 3)
    return {"stage_seconds": seconds, "worker_embedding": embedding}


def write_run(report: EvalReport, out_dir: Path) -> Path:
    """Per-question traces as JSONL and the report as JSON, in ``out_dir``; returns the JSONL."""
    out_dir.mkdir(parents=True, exist_ok=True)
    traces = out_dir / "questions.jsonl"
    with traces.open("w", encoding="utf-8") as fh:
        for trace in report.traces:
            fh.write(trace.to_json() + "\n")
    (out_dir / "report.json").write_text(json.dumps(report.as_json(), indent=2))
    return traces
