"""A memory program at work: the program in its confined host, with a task model and an embedder.

:class:`Pipeline` is what evaluation (:mod:`evolve.evaluation.conversation`: the pipeline, the
step cache and scoring) and a deployment both run. It is trusted code: it holds the embedder and
the task model (an :class:`~evolve.models.llm.LLMClient`, or None for the offline stand-ins of
:mod:`contract.program`), and runs a :class:`~sandbox.check.CheckedProgram` as it was checked
(its source, path and imports; nothing here parses it again). The program's own code (its
module top level, hooks and ``Memory`` methods) runs only in one :class:`~sandbox.isolate.Host`,
started and loaded on first use; the pipeline sends it data, answers its backend requests
(:class:`~evolve.evaluation.backend.BackendService`) and sends the task model the prompts of
:mod:`evolve.evaluation.prompts`, with the instructions the loaded program holds as its host
reports them at load.

Operations (each a typed value in, a typed value out):

- extraction: :meth:`Pipeline.extract` = the task model's records for every window of a
  session (:meth:`Pipeline.records`, concurrently up to ``llm_concurrency``; None offline),
  then the host's ``units`` hook (:meth:`Pipeline.units`);
- memory: :meth:`Pipeline.open` (a new, empty memory), :meth:`Pipeline.add` (``Memory.index``
  for one session, in order, within an :class:`IndexBudget`), :meth:`Pipeline.dump` (the
  state, or why it is not storable) and :meth:`Pipeline.restore`;
- a question: :meth:`Pipeline.plan` (the task model's Query record, asked now or ahead, then
  the host's ``query`` hook; the question itself offline), :meth:`Pipeline.retrieve` and
  :meth:`Pipeline.answer` (the program's answer instruction, task model only).

Invariants:
- One host per pipeline; every call into it is made under one lock, and the backend service's
  completion count restarts with each call (the host enforces the same per-call budget).
- Once the host is gone (it died, hung or broke the protocol), every later operation that needs
  it fails at once with the same reason (:class:`~sandbox.isolate.HostFailure`); the pipeline
  never starts a second host.
- Task-model outputs are validated once, here, against the schemas the host rendered from the
  program (:func:`contract.records.conform`); the host builds records from them unchecked.
  What the host returns is checked again here before it is used or cached: units must conform
  to the schema (a host that sends others broke the protocol and is gone), and text the
  program wrote that may reach a terminal or log (a state's reason) passes
  :func:`sandbox.printable.printable`.
- No frame carries a whole history: the memory grows one ``add`` (one session) per frame, and
  its state travels in chunks of at most :data:`~sandbox.wire.STATE_CHUNK_BYTES` (the whole at
  most :data:`~contract.state.MAX_STATE_BYTES`).
- Retrieved text is cut to :data:`~contract.spec.OUT_CHAR_BUDGET`; ``raw_chars`` says how long
  the program's text was.
- Every ``add`` runs under the one indexing deadline, :class:`IndexBudget`: the program's own
  time, INDEX_SECONDS plus INDEX_SECONDS_PER_UNIT per unit of the adds charged to one budget.
- Every wait is counted on :attr:`Pipeline.clock` (:class:`~evolve.fanout.WallClock`): a
  task-model call as model wait, a host call as sandbox, embedding for the host as local.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from contract.records import RecordError, conform
from contract.spec import OUT_CHAR_BUDGET
from contract.state import MAX_STATE_BYTES
from contract.types import ContractError, Segment
from evolve.evaluation import prompts
from evolve.evaluation.backend import BackendService
from evolve.evaluation.setup import EvalSetup
from evolve.fanout import WallClock, ordered_map
from evolve.models.embed import Embedder
from evolve.models.llm import LLMClient
from sandbox.budget import add_embed_chars
from sandbox.check import CheckedProgram
from sandbox.isolate import Host, HostFailure, Limits, ProgramFailure
from sandbox.printable import printable
from sandbox.wire import STATE_CHUNK_BYTES

T = TypeVar("T")
Records = list[dict[str, Any]] | None  # the task model's unit records for a session (None offline)
HOST_LIMITS = Limits(cpu_seconds=3600, memory_mb=6144, call_seconds=600.0)
INDEX_SECONDS = 120.0  # the adds of one IndexBudget: this much plus ...
INDEX_SECONDS_PER_UNIT = 0.25  # ... this much per unit they add, of the program's own time


class IndexBudget:
    """The indexing deadline, the one rule for every ``add``: the adds charged to one budget
    may take INDEX_SECONDS plus INDEX_SECONDS_PER_UNIT per unit they add, together, of the
    program's own time (the optimizer's time answering the host's backend requests, embedding
    above all, is not the program's). Evaluation charges the adds of one memory build to one
    budget (:mod:`evolve.evaluation.conversation`); an add given none has one of its own."""

    def __init__(self) -> None:
        self.left = INDEX_SECONDS  # seconds the adds charged to it may still take


@dataclass(frozen=True)
class StateDump:
    """A memory's state as :mod:`contract.state` bytes, or why it cannot be stored."""

    state: bytes | None
    reason: str | None = None  # set when state is None


