"""One conversation's evaluation: the pipeline, with step reuse: the worker side of execution.

:func:`run_conversation` runs in a worker process of the executor's pool. It is trusted code:
it holds the embedder, the task LLM and the step store. Evaluation is the
:class:`~evolve.evaluation.pipeline.Pipeline` (the program in its confined host, the task model, the
embedder: the same one a deployment runs) plus the step store plus scoring (done by the
parent). For each step a :class:`ConversationRun` either loads the cached output (keys
from :mod:`evolve.evaluation.stepcache`) or has the pipeline compute it and stores it
(:meth:`ConversationRun._cached_json`, the one cached-step helper). The history is
ingested on its own before the questions (:meth:`ConversationRun.ingest`), and
only when needed: when every retrieval of a conversation is cached, no host is even started,
and when the memory state is cached, its units are never extracted. The memory is built with
the host's incremental operations: ``open``, then per session its units (extracted or reused)
and one ``add``, then ``dump``; the adds share one
:class:`~evolve.evaluation.pipeline.IndexBudget` (the indexing deadline). A question whose
stored retrieval proves bad, or a diagnostic lookup, builds the memory then if ingestion did
not. Each step is the pipeline's own operation: this module decides only what is reused, what
is computed and when (the planning record asked ahead of the question's turn, the extraction
windows of every session at once).

Invariants:
- A cached output is used only if it has its step's shape
(:class:`~evolve.evaluation.stepcache.StepStore`
  checks each read, and a memory state the program cannot restore counts too): a bad entry is
  recomputed, overwritten and counted (``invalid``, besides ``computed``).
- Only successful outputs are stored; a program error, an LLM failure, a dead or hung host
  leaves the store untouched and is recorded in the trace (``error``) and counters
  (``failed``). A memory built but not storable (its state does not pickle) is counted
  (``index``: ``unstored``) and the host's reason kept (``ConversationResult.notes``).
  After the host dies, the conversation's remaining questions fail with the same reason; so
  do they after building the memory failed (an extraction window the task model did not
  answer, a program error in ``index``): the first failure is kept and raised again at once,
  nothing is retried within the conversation.
- LLM outputs are validated once, by the pipeline, against the schemas the host rendered from
  the program (:func:`contract.records.conform`); the host builds records from them without
  checking again, and checks only what the program's own hooks return (:mod:`sandbox.serve`).
- Offline mode (no task model) uses the stand-ins of :mod:`contract.program`: one unit per
  message, the question as the query, no answer (counted as ``skipped``).
- Retrieved text is cut to :data:`~contract.spec.OUT_CHAR_BUDGET`; the trace says when.
- Every step key carries :func:`~evolve.evaluation.identity.pipeline_version` (prompt texts,
  extraction window, truncation, library and embedding-model versions), so a changed pipeline
  reuses nothing.
- The worker runs the :class:`~sandbox.check.CheckedProgram` the executor sent, whole: its
  fingerprints key the steps and its imports start the host; nothing here parses the source.
- ``reuse=False`` (``evolve run --no-reuse``): a conversation reads back only the step outputs
  it computed itself, and task LLM calls skip the response cache; the baseline that
  ``bench/run_reuse.py`` measures step reuse against.
- Scoring is not done here: the parent scores what the worker returns.
- Concurrency (design §2; :mod:`evolve.fanout`): the task-model calls run on up to
  ``setup.llm_concurrency`` threads per pool — all extraction windows of the sessions whose
  units are not stored at once (then units are made and indexed session by session, in order),
  and the questions' chains. Results, traces, counters and the step store equal a sequential
  run's: maps keep item order and raise the first failure in item order; every call into the
  host is made under one lock (the pipeline's), ingestion takes the first turn and each
  question's host section (query, retrieval, diagnostics) the next ones, in question order, so
  the host sees a sequential run's calls in a sequential run's order (only the planning calls
  before the sections and the answer calls after them overlap); a question sharing its plan
  key with an earlier one starts after it.
  Diagnostics are computed for every question whose retrieval succeeded.
- ``ConversationResult.time`` is the conversation's wall time split by
  :class:`~evolve.fanout.WallClock` (model wait, sandbox, local); ``seconds`` are per-step
  exclusive seconds summed over threads (they overlap when calls run side by side).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, TypeVar

from contract.spec import COMPONENTS
from evolve.datasets.types import Conversation, Question, Segment
from evolve.evaluation import prompts
from evolve.evaluation.diagnostics import question_diagnostics
from evolve.evaluation.identity import pipeline_version
from evolve.evaluation.pipeline import IndexBudget, Pipeline, Records
from evolve.evaluation.setup import EvalSetup, make_embedder, make_llm
from evolve.evaluation.stepcache import program_steps
from evolve.fanout import Turns, attempt, ordered_map
from evolve.trace import QuestionTrace
from sandbox.check import CheckedProgram
from sandbox.isolate import HostFailure, ProgramFailure

T = TypeVar("T")


@dataclass
class ConversationResult:
    conversation_id: str
    traces: list[QuestionTrace]
    counters: dict[str, dict[str, int]]
    usage: list[dict[str, Any]]
    seconds: dict[str, float] = field(default_factory=dict)
    embedding: dict[str, float] = field(default_factory=dict)  # the embedder's stats for this job
    time: dict[str, float] = field(default_factory=dict)  # the WallClock split of its wall time
    notes: dict[str, str] = field(default_factory=dict)  # index_unstored: why no state was stored


class ConversationRun:
    """One conversation's evaluation: a :class:`~evolve.evaluation.pipeline.Pipeline` over the
    program, with the step store deciding per step between reuse and computation."""

    def __init__(self, program: CheckedProgram, setup: EvalSetup, conv: Conversation) -> None:
        self.setup = setup
        self.conv = conv
        self.keys, self.store = program_steps(
            setup, program.fingerprints, pipeline_version(), reuse=setup.reuse,
            on_invalid=lambda step: self.count(step, "invalid"),
        )  # fmt: skip
        self.llm = make_llm(setup)
        self.embedder = make_embedder(setup.embedder, setup.cache_dir)
        self.pipeline = Pipeline.for_setup(program, setup, self.llm, self.embedder)
        self.pipeline.on_window = lambda: self.notify("window")
        self.clock = self.pipeline.clock
        self._lock = threading.Lock()  # counters and seconds per step (the pipeline locks the host)
        self._local = threading.local()  # per thread: seconds in nested timed sections
        self.counters = {
            c: {"computed": 0, "reused": 0, "failed": 0, "skipped": 0, "invalid": 0, "unstored": 0}
            for c in COMPONENTS
        }
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)
        self.extract_keys = [self.keys.extract(s.digest()) for s in conv.sessions]
        self.index_key = self.keys.index(self.extract_keys)
        self._memory_ready = False
        self._memory_failure: Exception | None = None  # why building the memory failed, once
        self.notes: dict[str, str] = {}  # what the conversation's report should say
        self.notify: Callable[[str], None] = lambda event: None  # progress (run_conversation)

    def close(self) -> None:
        self.pipeline.close()

    def timed(self, step: str, fn: Callable[[], T]) -> T:
        """Run ``fn``, adding its exclusive time to ``step``: time spent in steps nested inside
        it (retrieval that has to build the memory first) counts for those steps only. Times
        are per thread: steps running side by side add up to more than the wall time."""
        outer_nested = getattr(self._local, "nested", 0.0)
        start, self._local.nested = time.perf_counter(), 0.0
        try:
            return fn()
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self.seconds[step] += elapsed - self._local.nested
            self._local.nested = outer_nested + elapsed

    def count(self, step: str, outcome: str) -> None:
        with self._lock:
            self.counters[step][outcome] += 1

    # -- extraction and indexing (per conversation) -------------------------------------

    def units(self, i: int, records: Callable[[], Records]) -> list[dict[str, Any]]:
        segment, key = self.conv.sessions[i], self.extract_keys[i]
        return list(self._cached_json("extract", key, lambda: self._extract(segment, records())))

    def _prefetch_records(self) -> list[Callable[[], Records]]:
        """Per session, the task model's records (None offline): the windows of every session
        whose units are not stored are extracted now, concurrently, as thunks that give a
        session's records in window order or raise its first window's failure; a session whose
        units are stored gets a thunk that extracts it only if the stored entry proves bad."""
        llm_sessions = [] if self.llm is None else [
            i for i, key in enumerate(self.extract_keys) if not self.store.has("extract", key)
        ]  # fmt: skip
        work = [(i, w) for i in llm_sessions
                for w in prompts.extraction_windows(self.conv.sessions[i])]  # fmt: skip
        done = self.timed("extract", lambda: ordered_map(
            lambda iw: attempt(lambda: self.pipeline.records(iw[1])), work,
            self.setup.llm_concurrency,
        ))  # fmt: skip
        thunks: list[Callable[[], Records]] = []
        for i, segment in enumerate(self.conv.sessions):
            mine = [got for (j, _), got in zip(work, done, strict=True) if j == i]
            wanted = i in llm_sessions
            later = partial(self.pipeline.session_records, segment)
            thunks.append(partial(_joined, mine) if wanted else later)
        return thunks

    def _extract(self, segment: Segment, records: Records) -> list[dict[str, Any]]:
        units = self.pipeline.units(segment, records)
        self.notify("session")
        return units

    def ensure_memory(self) -> None:
        """The host holds the built memory: restored from the store, or built now (and stored).
        A failure to build it is remembered: every later call raises it again at once."""
        if self._memory_ready:
            return
        if self._memory_failure is not None:
            raise self._memory_failure
        try:
            self._build_memory()
        except Exception as exc:
            self._memory_failure = exc
            raise

    def _build_memory(self) -> None:
        data = self.store.get_bytes("index", self.index_key)
        if data is not None:
            try:
                self.pipeline.restore(data)
            except ProgramFailure:  # unreadable, or stored by an incompatible program: rebuild
                self.count("index", "invalid")
            else:
                self._memory_ready = True
                self.count("index", "reused")
                self.notify("restored")
                return
        records = self._prefetch_records()
        self.notify("indexing")
        self._index_call(self.pipeline.open)
        budget = IndexBudget()  # the adds of this build share one indexing deadline
        for i, segment in enumerate(self.conv.sessions):
            units = self.units(i, records[i])
            self._index_call(partial(self.pipeline.add, segment, units, budget))
        dumped = self._index_call(self.pipeline.dump)
        self._memory_ready = True
        self.count("index", "computed")
        self.notify("indexed")
        if dumped.state is not None:
            self.store.put_bytes("index", self.index_key, dumped.state)
        else:  # built, but not storable: every later evaluation rebuilds it; say why
            self.count("index", "unstored")
            self.notes["index_unstored"] = str(dumped.reason)

    def _index_call(self, fn: Callable[[], T]) -> T:
        """One host call of building the memory, timed as ``index`` (failures counted)."""
        try:
            return self.timed("index", fn)
        except Exception:
            self.count("index", "failed")
            raise

    def ingest(self, questions: list[Question]) -> None:
        """The history ingested on its own, before any question's retrieval: the
        memory restored from the store or built (:meth:`ensure_memory`), unless every
        question's retrieval is stored (then nothing is extracted or indexed and no host
        starts). A failure is not raised here: :meth:`ensure_memory` keeps it, and each
        question that needs the memory fails with it."""
        keys = [self.keys.retrieve(self.index_key, self.keys.plan(q.question, q.question_date))
                for q in questions]  # fmt: skip
        if all(self.store.has("retrieve", key) for key in keys):
            return
        try:
            self.ensure_memory()
        except Exception:  # kept by ensure_memory; the questions that need it report it
            return

    def count_untouched(self) -> None:
        """Extraction and indexing never ran because every retrieval was cached: count what the
        store holds for them as reused, so counters say what an evaluation depended on."""
        if self._memory_ready or any(self.counters["index"].values()):
            return
        if self.store.has("index", self.index_key):
            self.count("index", "reused")
        for key in self.extract_keys:
            if self.store.has("extract", key):
                self.count("extract", "reused")

    # -- planning, retrieval, answer (per question) --------------------------------------

    def question(
        self, q: Question, turn: AbstractContextManager[Any] | None = None
    ) -> QuestionTrace:
        """One question's chain. The planning call (when the plan is not stored) runs first,
        outside ``turn``; the program's query and retrieval (and diagnostics) run inside it, so
        the host sees the calls of a sequential run in its order; the answer call runs after."""
        trace = QuestionTrace(id=q.id, conversation_id=q.conversation_id)
        plan_key = self.keys.plan(q.question, q.question_date)
        retrieve_key = self.keys.retrieve(self.index_key, plan_key)
        answer_key = self.keys.answer(retrieve_key, q.posed)
        record = None
        if self.llm is not None and not self.store.has("plan", plan_key):
            record = self.timed("plan", lambda: attempt(
                lambda: self.pipeline.plan_record(q.question, q.question_date)
            ))  # fmt: skip
        step = "plan"
        try:
            with turn or nullcontext():
                query = self._cached_json("plan", plan_key, lambda: self.pipeline.plan(
                    q.question, q.question_date, record))  # fmt: skip
                trace.query = query
                step = "retrieve"
                found = self._cached_json("retrieve", retrieve_key, lambda: self._retrieve(query))
                trace.retrieved, trace.over_budget = found["retrieved"], found["over_budget"]
                trace.raw_chars, trace.retrieve_ms = found["raw_chars"], found.get("retrieve_ms")
                if self.setup.diagnose:
                    self._diagnose(q, trace)
            step = "answer"
            if self.llm is None:
                self.count("answer", "skipped")
            else:
                trace.answer = self._cached_json(
                    "answer", answer_key, lambda: self._answer(q, found["retrieved"])
                )
        except Exception as exc:
            trace.error = f"{step}: {exc}".replace("\n", " ")[:1000]
        return trace

    def _cached_json(self, step: str, key: str, compute: Callable[[], T]) -> T:
        cached = self.store.get_json(step, key)
        if cached is not None:
            self.count(step, "reused")
            return cached  # type: ignore[no-any-return]
        try:
            value = self.timed(step, compute)
        except Exception:
            self.count(step, "failed")
            raise
        self.store.put_json(step, key, value)
        self.count(step, "computed")
        return value

    def _diagnose(self, q: Question, trace: QuestionTrace) -> None:
        """Cold-start diagnostics (:mod:`evolve.evaluation.diagnostics`) into ``trace``."""
        try:
            trace.diagnostics = question_diagnostics(
                q, self.conv, self.stored_units, self.lookup, self.embedder
            )
        except (HostFailure, ProgramFailure) as exc:
            trace.diagnostics_error = str(exc)[:300]

    def stored_units(self, i: int) -> list[dict[str, Any]] | None:
        """Session i's units if the store holds them (not counted as reuse)."""
        units = self.store.get_json("extract", self.extract_keys[i])
        return None if units is None else list(units)

    def lookup(self, text: str) -> str:
        """What retrieval returns when ``text`` is the question, through the program's own
        offline query stand-in (no LLM call); cached like any retrieval, not counted."""
        # "probe:" is the key text stored lookups were filed under (a digest input: kept as is)
        plan_key = self.keys.plan(f"probe:{text}", None)
        key = self.keys.retrieve(self.index_key, plan_key)
        result = self.store.get_json("retrieve", key)
        if result is None:
            result = self._retrieve(self.pipeline.query(text, None, None))
            self.store.put_json("retrieve", key, result)
        return str(result["retrieved"])

    def _retrieve(self, query: dict[str, Any]) -> dict[str, Any]:
        self.ensure_memory()
        got = self.pipeline.retrieve(query)  # its time is the call's, not indexing's
        return {"retrieved": got.text, "over_budget": got.over_budget, "raw_chars": got.raw_chars,
                "retrieve_ms": got.ms}  # fmt: skip

    def _answer(self, q: Question, retrieved: str) -> str:
        return self.pipeline.answer(q.posed, q.question_date, retrieved)


