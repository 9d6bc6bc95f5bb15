"""One ``evolve synth`` run: questions written window by window, verified, the kept ones saved.

Owns :class:`Settings`, :class:`Task` (one writing call: a window and a kind), :class:`Report`
(what ``report.json`` holds: :class:`TaskCounts`, :class:`QuestionCounts`, the windows, the
counts of :func:`evolve.synth.report.tally`, the calls), :class:`Outcome` and
:func:`synthesize`. Its workspace is ``DIR/synth/`` (:data:`WORKSPACE`): the call log
``llm-calls.sqlite`` (with the ``--max-usd`` caps beside it), the request cache
``llm-cache.sqlite`` (the caller builds the client on both), the journal
(:mod:`evolve.synth.journal`), ``report.json`` and ``rejected.jsonl`` (every dropped question
with its check and reason).

A run: the history is cut into windows (:mod:`evolve.synth.windows`); each kind is asked of
the plain windows, or of the span windows when its evidence must span sessions; each task
writes its questions (:mod:`evolve.synth.write`) and puts each through checks 1–3 in order
(:mod:`evolve.synth.checks`), tasks side by side on ``jobs`` threads (the client's limiter
bounds the requests in flight); then, in task order, check 4 (duplicates) over the survivors.
The kept questions are written with :func:`evolve.datasets.userformat.write_questions`,
after the folder's own questions (those whose id does not start with ``synth/``, which a run
keeps and never duplicates); earlier synth questions are replaced.

Invariants:

- Deterministic: the tasks, their order, every request and the kept questions (ids, text,
  meta) are functions of the history, the settings and the model's replies; a rerun after a
  kill makes the same requests, every one answered before comes from the request cache, and
  its output is the same as a run never killed.
- A step whose model never gave usable JSON is journaled and replayed as that failure, not
  asked again (its replies are not cached): a failed write leaves its task without questions,
  a failed check drops its question under that check.
- Any other model failure (the spend cap, an endpoint down, a request refused) stops the run:
  no new task starts, tasks in flight end at their next call, and what finished is written
  (questions, report, rejections) with ``Outcome.stopped`` saying why. An unfinished task's
  answered calls are in the cache for the next run.
- Each written question is kept or dropped by exactly one check, the first it fails
  (:func:`evolve.synth.report.tally`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from contract.types import content_digest
from evolve.datasets.types import Conversation, Question
from evolve.datasets.userformat import Dataset, write_questions
from evolve.fanout import ordered_map
from evolve.models.llm import JSONReplyError, LLMClient, LLMError
from evolve.synth import checks
from evolve.synth.journal import Journal
from evolve.synth.kinds import KINDS, Kind
from evolve.synth.report import Rejection, RejectionTally, tally, write_json, write_jsonl
from evolve.synth.windows import Window, choose, cut
from evolve.synth.write import ID_PREFIX, Draft, draft

T = TypeVar("T")
WORKSPACE = "synth"
CALL_LOG = "llm-calls.sqlite"
CACHE = "llm-cache.sqlite"
JOURNAL = "journal.jsonl"
REPORT = "report.json"
REJECTED = "rejected.jsonl"
CALL_COUNTS = ("calls", "cached_calls", "errors", "prompt_tokens", "completion_tokens", "cost_usd")


@dataclass(frozen=True)
class Settings:
    per_window: int = 2  # questions asked per window and kind
    window_chars: int = 6000
    kinds: tuple[str, ...] = tuple(KINDS)
    windows: int | None = None  # at most this many windows of each sort (None: all)
    seed: int = 0  # which windows, when fewer than all
    jobs: int = 4  # tasks side by side


@dataclass(frozen=True)
class Task:
    window: Window
    kind: Kind

    @property
    def id(self) -> str:
        return f"{self.window.id}/{self.kind.name}"


@dataclass
class _Done:
    """A task's result: its drafts with the verdicts of checks 1–3 (up to the first failure)."""

    task: Task
    finished: bool = False
    write_error: str | None = None
    drafts: list[tuple[Draft, list[checks.Verdict]]] = field(default_factory=list)


@dataclass(frozen=True)
class TaskCounts:
    total: int
    finished: int
    write_failed: int  # finished, with no usable reply to the writing call


@dataclass(frozen=True)
class QuestionCounts:
    written: int
    kept: int
    rejected: int
    own: int  # the folder's own questions (not written by synth; kept first)


