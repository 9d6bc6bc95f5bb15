"""The worker side of execution: one conversation through the five stages, with stage reuse.

:func:`run_conversation` runs in a worker process of the executor's pool. It is trusted code:
it holds the embedder, the task LLM and the stage store. The candidate program's own code (its
module top level, hooks and ``Memory`` methods) runs only in a confined
:class:`~sandbox.isolate.Host` started for the conversation; the worker sends it data, answers
its backend requests (:class:`BackendService`) and stores what it returns. For each stage the
worker either loads the cached output (keys from :mod:`evolve.stagecache`) or computes it and
stores it. Outputs are computed lazily: when every retrieval result of a conversation is cached,
no host is even started, and when the memory state is cached, its units are never extracted.

Invariants:
- A cached output is used only if it has its stage's shape (:class:`~evolve.stagecache.StageStore`
  checks each read, and a memory state the program cannot restore counts too): a bad entry is
  recomputed, overwritten and counted (``invalid``, besides ``computed``).
- Only successful outputs are stored; a program error, an LLM failure, a dead or hung host or
  an unpicklable memory leaves the store untouched and is recorded in the trace (``error``)
  and counters (``failed``). After the host dies, the conversation's remaining questions fail
  with the same reason.
- LLM outputs are validated here against the schemas the host rendered from the program
  (:func:`contract.records.conform`), then again in the host when they become records.
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

import ast
import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from contract.records import conform
from contract.spec import COMPONENTS, CONTRACT_VERSION, INSTRUCTIONS, OUT_CHAR_BUDGET
from contract.types import BackendError, ContractError, Segment
from evolve.datasets.types import Conversation, Question
from evolve.diagnostics import question_diagnostics
from evolve.models.embed import EMBEDDING_LIBRARIES, Embedder, HashingEmbedder, library_versions
from evolve.models.llm import LLMClient, ModelConfig, Models
from evolve.models.testing import ScriptedLLM
from evolve.stagecache import StageKeys, StageStore
from sandbox.fingerprint import fingerprints
from sandbox.isolate import Host, HostFailure, Limits, ProgramFailure
from sandbox.wire import pack_array

T = TypeVar("T")
EXTRACT_WINDOW_CHARS = 24_000  # one extraction call sees at most this much of a session
EVAL_LIMITS = Limits(cpu_seconds=3600, memory_mb=6144, call_seconds=600.0)
INDEX_SECONDS = 120.0  # indexing a conversation: this much plus ...
INDEX_SECONDS_PER_UNIT = 0.25  # ... this much per unit
MAX_EMBED_TEXTS = 200_000
# What the evaluator itself contributes to stage outputs, folded into every stage key by
# evaluator_version(): bump EVALUATOR_VERSION whenever a change here, in the host or in the
# offline stand-ins changes what a stage outputs for the same program and data.
EVALUATOR_VERSION = "1"
SCHEMA_PROMPT = "{instruction}\n\nReply with one JSON object matching this schema:\n{schema}\n\n"
EXTRACT_PROMPT = SCHEMA_PROMPT + "{window}"
PLAN_PROMPT = SCHEMA_PROMPT + "Question: {question}{when}"
PLAN_DATE = "\nThe question is asked on {date}."
ANSWER_PROMPT = (
    "{instruction}\n\nRetrieved memories:\n{retrieved}\n\n{today}Question: {question}\nAnswer:"
)
ANSWER_DATE = "Today is {date}.\n"
TRUNCATION = "prefix"  # retrieved text keeps its first OUT_CHAR_BUDGET characters
# Installed distributions whose versions can change a stage's output (numerics, tokenising,
# the embedding model's weights and code).
OUTPUT_LIBRARIES = ("prismem", "bm25s", "PyStemmer", *EMBEDDING_LIBRARIES)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides the job; picklable."""

    cache_dir: str
    task_model: ModelConfig | None
    embedder: str = "minilm"  # "minilm" or "hashing" (test double, chosen explicitly)
    stage_label: str = "eval"
    max_complete_calls: int = 8
    step_seconds: float = 120.0  # wall clock for one hook or retrieve call in the host
    calls_log: str | None = None  # the LLM call log (default: <cache_dir>/llm-calls.sqlite)
    diagnose: bool = False  # add cold-start diagnostics (evolve.diagnostics) to each trace
    reuse: bool = True  # False: no stage output or task reply of another evaluation is reused
    # Tests only: a picklable ``(role, stage, messages) -> reply`` answering through
    # ScriptedLLM instead of litellm. Never set from the command line.
    script: Callable[..., str] | None = None

    @property
    def offline(self) -> bool:
        return self.task_model is None

    @property
    def model_sig(self) -> str:
        return "offline" if self.task_model is None else self.task_model.model_dump_json()


