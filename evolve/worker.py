"""The worker side of execution: one conversation through the five stages, with stage reuse.

Everything here runs inside a worker process, never in the optimizer's own process, because it
executes a candidate program's code (its module top level, hooks and ``Memory`` methods).
:func:`run_conversation` receives the program source and one conversation with its questions,
and for each stage either loads the cached output (keys from :mod:`evolve.stagecache`) or
computes it and stores it. Outputs are computed lazily: when every retrieval result of a
conversation is cached, its memory is never rebuilt, and when the memory state is cached, its
units are never extracted.

Invariants:
- Only successful outputs are stored; a program error, an LLM failure or an unpicklable memory
  leaves the store untouched and is recorded in the trace (``error``) and counters (``failed``).
- Offline mode (no task model) uses the stand-ins of :mod:`evolve.program`: one unit per
  message, the question as the query, no answer (counted as ``skipped``).
- Retrieved text is cut to :data:`~evolve.program.OUT_CHAR_BUDGET`; the trace says when.
- Scoring is not done here: the parent scores what the worker returns.
"""

from __future__ import annotations

import json
import time
import traceback
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from evolve.datasets.types import Conversation, Question, Segment
from evolve.models.embed import Embedder, HashingEmbedder
from evolve.models.llm import LLMClient, ModelConfig, Models, UsageRecord
from evolve.models.testing import ScriptedLLM
from evolve.program import (
    OUT_CHAR_BUDGET,
    BackendError,
    ContractError,
    Program,
    build_record,
    json_schema,
    load_program,
    validate_record,
)
from evolve.stagecache import (
    COMPONENTS,
    StageKeys,
    StageStore,
    dump_state,
    fingerprints,
    load_state,
)