@dataclass(frozen=True)
class Retrieved:
    """What retrieval returned for one query: the text cut to OUT_CHAR_BUDGET, the length of
    the program's whole text and the milliseconds the host call took."""

    text: str
    raw_chars: int
    ms: float

    @property
    def over_budget(self) -> bool:
        return self.raw_chars > OUT_CHAR_BUDGET


class Pipeline:
    """One program, its host and its models: see the module docstring."""

    def __init__(
        self,
        program: CheckedProgram,
        *,
        llm: LLMClient | None,
        embedder: Embedder,
        call_prefix: str,
        max_complete_calls: int,
        call_timeout: float,
        llm_concurrency: int = 1,
        limits: Limits = HOST_LIMITS,
    ) -> None:
        self.program = program
        self.llm = llm
        self.embedder = embedder
        self.call_prefix = call_prefix
        self.max_complete_calls = max_complete_calls
        self.call_timeout = call_timeout
        self.llm_concurrency = llm_concurrency
        self.limits = limits
        self.service = BackendService(embedder, llm, call_prefix, max_complete_calls)
        self.clock = WallClock()
        self._lock = threading.RLock()  # the host: start, calls, close
        self._host: Host | None = None
        self.backend_seconds = 0.0  # spent answering the host's backend requests, in all
        self._host_error: str | None = None
        self._schemas: dict[str, Any] = {}
        self._instructions: dict[str, str] = {}  # component -> the value the program holds
        self.on_window: Callable[[], None] = lambda: None  # after each window's records

    # -- the host ------------------------------------------------------------------------

    @classmethod
    def for_setup(
        cls, program: CheckedProgram, setup: EvalSetup, llm: LLMClient | None, embedder: Embedder
    ) -> Pipeline:
        """A pipeline with the limits ``setup`` sets (call prefix, completion budget, call
        timeout, concurrency): the one way evaluation and the runtime build theirs."""
        return cls(program, llm=llm, embedder=embedder, call_prefix=setup.call_prefix,
                   max_complete_calls=setup.max_complete_calls, call_timeout=setup.call_timeout,
                   llm_concurrency=setup.llm_concurrency)  # fmt: skip

    def host(self) -> Host:
        """The program's host, started and loaded on first use."""
        with self._lock:
            if self._host_error:
                raise HostFailure(self._host_error)
            if self._host is None:
                try:
                    with self.clock.during("sandbox"):
                        program = self.program
                        self._host = Host(self.limits, serve=self._serve, imports=program.imports)
                        loaded, _ = self._host.call(
                            "load", {"source": program.source, "path": program.path}
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
        """The host's backend requests, timed: a completion as model wait, the rest as local;
        their seconds add up in :attr:`backend_seconds`."""
        began = time.perf_counter()
        try:
            with self.clock.during("model" if header.get("method") == "complete" else "local"):
                return self.service(header, blobs)
        finally:
            self.backend_seconds += time.perf_counter() - began

    def call(
        self,
        op: str,
        payload: dict[str, Any] | None = None,
        blobs: list[bytes] | None = None,
        timeout: float | None = None,
        embed_chars: int = 0,
    ) -> tuple[Any, list[bytes]]:
        """One host request (under the lock; the host started first if need be);
        ``embed_chars`` as :meth:`sandbox.isolate.Host.call` takes it."""
        with self._lock:
            host = self.host()
            self.service.calls = 0
            try:
                with self.clock.during("sandbox"):
                    return host.call(op, payload, blobs, timeout=timeout or self.call_timeout,
                                     embed_chars=embed_chars)  # fmt: skip
            except HostFailure as exc:  # the host is gone: every later step fails the same way
                self._host_error = f"program host: {exc}"
                self.close()
                raise

    def schema(self, name: str) -> dict[str, Any]:
        """The JSON schema of the program's ``MemoryUnit`` or ``Query``, as its host renders it."""
        self.host()
        return dict(self._schemas[name])

    def instruction(self, component: str) -> str:
        """The instruction of ``component`` as the loaded program holds it (the host reports
        it at load; :func:`evolve.evaluation.prompts.reported_instructions` checks the report)."""
        self.host()
        return self._instructions[component]

    def model(self, fn: Callable[[], T]) -> T:
        """A task-model call, counted as model wait on the clock."""
        with self.clock.during("model"):
            return fn()

    @property
    def broken(self) -> bool:
        """Whether the host is gone for good (every later step fails the same way)."""
        return self._host_error is not None

    def close(self) -> None:
        with self._lock:
            if self._host is not None:
                self._host.close()
                self._host = None

    # -- extraction ----------------------------------------------------------------------

    def records(self, window: Segment) -> list[dict[str, Any]]:
        """The task model's unit records for one extraction window, checked against the
        program's ``MemoryUnit`` schema; :attr:`on_window` is called once they are."""
        if self.llm is None:
            raise RuntimeError("no task model: extraction uses the offline stand-ins")
        schema = self.schema("MemoryUnit")
        wrapper = prompts.units_schema(schema)

        def validate(data: Any) -> list[dict[str, Any]]:
            if not isinstance(data, dict) or not isinstance(data.get("units"), list):
                raise ValueError('expected {"units": [...]}')
            return [conform(schema, u) for u in data["units"]]

        prompt = prompts.extraction_prompt(self.instruction("extract"), wrapper, window)
        purpose, llm = f"{self.call_prefix}/extract", self.llm
        got = self.model(lambda: llm.complete_json("task", purpose, prompt, wrapper, validate))
        self.on_window()
        return got

    def session_records(self, segment: Segment) -> Records:
        """The task model's records for ``segment``, its windows asked concurrently and joined
        in window order (the first failing window's error, in window order); None offline."""
        if self.llm is None:
            return None
        windows = prompts.extraction_windows(segment)
        done = ordered_map(self.records, windows, self.llm_concurrency)
        return [r for got in done for r in got]

    def units(self, segment: Segment, records: Records) -> list[dict[str, Any]]:
        """The program's units for ``segment``: ``records`` (None: the offline stand-ins, one
        unit per message) through its ``postprocess_units`` hook, as checked dicts."""
        units, _ = self.call("units", {"segment": asdict(segment), "records": records})
        schema = self.schema("MemoryUnit")
        if not isinstance(units, list):
            raise self._broken(f"units answered with a {type(units).__name__}")
        try:
            for unit in units:
                conform(schema, unit)
        except RecordError as exc:
            raise self._broken(f"a unit that does not conform ({exc})") from None
        return units

    def extract(self, segment: Segment) -> list[dict[str, Any]]:
        """One session's units: the task model's records (offline: stand-ins), then the hook."""
        return self.units(segment, self.session_records(segment))

    # -- the memory ----------------------------------------------------------------------

    def _limits(self) -> dict[str, int]:
        return {"dim": self.embedder.dim, "max_complete_calls": self.max_complete_calls}

    def open(self) -> None:
        """A new, empty memory in the host (``Memory(backend)``)."""
        self.call("open", self._limits())

    def add(
        self, segment: Segment, units: list[dict[str, Any]], budget: IndexBudget | None = None
    ) -> None:
        """``Memory.index(units, segment)`` on the live memory: one session, in order, within
        what is left of ``budget`` (:class:`IndexBudget`; None: a budget of its own) once it
        has grown by these units; the program's time is charged to it."""
        if budget is None:
            budget = IndexBudget()
        budget.left += INDEX_SECONDS_PER_UNIT * len(units)
        volume = add_embed_chars((m.content for m in segment.messages), units)
        began, served = time.monotonic(), self.backend_seconds
        self.call("add", {"segment": asdict(segment), "units": units},
                  timeout=max(budget.left, 0.001), embed_chars=volume)  # fmt: skip
        # the program's time only: embedding and model calls made for it do not count
        budget.left -= time.monotonic() - began - (self.backend_seconds - served)

    def dump(self) -> StateDump:
        """The live memory's state (:mod:`contract.state` bytes), fetched chunk by chunk, or
        the host's reason why it cannot be stored."""
        with self._lock:  # the chunks of one state, with no other call between them
            result, _ = self.call("dump")
            if not (isinstance(result, dict) and result.get("stored")):
                why = result.get("reason") if isinstance(result, dict) else None
                return StateDump(None, printable(str(why or "the host sent no state"), 300))
            size = result.get("bytes")
            if type(size) is not int or not 0 < size <= MAX_STATE_BYTES:
                raise self._broken(f"a state of {size!r} bytes")
            chunks, got = [], 0
            while got < size:
                _, blobs = self.call("state_chunk", {"offset": got})
                if len(blobs) != 1 or not 0 < len(blobs[0]) <= min(STATE_CHUNK_BYTES, size - got):
                    raise self._broken("a state chunk of the wrong size")
                chunks.append(blobs[0])
                got += len(blobs[0])
            return StateDump(b"".join(chunks))

    def restore(self, state: bytes) -> None:
        """Replace the host's memory with one restored from ``state`` (sent chunk by chunk).
        A state the program cannot restore raises :class:`~sandbox.isolate.ProgramFailure`."""
        with self._lock:
            view = memoryview(state)
            for offset in range(0, len(view), STATE_CHUNK_BYTES):
                self.call("state_part", {}, [bytes(view[offset : offset + STATE_CHUNK_BYTES])])
            self.call("restore", self._limits())

    def _broken(self, what: str) -> HostFailure:
        """The host sent something no honest host sends: it is killed, and gone for good."""
        with self._lock:
            self._host_error = f"program host: host broke the protocol: {what}"
            if self._host is not None:
                self._host.kill()
                self._host = None
            return HostFailure(self._host_error)

    # -- a question ----------------------------------------------------------------------

    def plan_record(self, question: str, date: str | None) -> dict[str, Any]:
        """The task model's Query record for ``question``, checked against the program's schema."""
        if self.llm is None:
            raise RuntimeError("no task model: planning uses the question itself")
        schema, llm = self.schema("Query"), self.llm
        prompt = prompts.planning_prompt(self.instruction("plan"), schema, question, date)
        purpose = f"{self.call_prefix}/plan"
        return self.model(
            lambda: llm.complete_json("task", purpose, prompt, schema, lambda d: conform(schema, d))
        )

    def query(
        self, question: str, date: str | None, record: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The program's query from a Query ``record`` (None: the question itself, offline)
        through its ``postprocess_query`` hook."""
        payload = {"question": question, "date": date, "record": record}
        result, _ = self.call("query", payload)
        if not isinstance(result, dict):
            raise HostFailure("program host: a query must come back as a record")
        return result

    def plan(
        self,
        question: str,
        date: str | None,
        record: Callable[[], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The program's query for ``question``: the task model's record (offline: none; given
        as ``record`` when it was asked ahead, else asked now), then the host's ``query`` (the
        host is checked before the record is used, as a sequential run finds it)."""
        planned = None
        if self.llm is not None:
            self.schema("Query")
            planned = record() if record is not None else self.plan_record(question, date)
        return self.query(question, date, planned)

    def retrieve(self, query: dict[str, Any]) -> Retrieved:
        """``Memory.retrieve(query)`` on the live memory, cut to OUT_CHAR_BUDGET."""
        began = time.perf_counter()
        result, _ = self.call("retrieve", {"query": query})
        elapsed_ms = round((time.perf_counter() - began) * 1000, 3)
        if not (isinstance(result, dict) and isinstance(result.get("text"), str)
                and isinstance(result.get("raw_chars"), int)):  # fmt: skip
            raise HostFailure("program host: retrieval must come back as text")
        return Retrieved(result["text"][:OUT_CHAR_BUDGET], result["raw_chars"], elapsed_ms)

    def answer(self, question: str, date: str | None, retrieved: str) -> str:
        """The task model's answer to ``question`` from ``retrieved``, under the program's
        answer instruction (there is no answer offline: RuntimeError)."""
        if self.llm is None:
            raise RuntimeError("no task model: there is no answer offline")
        instruction, llm = self.instruction("answer"), self.llm
        prompt = prompts.answer_prompt(instruction, retrieved, question, date)
        purpose = f"{self.call_prefix}/answer"
        return self.model(lambda: llm.complete("task", purpose, prompt).text)