@dataclass(frozen=True)
class WindowCounts:
    plain: int
    span: int


@dataclass(frozen=True)
class Report:
    """A run's report, written as ``report.json`` (:meth:`as_json`, keys in field order)."""

    model: str | None
    settings: Settings
    windows: WindowCounts
    tasks: TaskCounts
    stopped: str | None
    questions: QuestionCounts
    counts: RejectionTally
    calls: dict[str, float | int]  # the task role's usage (calls, cached calls, tokens, cost)

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "settings": asdict(self.settings),
            "windows": asdict(self.windows),
            "tasks": asdict(self.tasks),
            "stopped": self.stopped,
            "questions": asdict(self.questions),
            "counts": self.counts.as_json(),
            "calls": dict(self.calls),
        }


@dataclass(frozen=True)
class Outcome:
    kept: tuple[Question, ...]
    rejected: tuple[Rejection, ...]
    report: Report
    stopped: str | None  # why the run stopped before every task finished
    resumed: int  # tasks a killed run had finished before this one


class _StepFailed(Exception):
    """A step whose model never gave usable JSON (now or in the journal)."""


def workspace(directory: Path) -> Path:
    return Path(directory) / WORKSPACE


def tasks_of(conversations: tuple[Conversation, ...], settings: Settings) -> list[Task]:
    """The run's tasks in order: each plain window with each one-session kind, then each span
    window with each kind that needs several sessions."""
    plain, spans = cut(conversations, settings.window_chars)
    plain = choose(plain, settings.windows, settings.seed)
    spans = choose(spans, settings.windows, settings.seed)
    kinds = [KINDS[k] for k in settings.kinds]
    return [Task(w, k) for w in plain for k in kinds if k.sessions == 1] + [
        Task(w, k) for w in spans for k in kinds if k.sessions > 1
    ]


def identity(client: LLMClient, conversations: tuple[Conversation, ...], settings: Settings) -> str:
    """What the journal's records hold for: the model, the settings that shape requests, the
    history."""
    config = client.models["task"]
    history = [[c.id, [s.digest() for s in c.sessions]] for c in conversations]
    shaping = {k: v for k, v in asdict(settings).items() if k != "jobs"}
    payload = {"model": config.model_dump() if config else None, "settings": shaping,
               "history": content_digest(history)}  # fmt: skip
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _question_date(conversation: Conversation) -> str | None:
    """When a synth question is asked: the conversation's last session date (after it all)."""
    dates = [s.date for s in conversation.sessions if s.date]
    return dates[-1] if dates else None


def synthesize(
    directory: Path,
    dataset: Dataset,
    client: LLMClient,
    settings: Settings,
    progress: Callable[[Task], None] | None = None,
    started: Callable[[int, int], None] | None = None,
) -> Outcome:
    """Run synth on ``dataset`` (read from ``directory``) with ``client`` (role ``task``,
    logging and caching in :func:`workspace`); ``started(total, resumed)`` is told the number
    of tasks once, ``progress(task)`` each finished one."""
    tasks = tasks_of(dataset.conversations, settings)
    conversations = {c.id: c for c in dataset.conversations}
    journal = Journal(workspace(directory) / JOURNAL,
                      identity(client, dataset.conversations, settings))  # fmt: skip
    resumed = sum(1 for t in tasks if t.id in journal.finished)
    if started is not None:
        started(len(tasks), resumed)
    stop = threading.Event()
    stopped: list[str] = []

    def step(key: str, work: Callable[[], T]) -> T:
        failure = journal.failure(key)
        if failure is not None:
            raise _StepFailed(failure)
        try:
            return work()
        except JSONReplyError as exc:
            journal.failed(key, str(exc))
            raise _StepFailed(str(exc)) from None

    def verify(d: Draft, window: Window) -> tuple[Draft, list[checks.Verdict]]:
        conversation = conversations[d.conversation]
        chars = settings.window_chars
        verdicts: list[checks.Verdict] = []
        d = checks.resolve(d, window)
        try:
            verdicts.append(step(f"unsupported:{d.id}", lambda: checks.support(
                client, d, window, conversation, chars)))  # fmt: skip
            if verdicts[-1].passed:
                verdicts.append(step(f"superseded:{d.id}", lambda: checks.supersede(
                    client, d, conversation, chars)))  # fmt: skip
            if verdicts[-1].passed:
                verdicts.append(step(f"closed-book:{d.id}", lambda: checks.closed_book(client, d)))
        except _StepFailed as exc:
            check = checks.CHECKS[len(verdicts)]
            verdicts.append(checks.Verdict(check, False, f"no usable reply to the check: {exc}"))
        return d, verdicts

    def run(task: Task) -> _Done:
        done = _Done(task)
        if stop.is_set():
            return done
        try:
            try:
                drafts = step(f"write:{task.id}", lambda: draft(
                    client, task.window, task.kind, settings.per_window))  # fmt: skip
            except _StepFailed as exc:
                drafts, done.write_error = [], str(exc)
            for d in drafts:
                done.drafts.append(verify(d, task.window))
        except LLMError as exc:  # the cap, an endpoint down, a refused request: stop the run
            if not stop.is_set():
                stop.set()
                stopped.append(" ".join(str(exc).split()))
            return _Done(task)
        done.finished = True
        journal.done(task.id)
        if progress is not None:
            progress(task)
        return done

    results = ordered_map(run, tasks, settings.jobs)
    kept, rejected = _decide(results, dataset, client)
    own = [q for q in dataset.questions if not q.id.startswith(ID_PREFIX)]
    write_questions(directory, [*own, *kept])
    report = _report(results, kept, rejected, dataset, client, settings, stopped)
    write_json(workspace(directory) / REPORT, report.as_json())
    write_jsonl(workspace(directory) / REJECTED, [asdict(r) for r in rejected])
    return Outcome(tuple(kept), tuple(rejected), report, report.stopped, resumed)


