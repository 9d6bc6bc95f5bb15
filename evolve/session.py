"""One conversation through the five stages, with stage reuse: the worker side of execution.

:func:`run_conversation` runs in a worker process of the executor's pool. It is trusted code:
it holds the embedder, the task LLM and the stage store. The candidate program's own code (its
module top level, hooks and ``Memory`` methods) runs only in a confined
:class:`~sandbox.isolate.Host` started for the conversation; a :class:`ConversationSession`
sends it data, answers its backend requests (:mod:`evolve.backend_service`), sends the task
model the prompts of :mod:`evolve.prompts` and stores what comes back. For each stage the
session either loads the cached output (keys from :mod:`evolve.stagecache`) or computes it and
stores it (:meth:`ConversationSession._cached_json`, the one cached-stage helper). Outputs are
computed lazily: when every retrieval and answer of a conversation is cached, no host is even
started, and when the memory state is cached, its units are never extracted. The task-model
prompts carry the instructions the loaded program holds, as its host reports them at load.

Invariants:
- A cached output is used only if it has its stage's shape (:class:`~evolve.stagecache.StageStore`
  checks each read, and a memory state the program cannot restore counts too): a bad entry is
  recomputed, overwritten and counted (``invalid``, besides ``computed``).
- Only successful outputs are stored; a program error, an LLM failure, a dead or hung host
  leaves the store untouched and is recorded in the trace (``error``) and counters
  (``failed``). A memory built but not storable (its state does not pickle) is counted
  (``index``: ``unstored``) and the host's reason kept (``ConversationResult.notes``).
  After the host dies, the conversation's remaining questions fail
  with the same reason.
- LLM outputs are validated once, here, against the schemas the host rendered from the program
  (:func:`contract.records.conform`); the host builds records from them without checking again,
  and checks only what the program's own hooks return (:mod:`sandbox.serve`).
- Offline mode (no task model) uses the stand-ins of :mod:`contract.program`: one unit per
  message, the question as the query, no answer (counted as ``skipped``).
- Retrieved text is cut to :data:`~contract.spec.OUT_CHAR_BUDGET`; the trace says when.
- Every stage key carries :func:`evaluator_version` (prompt texts, extraction window,
  truncation, library and embedding-model versions), so a changed evaluator reuses nothing.
- ``reuse=False`` (``evolve run --no-reuse``): a conversation reads back only the stage outputs
  it computed itself, and task LLM calls skip the response cache; the baseline that
  ``bench/run_reuse.py`` measures stage reuse against.
- Scoring is not done here: the parent scores what the worker returns.
- Concurrency (design §2; :mod:`evolve.fanout`): the task-model calls run on up to
  ``config.llm_concurrency`` threads per pool — all extraction windows of the sessions whose
  units are not stored at once (then units are made and indexed session by session, in order),
  and the questions' chains. Results, traces, counters and the stage store equal a sequential
  run's: maps keep item order and raise the first failure in item order; every call into the
  host is made under one lock, and each question's host section (query, retrieval, building the
  memory, diagnostics) in its turn, in question order, so the host sees a sequential run's
  calls in a sequential run's order (only the planning call before the section and the answer
  call after it overlap); a question sharing its plan key with an earlier one starts after it.
  Diagnostics are computed for every question whose retrieval succeeded.
- ``ConversationResult.time`` is the conversation's wall time split by
  :class:`~evolve.fanout.WallClock` (model wait, sandbox, local); ``seconds`` are per-stage
  exclusive seconds summed over threads (they overlap when calls run side by side).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from contract.records import conform
from contract.spec import COMPONENTS, CONTRACT_VERSION, OUT_CHAR_BUDGET
from contract.types import ContractError
from evolve import prompts
from evolve.backend_service import BackendService
from evolve.datasets.types import Conversation, Question, Segment
from evolve.diagnostics import question_diagnostics
from evolve.fanout import Turns, WallClock, attempt, ordered_map
from evolve.models.embed import EMBEDDING_LIBRARIES, Embedder, library_versions, precision
from evolve.stagecache import StageKeys, StageStore
from evolve.trace import QuestionTrace
from evolve.worker import WorkerConfig, make_embedder, make_llm
from sandbox.fingerprint import fingerprints
from sandbox.isolate import Host, HostFailure, Limits, ProgramFailure

T = TypeVar("T")
Records = list[dict[str, Any]] | None  # the task model's unit records for a session (None offline)
EVAL_LIMITS = Limits(cpu_seconds=3600, memory_mb=6144, call_seconds=600.0)
INDEX_SECONDS = 120.0  # indexing a conversation: this much plus ...
INDEX_SECONDS_PER_UNIT = 0.25  # ... this much per unit
# What the evaluator itself contributes to stage outputs, folded into every stage key by
# evaluator_version(): bump EVALUATOR_VERSION whenever a change here, in the host or in the
# offline stand-ins changes what a stage outputs for the same program and data.
EVALUATOR_VERSION = "1"
TRUNCATION = "prefix"  # retrieved text keeps its first OUT_CHAR_BUDGET characters
# Installed distributions whose versions can change a stage's output (numerics, tokenising,
# the embedding model's weights and code).
OUTPUT_LIBRARIES = ("prismem", "bm25s", "PyStemmer", *EMBEDDING_LIBRARIES)


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


class ConversationSession:
    """One conversation's execution through the five stages: the parent side of one program
    host, with the stage store deciding per stage between reuse and computation."""

    def __init__(self, source: str, path: str, config: WorkerConfig, conv: Conversation) -> None:
        self.source = source
        self.path = path
        self.config = config
        self.conv = conv
        version = evaluator_version()
        self.store = StageStore(Path(config.cache_dir) / "stages", version=version,
                                reuse=config.reuse,
                                on_invalid=lambda stage: self.count(stage, "invalid"))  # fmt: skip
        self.keys = StageKeys(fingerprints(source), config.model_sig, config.embedder, version)
        self.llm = make_llm(config)
        self.embedder = make_embedder(config.embedder, config.cache_dir)
        self.service = BackendService(
            self.embedder, self.llm, config.call_prefix, config.max_complete_calls
        )
        self.clock = WallClock()
        self._lock = threading.RLock()  # the host (start, calls), counters and stage seconds
        self._local = threading.local()  # per thread: seconds in nested timed sections
        self.counters = {
            c: {"computed": 0, "reused": 0, "failed": 0, "skipped": 0, "invalid": 0, "unstored": 0}
            for c in COMPONENTS
        }
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)
        self.extract_keys = [self.keys.extract(s.digest()) for s in conv.sessions]
        self.index_key = self.keys.index(self.extract_keys)
        self._host: Host | None = None
        self._host_error: str | None = None
        self._schemas: dict[str, Any] = {}
        self._instructions: dict[str, str] = {}  # component -> the value the program holds
        self._memory_ready = False
        self.notes: dict[str, str] = {}  # what the conversation's report should say
        self.notify: Callable[[str], None] = lambda event: None  # progress (run_conversation)

    # -- the host ------------------------------------------------------------------------

    def host(self) -> Host:
        """The program's host, started and loaded on first use; one per conversation."""
        with self._lock:
            if self._host_error:
                raise HostFailure(self._host_error)
            if self._host is None:
                try:
                    with self.clock.during("sandbox"):
                        self._host = Host(EVAL_LIMITS, serve=self._serve)
                        loaded, _ = self._host.call(
                            "load", {"source": self.source, "path": self.path}
                        )
                        self._instructions = prompts.reported_instructions(loaded)
                        self._schemas, _ = self._host.call("schema")
                except (HostFailure, ProgramFailure, ContractError) as exc:
                    self._host_error = f"program host: {exc}"
                    self.close()
                    raise HostFailure(self._host_error) from None
            return self._host

    def _serve(
        self, header: dict[str, Any], blobs: list[bytes]
    ) -> tuple[dict[str, Any], list[bytes]]:
        """The host's backend requests, timed: a completion as model wait, the rest as local."""
        with self.clock.during("model" if header.get("method") == "complete" else "local"):
            return self.service(header, blobs)

    def call(
        self,
        op: str,
        payload: dict[str, Any],
        blobs: list[bytes] | None = None,
        timeout: float | None = None,
    ) -> tuple[Any, list[bytes]]:
        with self._lock:
            host = self.host()
            self.service.calls = 0
            try:
                with self.clock.during("sandbox"):
                    return host.call(op, payload, blobs, timeout=timeout)
            except HostFailure as exc:  # the host is gone: every later step fails the same way
                self._host_error = f"program host: {exc}"
                self.close()
                raise

    def schema(self, name: str) -> dict[str, Any]:
        self.host()
        return dict(self._schemas[name])

    def instruction(self, component: str) -> str:
        """The instruction of ``component`` as the loaded program holds it (the host reports
        it at load; :func:`evolve.prompts.reported_instructions` checks the report)."""
        self.host()
        return self._instructions[component]

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None

    def timed(self, stage: str, fn: Callable[[], T]) -> T:
        """Run ``fn``, adding its exclusive time to ``stage``: time spent in stages nested inside
        it (retrieval that has to build the memory first) counts for those stages only. Times
        are per thread: stages running side by side add up to more than the wall time."""
        outer_nested = getattr(self._local, "nested", 0.0)
        start, self._local.nested = time.perf_counter(), 0.0
        try:
            return fn()
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self.seconds[stage] += elapsed - self._local.nested
            self._local.nested = outer_nested + elapsed

    def model(self, fn: Callable[[], T]) -> T:
        """A task-model call, counted as model wait on the clock."""
        with self.clock.during("model"):
            return fn()

    def count(self, stage: str, outcome: str) -> None:
        with self._lock:
            self.counters[stage][outcome] += 1

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
            lambda iw: attempt(lambda: self._extract_llm(iw[1])), work, self.config.llm_concurrency
        ))  # fmt: skip
        thunks: list[Callable[[], Records]] = []
        for i, segment in enumerate(self.conv.sessions):
            mine = [got for (j, _), got in zip(work, done, strict=True) if j == i]
            wanted = i in llm_sessions
            thunks.append(partial(_joined, mine) if wanted else partial(self._records, segment))
        return thunks

    def _records(self, segment: Segment) -> Records:
        """The task model's records for ``segment``, window after window (None offline)."""
        if self.llm is None:
            return None
        return [r for w in prompts.extraction_windows(segment) for r in self._extract_llm(w)]

    def _extract(self, segment: Segment, records: Records) -> list[dict[str, Any]]:
        units, _ = self.call(
            "units",
            {"segment": asdict(segment), "records": records},
            timeout=self.config.step_seconds,
        )
        self.notify("session")
        return list(units)

    def _extract_llm(self, window: Segment) -> list[dict[str, Any]]:
        assert self.llm is not None
        schema = self.schema("MemoryUnit")
        wrapper = prompts.units_schema(schema)

        def validate(data: Any) -> list[dict[str, Any]]:
            if not isinstance(data, dict) or not isinstance(data.get("units"), list):
                raise ValueError('expected {"units": [...]}')
            return [conform(schema, u) for u in data["units"]]

        prompt = prompts.extraction_prompt(self.instruction("extract"), wrapper, window)
        stage, llm = f"{self.config.call_prefix}/extract", self.llm
        records = self.model(lambda: llm.complete_json("task", stage, prompt, wrapper, validate))
        self.notify("window")
        return records

    def ensure_memory(self) -> None:
        """The host holds the built memory: restored from the store, or indexed now (and stored)."""
        if self._memory_ready:
            return
        limits = {"dim": self.embedder.dim, "max_complete_calls": self.config.max_complete_calls}
        data = self.store.get_bytes("index", self.index_key)
        if data is not None:
            try:
                self.call("restore", limits, [data], timeout=self.config.step_seconds)
            except ProgramFailure:  # unreadable, or stored by an incompatible program: rebuild
                self.count("index", "invalid")
            else:
                self._memory_ready = True
                self.count("index", "reused")
                self.notify("restored")
                return
        records = self._prefetch_records()
        all_units = [self.units(i, records[i]) for i in range(len(self.conv.sessions))]
        payload = {
            **limits,
            "segments": [asdict(s) for s in self.conv.sessions],
            "units": all_units,
        }
        timeout = INDEX_SECONDS + INDEX_SECONDS_PER_UNIT * sum(len(u) for u in all_units)
        self.notify("indexing")
        try:
            result, blobs = self.timed(
                "index", lambda: self.call("index", payload, timeout=timeout)
            )
        except Exception:
            self.count("index", "failed")
            raise
        self._memory_ready = True
        self.count("index", "computed")
        self.notify("indexed")
        if isinstance(result, dict) and result.get("stored") and blobs:
            self.store.put_bytes("index", self.index_key, blobs[0])
        else:  # built, but not storable: every later evaluation rebuilds it; say why
            self.count("index", "unstored")
            why = result.get("reason") if isinstance(result, dict) else None
            self.notes["index_unstored"] = str(why or "the host sent no state")[:300]

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
            record = self.timed("plan", lambda: attempt(lambda: self._plan_record(q)))
        stage = "plan"
        try:
            with turn or nullcontext():
                query = self._cached_json("plan", plan_key, lambda: self._plan(q, record))
                trace.query = query
                stage = "retrieve"
                found = self._cached_json("retrieve", retrieve_key, lambda: self._retrieve(query))
                trace.retrieved, trace.over_budget = found["retrieved"], found["over_budget"]
                trace.raw_chars, trace.retrieve_ms = found["raw_chars"], found.get("retrieve_ms")
                if self.config.diagnose:
                    self._diagnose(q, trace)
            stage = "answer"
            if self.llm is None:
                self.count("answer", "skipped")
            else:
                trace.answer = self._cached_json(
                    "answer", answer_key, lambda: self._answer(q, found["retrieved"])
                )
        except Exception as exc:
            trace.error = f"{stage}: {exc}".replace("\n", " ")[:1000]
        return trace

    def _cached_json(self, stage: str, key: str, compute: Callable[[], T]) -> T:
        cached = self.store.get_json(stage, key)
        if cached is not None:
            self.count(stage, "reused")
            return cached  # type: ignore[no-any-return]
        try:
            value = self.timed(stage, compute)
        except Exception:
            self.count(stage, "failed")
            raise
        self.store.put_json(stage, key, value)
        self.count(stage, "computed")
        return value

    def _diagnose(self, q: Question, trace: QuestionTrace) -> None:
        """Cold-start diagnostics (:mod:`evolve.diagnostics`) into ``trace``."""
        try:
            trace.diagnostics = question_diagnostics(
                q, self.conv, self.stored_units, self.probe, self.embedder
            )
        except (HostFailure, ProgramFailure) as exc:
            trace.diagnostics_error = str(exc)[:300]

    def _plan_record(self, q: Question) -> dict[str, Any]:
        """The task model's Query record for ``q``."""
        assert self.llm is not None
        schema, llm = self.schema("Query"), self.llm
        prompt = prompts.planning_prompt(self.instruction("plan"), schema, q)
        stage = f"{self.config.call_prefix}/plan"
        return self.model(
            lambda: llm.complete_json("task", stage, prompt, schema, lambda d: conform(schema, d))
        )

    def _plan(self, q: Question, prefetched: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
        """The program's query for ``q`` from the task model's record (``prefetched``, or asked
        now); the host is checked first, as a sequential run would find it."""
        record = None
        if self.llm is not None:
            self.schema("Query")
            record = prefetched() if prefetched is not None else self._plan_record(q)
        payload = {"question": q.question, "date": q.question_date, "record": record}
        query, _ = self.call("query", payload, timeout=self.config.step_seconds)
        if not isinstance(query, dict):
            raise HostFailure("program host: a query must come back as a record")
        return query

    def stored_units(self, i: int) -> list[dict[str, Any]] | None:
        """Session i's units if the store holds them (not counted as reuse)."""
        units = self.store.get_json("extract", self.extract_keys[i])
        return None if units is None else list(units)

    def probe(self, text: str) -> str:
        """What retrieval returns when ``text`` is the question, through the program's own
        offline query stand-in (no LLM call); cached like any retrieval, not counted."""
        plan_key = self.keys.plan(f"probe:{text}", None)
        key = self.keys.retrieve(self.index_key, plan_key)
        result = self.store.get_json("retrieve", key)
        if result is None:
            payload = {"question": text, "date": None, "record": None}
            query, _ = self.call("query", payload, timeout=self.config.step_seconds)
            result = self._retrieve(query)
            self.store.put_json("retrieve", key, result)
        return str(result["retrieved"])

    def _retrieve(self, query: dict[str, Any]) -> dict[str, Any]:
        self.ensure_memory()
        began = time.perf_counter()
        result, _ = self.call("retrieve", {"query": query}, timeout=self.config.step_seconds)
        elapsed_ms = round((time.perf_counter() - began) * 1000, 3)  # the call, not indexing
        if not (isinstance(result, dict) and isinstance(result.get("text"), str)
                and isinstance(result.get("raw_chars"), int)):  # fmt: skip
            raise HostFailure("program host: retrieval must come back as text")
        text, raw = result["text"][:OUT_CHAR_BUDGET], result["raw_chars"]
        return {"retrieved": text, "over_budget": raw > OUT_CHAR_BUDGET, "raw_chars": raw,
                "retrieve_ms": elapsed_ms}  # fmt: skip

    def _answer(self, q: Question, retrieved: str) -> str:
        assert self.llm is not None
        instruction, llm = self.instruction("answer"), self.llm
        prompt = prompts.answer_prompt(instruction, retrieved, q)
        stage = f"{self.config.call_prefix}/answer"
        return self.model(lambda: llm.complete("task", stage, prompt).text)


def _joined(parts: list[Callable[[], list[dict[str, Any]]]]) -> Records:
    """One session's records from its windows' outcomes, in window order."""
    return [r for got in parts for r in got()]


def run_conversation(
    source: str,
    path: str,
    conv: Conversation,
    questions: list[Question],
    config: WorkerConfig,
    ticks: Any = None,
) -> ConversationResult:
    """Execute one program over one conversation's questions.

    Runs in a worker process; the program's own code runs in a confined host it starts.
    ``ticks``, when given, is a queue that receives ``(conversation id, event)`` as the work
    goes: ``window`` after each extraction window the task model answered, ``session`` after
    each extracted session, ``indexing`` and ``indexed`` around indexing, ``restored`` when the
    memory came from the stage store, ``question`` after each question
    (:data:`evolve.executor.EVENTS`).
    Questions run on up to ``config.llm_concurrency`` threads, each host section in its turn
    (question order); a question that shares its plan key with an earlier one starts after
    that one has finished, so it finds the stage outputs a sequential run finds.
    """
    run = ConversationSession(source, path, config, conv)
    if ticks is not None:
        run.notify = lambda event: ticks.put((conv.id, event))
    run.embedder.stats.reset()
    turns = Turns()
    finished = [threading.Event() for _ in questions]
    plan_keys = [run.keys.plan(q.question, q.question_date) for q in questions]
    first = {key: k for k, key in reversed(list(enumerate(plan_keys)))}

    def one(k: int) -> QuestionTrace:
        try:
            earlier = first[plan_keys[k]]
            if earlier < k:
                finished[earlier].wait()
            trace = run.question(questions[k], turns.turn(k))
            run.notify("question")
            return trace
        finally:  # also when the question failed before its host section
            turns.pass_turn(k)
            finished[k].set()

    try:
        traces = ordered_map(one, range(len(questions)), config.llm_concurrency)
    finally:
        run.close()
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


def evaluator_version() -> str:
    """A digest of what the evaluator contributes to stage outputs: EVALUATOR_VERSION, the
    contract version, the prompt texts and extraction window (:func:`evolve.prompts.texts`),
    the truncation rule and budget, the embedding model, its precision and the installed
    versions of OUTPUT_LIBRARIES."""
    versions = library_versions(OUTPUT_LIBRARIES)
    parts = [EVALUATOR_VERSION, CONTRACT_VERSION, *prompts.texts(), TRUNCATION, OUT_CHAR_BUDGET,
             Embedder.name, Embedder.dim, versions, precision()]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