T = TypeVar("T")
EXTRACT_WINDOW_CHARS = 24_000  # one extraction call sees at most this much of a session


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides the job; picklable."""

    cache_dir: str
    task_model: ModelConfig | None
    embedder: str = "minilm"  # "minilm" or "hashing" (test double, chosen explicitly)
    stage_label: str = "eval"
    max_complete_calls: int = 8
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
    log, cache = root / "llm-calls.sqlite", root / "llm-cache.sqlite"
    models = Models(task=config.task_model)
    if config.script is not None:
        return ScriptedLLM(config.script, models, log_path=log, cache_path=cache)
    return LLMClient(models, log_path=log, cache_path=cache)


class MemoryBackend:
    """The backend handed to ``Memory``: embeddings and a budgeted, counted task-LLM call."""

    def __init__(self, embedder: Embedder, llm: LLMClient | None, stage: str, max_calls: int):
        self.dim = embedder.dim
        self.max_complete_calls = max_calls
        self._embedder = embedder
        self._llm = llm
        self._stage = stage
        self._calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = list(texts)
        if not all(isinstance(t, str) for t in items):
            raise TypeError("backend.embed takes a list of strings")
        return np.array(self._embedder.embed(items), dtype=np.float32)

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        if self._llm is None:
            raise BackendError("backend.complete: no task LLM is configured (offline mode)")
        if self._calls >= self.max_complete_calls:
            raise BackendError(f"backend.complete: budget of {self.max_complete_calls} calls spent")
        self._calls += 1
        reply = self._llm.complete(
            "task", f"{self._stage}/memory", str(prompt), max_tokens=max_tokens
        )
        return reply.text

    def reset_budget(self) -> None:
        self._calls = 0


class _Run:
    """State of one conversation's execution inside the worker."""

    def __init__(self, program: Program, config: WorkerConfig, conv: Conversation) -> None:
        self.program = program
        self.config = config
        self.conv = conv
        self.ns = vars(program.module)
        self.store = StageStore(Path(config.cache_dir) / "stages")
        self.keys = StageKeys(fingerprints(program.source), config.model_sig, config.embedder)
        self.llm = make_llm(config)
        self.embedder = make_embedder(config.embedder, config.cache_dir)
        self.backend = MemoryBackend(
            self.embedder, self.llm, config.stage_label, config.max_complete_calls
        )
        self.counters = {
            c: {"computed": 0, "reused": 0, "failed": 0, "skipped": 0} for c in COMPONENTS
        }
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)
        self.extract_keys = [self.keys.extract(s.digest()) for s in conv.sessions]
        self.index_key = self.keys.index(self.extract_keys)
        self._memory: Any = None
        self._nested = 0.0  # seconds spent in nested timed sections (see timed)

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

    def units(self, i: int) -> list[Any]:
        segment, key = self.conv.sessions[i], self.extract_keys[i]
        cached = self.store.get_json("extract", key)
        if cached is not None:
            self.count("extract", "reused")
            return [validate_record(self.program.memory_unit, u, self.ns) for u in cached]
        try:
            units = self.timed("extract", lambda: self._extract(segment))
        except Exception:
            self.count("extract", "failed")
            raise
        self.store.put_json("extract", key, [asdict(u) for u in units])
        self.count("extract", "computed")
        return units

    def _extract(self, segment: Segment) -> list[Any]:
        cls = self.program.memory_unit
        if self.llm is None:
            units = [
                build_record(
                    cls, f"{m.role}: {m.content}", self.ns, date=segment.date, role=m.role,
                    session_id=segment.session_id, message_id=m.id, message_ids=[m.id],
                )
                for m in segment.messages
            ]  # fmt: skip
        else:
            units = [u for window in _windows(segment) for u in self._extract_llm(window)]
        hook = self.program.hook("postprocess_units")
        if hook is not None:
            units = hook(units, segment)
        # Whatever the hook returns must still be valid records of the schema.
        return [validate_record(cls, _as_dict(u, cls), self.ns) for u in units]

    def _extract_llm(self, window: Segment) -> list[Any]:
        assert self.llm is not None
        cls, schema = self.program.memory_unit, json_schema(self.program.memory_unit, self.ns)
        wrapper = {"type": "object", "properties": {"units": {"type": "array", "items": schema}},
                   "required": ["units"], "additionalProperties": False}  # fmt: skip
        prompt = (
            f"{self.program.get('EXTRACTION_INSTRUCTION')}\n\n"
            f"Reply with one JSON object matching this schema:\n{json.dumps(wrapper)}\n\n"
            f"{window.render()}"
        )

        def validate(data: Any) -> list[Any]:
            if not isinstance(data, dict) or not isinstance(data.get("units"), list):
                raise ValueError('expected {"units": [...]}')
            return [validate_record(cls, u, self.ns) for u in data["units"]]

        return self.llm.complete_json(
            "task", f"{self.config.stage_label}/extract", prompt, wrapper, validate
        )

    def memory(self) -> Any:
        """The built memory: restored from the store, or indexed now (and stored)."""
        if self._memory is not None:
            return self._memory
        cls = self.program.get("Memory")
        data = self.store.get_bytes("index", self.index_key)
        if data is not None:
            try:
                self._memory = load_state(cls, data, self.ns, self.backend)
            except Exception:  # stored by an incompatible program: rebuild instead
                self._memory = None
            else:
                self.count("index", "reused")
                return self._memory
        all_units = [self.units(i) for i in range(len(self.conv.sessions))]
        try:
            self._memory = self.timed("index", lambda: self._index(cls, all_units))
        except Exception:
            self.count("index", "failed")
            raise
        self.count("index", "computed")
        try:
            state = dump_state(self._memory, self.program.module.__name__, self.backend)
        except Exception:  # an unpicklable memory is simply not reused
            return self._memory
        self.store.put_bytes("index", self.index_key, state)
        return self._memory

    def _index(self, cls: type, all_units: list[list[Any]]) -> Any:
        memory = cls(self.backend)
        for segment, units in zip(self.conv.sessions, all_units, strict=True):
            self.backend.reset_budget()
            if memory.index(list(units), segment) is not None:
                raise TypeError("Memory.index must return None")
        return memory

    def count_untouched(self) -> None:
        """Extraction and indexing never ran because every retrieval was cached: count what the
        store holds for them as reused, so counters say what an evaluation depended on."""
        if self._memory is not None or any(self.counters["index"].values()):
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
        answer_key = self.keys.answer(retrieve_key, q.question)
        stage = "plan"
        try:
            trace["query"] = self._cached_json("plan", plan_key, lambda: self._plan(q))
            stage = "retrieve"
            trace.update(self._cached_json(
                "retrieve", retrieve_key, lambda: self._retrieve(trace["query"])
            ))  # fmt: skip
            stage = "answer"
            if self.llm is None:
                self.count("answer", "skipped")
                trace["answer"] = None
            else:
                trace["answer"] = self._cached_json(
                    "answer", answer_key, lambda: self._answer(q, trace["retrieved"])
                )
        except Exception as exc:
            trace["error"] = f"{stage}: {_describe(exc, self.program.path)}"
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
        cls = self.program.query
        if self.llm is None:
            query = build_record(cls, q.question, self.ns, date=q.question_date)
        else:
            schema = json_schema(cls, self.ns)
            when = f"\nThe question is asked on {q.question_date}." if q.question_date else ""
            prompt = (
                f"{self.program.get('PLANNING_INSTRUCTION')}\n\n"
                f"Reply with one JSON object matching this schema:\n{json.dumps(schema)}\n\n"
                f"Question: {q.question}{when}"
            )
            query = self.llm.complete_json(
                "task", f"{self.config.stage_label}/plan", prompt, schema,
                lambda d: validate_record(cls, d, self.ns),
            )  # fmt: skip
        hook = self.program.hook("postprocess_query")
        if hook is not None:
            query = hook(query, q.question)
        return asdict(validate_record(cls, _as_dict(query, cls), self.ns))

    def _retrieve(self, query: dict[str, Any]) -> dict[str, Any]:
        memory = self.memory()
        self.backend.reset_budget()
        text = memory.retrieve(validate_record(self.program.query, query, self.ns))
        if not isinstance(text, str):
            raise TypeError(f"Memory.retrieve must return str, got {type(text).__name__}")
        over = len(text) > OUT_CHAR_BUDGET
        return {"retrieved": text[:OUT_CHAR_BUDGET], "over_budget": over, "raw_chars": len(text)}

    def _answer(self, q: Question, retrieved: str) -> str:
        assert self.llm is not None
        prompt = (
            f"{self.program.get('ANSWER_INSTRUCTION')}\n\n"
            f"Retrieved memories:\n{retrieved}\n\n"
            + (f"Today is {q.question_date}.\n" if q.question_date else "")
            + f"Question: {q.question}\nAnswer:"
        )
        return self.llm.complete("task", f"{self.config.stage_label}/answer", prompt).text