@dataclass
class ConversationResult:
    conversation_id: str
    traces: list[dict[str, Any]]
    counters: dict[str, dict[str, int]]
    usage: list[dict[str, Any]]
    seconds: dict[str, float] = field(default_factory=dict)
    embedding: dict[str, float] = field(default_factory=dict)  # the embedder's stats for this job


_EMBEDDERS: dict[tuple[str, str], Embedder] = {}


def make_embedder(kind: str, cache_dir: str) -> Embedder:
    """One embedder per process and kind (the model loads lazily, on the first cache miss)."""
    key = (kind, cache_dir)
    if key not in _EMBEDDERS:
        if kind == "hashing":
            _EMBEDDERS[key] = HashingEmbedder()
        elif kind == "minilm":
            _EMBEDDERS[key] = Embedder(cache_path=Path(cache_dir) / "embeddings.sqlite")
        else:
            raise ValueError(f"unknown embedder {kind!r} (use minilm or hashing)")
    return _EMBEDDERS[key]


def make_llm(config: WorkerConfig) -> LLMClient | None:
    if config.task_model is None:
        return None
    root = Path(config.cache_dir)
    log = Path(config.calls_log) if config.calls_log else root / "llm-calls.sqlite"
    cache = root / "llm-cache.sqlite" if config.reuse else None
    models = Models(task=config.task_model)
    if config.script is not None:
        return ScriptedLLM(config.script, models, log_path=log, cache_path=cache)
    return LLMClient(models, log_path=log, cache_path=cache)


class BackendService:
    """The optimizer's side of the program backend: answers the host's ``backend`` frames.

    ``embed`` goes to the embedder (and its cache); ``complete`` to the task LLM, counted under
    role ``task`` and stage ``<label>/memory``, at most ``max_calls`` per host request (the host
    enforces the same budget; this side does not trust it to).
    """

    def __init__(self, embedder: Embedder, llm: LLMClient | None, stage: str, max_calls: int):
        self.embedder = embedder
        self.llm = llm
        self.stage = stage
        self.max_calls = max_calls
        self.calls = 0

    def __call__(
        self, header: dict[str, Any], _blobs: list[bytes]
    ) -> tuple[dict[str, Any], list[bytes]]:
        method = header.get("method")
        if method == "embed":
            texts = header.get("texts")
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise TypeError("backend.embed takes a list of strings")
            if len(texts) > MAX_EMBED_TEXTS:
                raise ValueError(f"backend.embed: at most {MAX_EMBED_TEXTS} texts per call")
            meta, blob = pack_array(self.embedder.embed(texts))
            return {"array": meta}, [blob]
        if method == "complete":
            if self.llm is None:
                raise BackendError("backend.complete: no task LLM is configured (offline mode)")
            if self.calls >= self.max_calls:
                raise BackendError(f"backend.complete: budget of {self.max_calls} calls spent")
            self.calls += 1
            reply = self.llm.complete(
                "task",
                f"{self.stage}/memory",
                str(header.get("prompt")),
                max_tokens=min(int(header.get("max_tokens", 256)), 4096),
            )
            return {"text": reply.text}, []
        raise ValueError(f"unknown backend method {method!r}")


