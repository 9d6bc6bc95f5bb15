"""One conversation through the five stages, with stage reuse: the worker side of execution.

:func:`run_conversation` runs in a worker process of the executor's pool. It is trusted code:
it holds the embedder, the task LLM and the stage store. The candidate program's own code (its
module top level, hooks and ``Memory`` methods) runs only in a confined
:class:`~sandbox.isolate.Host` started for the conversation; a :class:`ConversationSession`
sends it data, answers its backend requests (:mod:`evolve.backend_service`), sends the task
model the prompts of :mod:`evolve.prompts` and stores what comes back. For each stage the
session either loads the cached output (keys from :mod:`evolve.stagecache`) or computes it and
stores it (:meth:`ConversationSession._cached_json`, the one cached-stage helper). Outputs are
computed lazily: when every retrieval result of a conversation is cached, no host is even
started, and when the memory state is cached, its units are never extracted.

Invariants:
- A cached output is used only if it has its stage's shape (:class:`~evolve.stagecache.StageStore`
  checks each read, and a memory state the program cannot restore counts too): a bad entry is
  recomputed, overwritten and counted (``invalid``, besides ``computed``).
- Only successful outputs are stored; a program error, an LLM failure, a dead or hung host or
  an unpicklable memory leaves the store untouched and is recorded in the trace (``error``)
  and counters (``failed``). After the host dies, the conversation's remaining questions fail
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
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from contract.records import conform
from contract.spec import COMPONENTS, CONTRACT_VERSION, OUT_CHAR_BUDGET
from evolve import prompts
from evolve.backend_service import BackendService
from evolve.datasets.types import Conversation, Question, Segment
from evolve.diagnostics import question_diagnostics
from evolve.models.embed import EMBEDDING_LIBRARIES, Embedder, library_versions, precision
from evolve.stagecache import StageKeys, StageStore
from evolve.trace import QuestionTrace
from evolve.worker import WorkerConfig, make_embedder, make_llm
from sandbox.fingerprint import fingerprints
from sandbox.isolate import Host, HostFailure, Limits, ProgramFailure

T = TypeVar("T")
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


class ConversationSession:
    """One conversation's execution through the five stages: the parent side of one program
    host, with the stage store deciding per stage between reuse and computation."""

    def __init__(self, source: str, path: str, config: WorkerConfig, conv: Conversation) -> None:
        self.source = source
        self.path = path
        self.config = config
        self.conv = conv
        self.store = StageStore(Path(config.cache_dir) / "stages", reuse=config.reuse,
                                on_invalid=lambda stage: self.count(stage, "invalid"))  # fmt: skip
        self.keys = StageKeys(
            fingerprints(source), config.model_sig, config.embedder, evaluator_version()
        )
        self.llm = make_llm(config)
        self.embedder = make_embedder(config.embedder, config.cache_dir)
        self.service = BackendService(
            self.embedder, self.llm, config.call_prefix, config.max_complete_calls
        )
        self.counters = {
            c: {"computed": 0, "reused": 0, "failed": 0, "skipped": 0, "invalid": 0}
            for c in COMPONENTS
        }
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)
        self.extract_keys = [self.keys.extract(s.digest()) for s in conv.sessions]
        self.index_key = self.keys.index(self.extract_keys)
        self._host: Host | None = None
        self._host_error: str | None = None
        self._schemas: dict[str, Any] = {}
        self._memory_ready = False
        self._nested = 0.0  # seconds spent in nested timed sections (see timed)
        self.notify: Callable[[str], None] = lambda event: None  # progress (run_conversation)

    # -- the host ------------------------------------------------------------------------

    def host(self) -> Host:
        """The program's host, started and loaded on first use; one per conversation."""
        if self._host_error:
            raise HostFailure(self._host_error)
        if self._host is None:
            try:
                self._host = Host(EVAL_LIMITS, serve=self.service)
                self._host.call("load", {"source": self.source, "path": self.path})
                self._schemas, _ = self._host.call("schema")
            except (HostFailure, ProgramFailure) as exc:
                self._host_error = f"program host: {exc}"
                self.close()
                raise HostFailure(self._host_error) from None
        return self._host

    def call(
        self,
        op: str,
        payload: dict[str, Any],
        blobs: list[bytes] | None = None,
        timeout: float | None = None,
    ) -> tuple[Any, list[bytes]]:
        host = self.host()
        self.service.calls = 0
        try:
            return host.call(op, payload, blobs, timeout=timeout)
        except HostFailure as exc:  # the host is gone: every later step fails the same way
            self._host_error = f"program host: {exc}"
            self.close()
            raise

    def schema(self, name: str) -> dict[str, Any]:
        self.host()
        return dict(self._schemas[name])

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None

    def timed(self, stage: str, fn: Callable[[], T]) -> T:
        """Run ``fn``, adding its exclusive time to ``stage``: time spent in stages nested inside
        it (retrieval that has to build the memory first) counts for those stages only."""
        start, outer_nested, self._nested = time.perf_counter(), self._nested, 0.0
        try:
            return fn()
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[stage] += elapsed - self._nested
            self._nested = outer_nested + elapsed

    def count(self, stage: str, outcome: str) -> None:
        self.counters[stage][outcome] += 1

    # -- extraction and indexing (per conversation) -------------------------------------

    def units(self, i: int) -> list[dict[str, Any]]:
        segment, key = self.conv.sessions[i], self.extract_keys[i]
        return list(self._cached_json("extract", key, lambda: self._extract(segment)))

    def _extract(self, segment: Segment) -> list[dict[str, Any]]:
        records = None
        if self.llm is not None:
            windows = prompts.extraction_windows(segment)
            records = []
            for window in windows:
                records += self._extract_llm(window)
                self.notify("window")
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

        prompt = prompts.extraction_prompt(self.source, wrapper, window)
        return self.llm.complete_json(
            "task", f"{self.config.call_prefix}/extract", prompt, wrapper, validate
        )

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
        all_units = [self.units(i) for i in range(len(self.conv.sessions))]
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

    def question(self, q: Question) -> QuestionTrace:
        trace = QuestionTrace(id=q.id, conversation_id=q.conversation_id)
        plan_key = self.keys.plan(q.question, q.question_date)
        retrieve_key = self.keys.retrieve(self.index_key, plan_key)
        answer_key = self.keys.answer(retrieve_key, q.posed)
        stage = "plan"
        try:
            query = self._cached_json("plan", plan_key, lambda: self._plan(q))
            trace.query = query
            stage = "retrieve"
            found = self._cached_json("retrieve", retrieve_key, lambda: self._retrieve(query))
            trace.retrieved, trace.over_budget = found["retrieved"], found["over_budget"]
            trace.raw_chars, trace.retrieve_ms = found["raw_chars"], found.get("retrieve_ms")
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

    def _plan(self, q: Question) -> dict[str, Any]:
        record = None
        if self.llm is not None:
            schema = self.schema("Query")
            prompt = prompts.planning_prompt(self.source, schema, q)
            record = self.llm.complete_json(
                "task",
                f"{self.config.call_prefix}/plan",
                prompt,
                schema,
                lambda d: conform(schema, d),
            )
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
        prompt = prompts.answer_prompt(self.source, retrieved, q)
        return self.llm.complete("task", f"{self.config.call_prefix}/answer", prompt).text


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
    """
    run = ConversationSession(source, path, config, conv)
    if ticks is not None:
        run.notify = lambda event: ticks.put((conv.id, event))
    run.embedder.stats.reset()
    traces: list[QuestionTrace] = []
    try:
        for q in questions:
            traces.append(run.question(q))
            if config.diagnose and not traces[-1].error:
                try:
                    traces[-1].diagnostics = question_diagnostics(
                        q, conv, run.stored_units, run.probe, run.embedder
                    )
                except (HostFailure, ProgramFailure) as exc:
                    traces[-1].diagnostics_error = str(exc)[:300]
            run.notify("question")
    finally:
        run.close()
    run.count_untouched()
    usage = [asdict(r) for r in run.llm.drain_records()] if run.llm else []
    embedding = asdict(run.embedder.stats)
    return ConversationResult(conv.id, traces, run.counters, usage, run.seconds, embedding)


def evaluator_version() -> str:
    """A digest of what the evaluator contributes to stage outputs: EVALUATOR_VERSION, the
    contract version, the prompt texts and extraction window (:func:`evolve.prompts.texts`),
    the truncation rule and budget, the embedding model, its precision and the installed
    versions of OUTPUT_LIBRARIES."""
    versions = library_versions(OUTPUT_LIBRARIES)
    parts = [EVALUATOR_VERSION, CONTRACT_VERSION, *prompts.texts(), TRUNCATION, OUT_CHAR_BUDGET,
             Embedder.name, Embedder.dim, versions, precision()]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