def _joined(parts: list[Callable[[], list[dict[str, Any]]]]) -> Records:
    """One session's records from its windows' outcomes, in window order."""
    return [r for got in parts for r in got()]


def run_conversation(
    program: CheckedProgram,
    conv: Conversation,
    questions: list[Question],
    setup: EvalSetup,
    ticks: Any = None,
) -> ConversationResult:
    """Execute the checked ``program`` over one conversation's questions.

    Runs in a worker process; the program's own code runs in a confined host it starts.
    ``ticks``, when given, is a queue that receives ``(conversation id, event)`` as the work
    goes: ``window`` after each extraction window the task model answered, ``session`` after
    each extracted session, ``indexing`` and ``indexed`` around indexing, ``restored`` when the
    memory came from the step store, ``question`` after each question
    (:data:`evolve.evaluation.executor.EVENTS`).
    The history is ingested first, on its own (:meth:`ConversationRun.ingest`), then
    the questions are asked. Both run on up to ``setup.llm_concurrency`` threads, each host
    section in its turn (ingestion first, then question order), so questions' planning calls
    overlap ingestion; a question that shares its plan key with an earlier one starts after
    that one has finished, so it finds the step outputs a sequential run finds.
    """
    run = ConversationRun(program, setup, conv)
    if ticks is not None:
        run.notify = lambda event: ticks.put((conv.id, event))
    run.embedder.stats.reset()
    turns = Turns()
    finished = [threading.Event() for _ in questions]
    plan_keys = [run.keys.plan(q.question, q.question_date) for q in questions]
    first = {key: k for k, key in reversed(list(enumerate(plan_keys)))}

    def one(k: int) -> QuestionTrace | None:
        """Turn 0 ingests the history (k = -1); question k asks in turn k + 1."""
        if k < 0:
            with turns.turn(0):
                run.ingest(questions)
            return None
        try:
            earlier = first[plan_keys[k]]
            if earlier < k:
                finished[earlier].wait()
            trace = run.question(questions[k], turns.turn(k + 1))
            run.notify("question")
            return trace
        finally:  # also when the question failed before its host section
            turns.pass_turn(k + 1)
            finished[k].set()

    try:
        done = ordered_map(one, range(-1, len(questions)), setup.llm_concurrency)
    finally:
        run.close()
    traces = [t for t in done if t is not None]
    run.count_untouched()
    usage = [asdict(r) for r in run.llm.drain_records()] if run.llm else []
    embedding = asdict(run.embedder.stats)
    return ConversationResult(
        conv.id,
        traces,
        run.counters,
        usage,
        run.seconds,
        embedding,
        run.clock.seconds(),
        run.notes,
    )