class _Run:
    """State of one conversation's execution: the parent side of one program host."""

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
            self.embedder, self.llm, config.stage_label, config.max_complete_calls
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
        cached = self.store.get_json("extract", key)
        if cached is not None:
            self.count("extract", "reused")
            return list(cached)
        try:
            units = self.timed("extract", lambda: self._extract(segment))
        except Exception:
            self.count("extract", "failed")
            raise
        self.store.put_json("extract", key, units)
        self.count("extract", "computed")
        return units

    def _extract(self, segment: Segment) -> list[dict[str, Any]]:
        records = None
        if self.llm is not None:
            windows = extraction_windows(segment)
            records = [r for window in windows for r in self._extract_llm(window)]
        units, _ = self.call(
            "units",
            {"segment": asdict(segment), "records": records},
            timeout=self.config.step_seconds,
        )
        return list(units)

    def _extract_llm(self, window: Segment) -> list[dict[str, Any]]:
        assert self.llm is not None
        schema = self.schema("MemoryUnit")
        wrapper = {
            "type": "object",
            "properties": {"units": {"type": "array", "items": schema}},
            "required": ["units"],
            "additionalProperties": False,
        }
        prompt = EXTRACT_PROMPT.format(
            instruction=_instruction(self.source, INSTRUCTIONS["extract"]),
            schema=json.dumps(wrapper),
            window=window.render(),
        )

        def validate(data: Any) -> list[dict[str, Any]]:
            if not isinstance(data, dict) or not isinstance(data.get("units"), list):
                raise ValueError('expected {"units": [...]}')
            return [conform(schema, u) for u in data["units"]]

        return self.llm.complete_json(
            "task", f"{self.config.stage_label}/extract", prompt, wrapper, validate
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
                return
        all_units = [self.units(i) for i in range(len(self.conv.sessions))]
        payload = {
            **limits,
            "segments": [asdict(s) for s in self.conv.sessions],
            "units": all_units,
        }
        timeout = INDEX_SECONDS + INDEX_SECONDS_PER_UNIT * sum(len(u) for u in all_units)
        try:
            result, blobs = self.timed(
                "index", lambda: self.call("index", payload, timeout=timeout)
            )
        except Exception:
            self.count("index", "failed")
            raise
        self._memory_ready = True
        self.count("index", "computed")
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

    def question(self, q: Question) -> dict[str, Any]:
        trace: dict[str, Any] = {"id": q.id, "conversation_id": q.conversation_id}
        plan_key = self.keys.plan(q.question, q.question_date)
        retrieve_key = self.keys.retrieve(self.index_key, plan_key)
        answer_key = self.keys.answer(retrieve_key, q.posed)
        stage = "plan"
        try:
            trace["query"] = self._cached_json("plan", plan_key, lambda: self._plan(q))
            stage = "retrieve"
            trace.update(
                self._cached_json("retrieve", retrieve_key, lambda: self._retrieve(trace["query"]))
            )
            stage = "answer"
            if self.llm is None:
                self.count("answer", "skipped")
                trace["answer"] = None
            else:
                trace["answer"] = self._cached_json(
                    "answer", answer_key, lambda: self._answer(q, trace["retrieved"])
                )
        except Exception as exc:
            trace["error"] = f"{stage}: {exc}".replace("\n", " ")[:1000]
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
            prompt = PLAN_PROMPT.format(
                instruction=_instruction(self.source, INSTRUCTIONS["plan"]),
                schema=json.dumps(schema),
                question=q.question,
                when=PLAN_DATE.format(date=q.question_date) if q.question_date else "",
            )
            record = self.llm.complete_json(
                "task",
                f"{self.config.stage_label}/plan",
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
        prompt = ANSWER_PROMPT.format(
            instruction=_instruction(self.source, INSTRUCTIONS["answer"]),
            retrieved=retrieved,
            today=ANSWER_DATE.format(date=q.question_date) if q.question_date else "",
            question=q.posed,
        )
        return self.llm.complete("task", f"{self.config.stage_label}/answer", prompt).text


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
    ``ticks``, when given, is a queue that receives the conversation id after each question.
    """
    run = _Run(source, path, config, conv)
    run.embedder.stats.reset()
    traces = []
    try:
        for q in questions:
            traces.append(run.question(q))
            if config.diagnose and not traces[-1].get("error"):
                try:
                    traces[-1]["diagnostics"] = question_diagnostics(
                        q, conv, run.stored_units, run.probe, run.embedder
                    )
                except (HostFailure, ProgramFailure) as exc:
                    traces[-1]["diagnostics_error"] = str(exc)[:300]
            if ticks is not None:
                ticks.put(conv.id)
    finally:
        run.close()
    run.count_untouched()
    usage = [asdict(r) for r in run.llm.drain_records()] if run.llm else []
    embedding = asdict(run.embedder.stats)
    return ConversationResult(conv.id, traces, run.counters, usage, run.seconds, embedding)


def evaluator_version() -> str:
    """A digest of what the evaluator contributes to stage outputs: EVALUATOR_VERSION, the
    contract version, the prompt texts, the extraction window, the truncation rule and budget,
    the embedding model and the installed versions of OUTPUT_LIBRARIES."""
    versions = library_versions(OUTPUT_LIBRARIES)
    parts = [EVALUATOR_VERSION, CONTRACT_VERSION, SCHEMA_PROMPT, EXTRACT_PROMPT, PLAN_PROMPT,
             PLAN_DATE, ANSWER_PROMPT, ANSWER_DATE, EXTRACT_WINDOW_CHARS, TRUNCATION,
             OUT_CHAR_BUDGET, Embedder.name, Embedder.dim, versions]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=64)  # called for every LLM prompt: parse each source once
def _instruction(source: str, name: str) -> str:
    """An instruction string read from the source without running it (a literal assignment)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise ContractError(f"{name} must be assigned a string literal")


def extraction_windows(segment: Segment) -> list[Segment]:
    """Consecutive slices of a session, each within EXTRACT_WINDOW_CHARS (one message at least)."""
    out: list[Segment] = []
    current: list[Any] = []
    size = 0
    for m in segment.messages:
        if current and size + len(m.content) > EXTRACT_WINDOW_CHARS:
            out.append(Segment(segment.session_id, segment.date, tuple(current)))
            current, size = [], 0
        current.append(m)
        size += len(m.content)
    if current or not out:
        out.append(Segment(segment.session_id, segment.date, tuple(current)))
    return out