def load_check(source: str, path: str) -> str | None:
    """None when the program loads and defines what the contract requires, else why not."""
    try:
        load_program(source, path)
    except Exception as exc:
        return str(exc) if isinstance(exc, ContractError) else _describe(exc, path)
    return None


def run_conversation(
    source: str,
    path: str,
    conv: Conversation,
    questions: list[Question],
    config: WorkerConfig,
    ticks: Any = None,
) -> ConversationResult:
    """Execute one program over one conversation's questions (in a worker process).

    ``ticks``, when given, is a queue that receives the conversation id after each question.
    """
    counters: dict[str, dict[str, int]] = {}
    try:
        program = load_program(source, path)
        run = _Run(program, config, conv)
    except Exception as exc:
        error = f"load: {_describe(exc, path)}"
        traces = [
            {"id": q.id, "conversation_id": q.conversation_id, "error": error} for q in questions
        ]
        return ConversationResult(conv.id, traces, counters, [])
    run.embedder.stats.reset()
    traces = []
    for q in questions:
        traces.append(run.question(q))
        if ticks is not None:
            ticks.put(conv.id)
    run.count_untouched()
    usage = [_usage_dict(r) for r in run.llm.drain_records()] if run.llm else []
    embedding = asdict(run.embedder.stats)
    return ConversationResult(conv.id, traces, run.counters, usage, run.seconds, embedding)


def _windows(segment: Segment) -> list[Segment]:
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


def _as_dict(record: Any, cls: type) -> Any:
    if not isinstance(record, cls):
        raise TypeError(f"expected a {cls.__name__}, got {type(record).__name__}")
    return asdict(typing.cast(Any, record))


def _describe(exc: BaseException, path: str | None = None) -> str:
    """One line: the exception and the innermost line of the program file it came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}".replace("\n", " ")[:500]


def _usage_dict(record: UsageRecord) -> dict[str, Any]:
    return asdict(record)