def _decide(
    results: list[_Done], dataset: Dataset, client: LLMClient
) -> tuple[list[Question], list[Rejection]]:
    """Check 4 over the survivors of checks 1–3, in task order; every draft kept or rejected."""
    seen = checks.Seen()
    for q in dataset.questions:
        if not q.id.startswith(ID_PREFIX):
            seen.keep(q.conversation_id, q.id, q.question)
    conversations = {c.id: c for c in dataset.conversations}
    config = client.models["task"]
    model = config.model if config else ""
    kept: list[Question] = []
    rejected: list[Rejection] = []
    for result in results:
        if not result.finished:
            continue
        for d, verdicts in result.drafts:
            if verdicts[-1].passed:
                verdicts = [*verdicts, seen.duplicate(d.conversation, d.question)]
            last = verdicts[-1]
            if not last.passed:
                rejected.append(Rejection(d.id, d.conversation, d.window, d.kind.name,
                                          d.kind.capability, d.question, d.answer, d.evidence,
                                          d.unknown, last.check, last.reason))  # fmt: skip
                continue
            seen.keep(d.conversation, d.id, d.question)
            meta: dict[str, Any] = {"synth": {
                "model": model, "window": d.window, "kind": d.kind.name,
                "verdicts": {v.check: {"passed": v.passed, "reason": v.reason} for v in verdicts},
            }}  # fmt: skip
            if d.unknown:
                meta["synth"]["unknown_evidence"] = list(d.unknown)
            kept.append(Question(
                id=d.id, conversation_id=d.conversation, ability=d.kind.name,
                capability=d.kind.capability, question=d.question, gold=d.answer,
                evidence_ids=d.evidence, meta=meta,
                question_date=_question_date(conversations[d.conversation]),
            ))  # fmt: skip
    return kept, rejected


def _report(
    results: list[_Done],
    kept: list[Question],
    rejected: list[Rejection],
    dataset: Dataset,
    client: LLMClient,
    settings: Settings,
    stopped: list[str],
) -> Report:
    config = client.models["task"]
    windows = {r.task.window.id: r.task.window.span for r in results}
    usage = client.usage_summary().get("task", {})
    own = sum(not q.id.startswith(ID_PREFIX) for q in dataset.questions)
    return Report(
        model=config.model if config else None,
        settings=settings,
        windows=WindowCounts(
            plain=sum(1 for s in windows.values() if not s),
            span=sum(1 for s in windows.values() if s),
        ),
        tasks=TaskCounts(
            total=len(results),
            finished=sum(r.finished for r in results),
            write_failed=sum(r.finished and r.write_error is not None for r in results),
        ),
        stopped=stopped[0] if stopped else None,
        questions=QuestionCounts(
            written=len(kept) + len(rejected), kept=len(kept), rejected=len(rejected), own=own
        ),
        counts=tally(((q.capability, q.ability) for q in kept), rejected),
        calls={k: usage.get(k, 0) for k in CALL_COUNTS},
    )
