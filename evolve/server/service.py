"""The memory service: one opened memory (:class:`evolve.runtime.api.AgentMemory`) behind
bounded, fair, deadline-keeping async verbs — what HTTP, MCP and Ray call.

Owns :class:`MemoryService` (the verbs ``add``, ``context``, ``answer``, ``history``,
``forget``, ``program``, ``health``, ``stats``; ``drain`` and ``close``), :class:`ServiceLimits` and
the scheduler that runs the runtime's synchronous calls on worker threads (:class:`_Scheduler`).

Invariants:

- **The scope is the caller's resolved scope** (:meth:`evolve.server.auth.Grant.scope`): every
  verb takes it as its first argument and nothing else names a tenant.
- **Acknowledged means durable.** ``add`` returns only after the runtime's ``add`` returned
  (the session fsync'd in the scope's log and indexed); a session id the log holds adds
  nothing (``added`` False). Without a caller's id a fresh one is made here and returned.
- **Bounded.** A verb is admitted only while its scope has fewer than ``scope_queue`` verbs
  waiting and the service fewer than ``total_queue``; otherwise :class:`Busy` (with a
  ``retry_after_s``) and nothing is done. At most ``workers`` verbs run at once, at most
  ``scope_workers`` of one scope, and a free worker takes the next waiting verb of the scopes
  in turn (round robin), so one scope's slow verbs never hold back another scope's.
- **Deadlines.** A verb still waiting at its deadline is withdrawn (nothing done); one still
  running answers :class:`DeadlineExceeded` and finishes in the background (an ``add`` may
  then be durable: a retry with the same session id does not double it).
- **Graceful stop.** After :meth:`drain` begins, new verbs get :class:`ShuttingDown`; the
  admitted ones finish; :meth:`close` then closes the memory.
- Runtime failures are one-line :class:`Failed` errors; a verb that failed wrote nothing
  (the runtime's rule for ``add``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from evolve.evaluation.identity import ScoredAs, mode, read_scored_as
from evolve.runtime.api import AgentMemory, AgentMemoryError
from evolve.server.records import (
    Added,
    Busy,
    Conflict,
    DeadlineExceeded,
    Forgotten,
    Health,
    MessageIn,
    MessageOut,
    NotFound,
    ProgramRecord,
    ScoredAsOut,
    ServiceError,
    SessionOut,
    ShuttingDown,
    Stats,
    VerbLatency,
)
from sandbox import barrier

T = TypeVar("T")
VERBS = ("add", "context", "answer", "history", "forget")
WRITES = ("add", "answer", "forget")  # the verbs with the long deadline
LATENCY_WINDOW = 2048  # the last calls per verb the percentiles are over


class Failed(ServiceError):
    """The runtime could not serve a well-formed request (a damaged store, the program failed)."""

    status = 500


@dataclass(frozen=True)
class ServiceLimits:
    """The service's bounds (``evolve serve`` flags of the same names)."""

    scope_queue: int = 64  # verbs of one scope waiting to run
    total_queue: int = 1024  # verbs waiting to run, in all
    workers: int = 32  # verbs running at once, in all
    scope_workers: int = 4  # verbs of one scope running at once
    read_deadline_s: float = 30.0  # context, history
    write_deadline_s: float = 120.0  # add, answer, forget

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"{f.name} is positive")
        if self.scope_workers > self.workers:
            raise ValueError("scope_workers is at most workers")

    def deadline(self, verb: str) -> float:
        return self.write_deadline_s if verb in WRITES else self.read_deadline_s


@dataclass
class _Task:
    scope: str
    verb: str
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]
    since: float


class _Scheduler:
    """Worker threads taking admitted verbs from per-scope queues, the scopes in turn."""

    def __init__(self, limits: ServiceLimits, record: Callable[[str, float], None]) -> None:
        self.limits = limits
        self._record = record
        self._cond = threading.Condition()
        self._waiting: OrderedDict[str, deque[_Task]] = OrderedDict()
        self._n_waiting = 0
        self._running: Counter[str] = Counter()
        self._admitting = True
        self._stopped = False
        self.refused: Counter[str] = Counter()
        self._threads = [threading.Thread(target=self._work, name=f"memory-worker-{k}",
                                          daemon=True) for k in range(limits.workers)]  # fmt: skip
        for t in self._threads:
            t.start()

    def submit(
        self, scope: str, verb: str, fn: Callable[[], Any], retry_after: Callable[[], int]
    ) -> _Task:
        with self._cond:
            if not self._admitting:
                self.refused["draining"] += 1
                raise ShuttingDown("the server is shutting down; retry on another instance")
            queue = self._waiting.get(scope)
            if queue is not None and len(queue) >= self.limits.scope_queue:
                self.refused["busy"] += 1
                raise Busy(f"this scope has {len(queue)} requests waiting; retry later",
                           retry_after())  # fmt: skip
            if self._n_waiting >= self.limits.total_queue:
                self.refused["busy"] += 1
                raise Busy(f"the server has {self._n_waiting} requests waiting; retry later",
                           retry_after())  # fmt: skip
            task = _Task(scope, verb, fn, concurrent.futures.Future(), time.monotonic())
            self._waiting.setdefault(scope, deque()).append(task)
            self._n_waiting += 1
            self._cond.notify()
            return task

    def withdraw(self, task: _Task) -> bool:
        """Take ``task`` back if it has not started; True when withdrawn."""
        with self._cond:
            queue = self._waiting.get(task.scope)
            if queue is None or task not in queue:
                return False
            queue.remove(task)
            self._n_waiting -= 1
            if not queue:
                del self._waiting[task.scope]
            task.future.cancel()
            self._cond.notify_all()
            return True

    def _next(self) -> _Task | None:
        for scope, queue in self._waiting.items():
            if self._running[scope] < self.limits.scope_workers:
                task = queue.popleft()
                self._n_waiting -= 1
                if queue:
                    self._waiting.move_to_end(scope)  # the other scopes go first next time
                else:
                    del self._waiting[scope]
                self._running[scope] += 1
                return task
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                task = self._next()
                while task is None:
                    if self._stopped:
                        return
                    self._cond.wait()
                    task = self._next()
            try:
                if task.future.set_running_or_notify_cancel():
                    try:
                        task.future.set_result(task.fn())
                    except BaseException as exc:  # handed to the awaiting verb
                        task.future.set_exception(exc)
                    self._record(task.verb, time.monotonic() - task.since)
            finally:
                with self._cond:
                    self._running[task.scope] -= 1
                    if not self._running[task.scope]:
                        del self._running[task.scope]
                    self._cond.notify_all()

    def depths(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._cond:
            return ({s: len(q) for s, q in self._waiting.items()}, dict(self._running))

    def stop_admitting(self) -> None:
        with self._cond:
            self._admitting = False

    @property
    def admitting(self) -> bool:
        return self._admitting

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until nothing waits or runs; False at ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._n_waiting or self._running:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self) -> None:
        with self._cond:
            self._admitting = False
            self._stopped = True
            self._cond.notify_all()


def _percentile(sorted_ms: list[float], q: float) -> float | None:
    if not sorted_ms:
        return None
    k = max(0, math.ceil(q * len(sorted_ms)) - 1)
    return round(sorted_ms[k], 3)


def _transfer_lines(source: str) -> list[str]:
    """The transfer lines of an export's header: after its scores, before its lineage."""
    lines = source.splitlines()
    start = next((k for k, x in enumerate(lines) if x.startswith("# scores (")), None)
    if start is None:
        return []
    k = start + 1
    while k < len(lines) and lines[k].startswith("#   "):
        k += 1
    out = []
    while k < len(lines) and lines[k].startswith("#") and not lines[k].startswith("# lineage"):
        out.append(lines[k].removeprefix("# "))
        k += 1
    return out


class MemoryService:
    """The verbs over one opened memory (see the module's invariants)."""

    def __init__(
        self,
        memory: AgentMemory,
        program: Path,
        *,
        limits: ServiceLimits | None = None,
        isolation: Callable[[], str] | None = None,
    ) -> None:
        self.memory = memory
        self.limits = limits or ServiceLimits()
        self._program = Path(program)
        self._source = self._program.read_text(encoding="utf-8")
        self._isolation_probe = isolation or _isolation
        self._isolation: str | None = None
        self._started = time.monotonic()
        self._lat_lock = threading.Lock()
        self._latency: dict[str, deque[float]] = {v: deque(maxlen=LATENCY_WINDOW) for v in VERBS}
        self._counts: Counter[str] = Counter()
        self._sched = _Scheduler(self.limits, self._record)
        self._closed = False

    # -- the verbs ----------------------------------------------------------------------

    async def add(
        self,
        scope: str,
        messages: list[MessageIn],
        *,
        session_id: str | None = None,
        date: str | None = None,
    ) -> Added:
        """Add one session to ``scope``; returns once it is durable and indexed."""
        sid = session_id if session_id is not None else uuid.uuid4().hex
        rows = [m.model_dump(exclude_none=True) for m in messages]
        new = await self._run(scope, "add", lambda: self.memory.add(rows, user=scope, date=date,
                                                                    session_id=sid))  # fmt: skip
        return Added(session_id=sid, added=bool(new))

    async def context(self, scope: str, question: str, *, date: str | None = None) -> str:
        return str(await self._run(scope, "context", lambda: self.memory.context(
            question, user=scope, date=date)))  # fmt: skip

    async def answer(self, scope: str, question: str, *, date: str | None = None) -> str:
        if self.memory.setup.task_model is None:
            raise Conflict("answer needs a task model: serve with --model")
        return str(await self._run(scope, "answer", lambda: self.memory.answer(
            question, user=scope, date=date)))  # fmt: skip

    async def history(self, scope: str) -> list[SessionOut]:
        segments = await self._run(scope, "history", lambda: self.memory.history(scope))
        return [SessionOut(session_id=s.session_id, date=s.date,
                           messages=[MessageOut(id=m.id, role=m.role, content=m.content)
                                     for m in s.messages]) for s in segments]  # fmt: skip

    async def forget(self, scope: str, session_id: str | None = None) -> Forgotten:
        """Forget one session of ``scope``, or (``session_id`` None) the whole scope."""
        verb = getattr(self.memory, "forget", None)
        if verb is None:
            raise Conflict("forget: this runtime has no forget verb")
        done = await self._run(scope, "forget", lambda: verb(scope, session_id=session_id))
        n = int(done) if isinstance(done, bool | int) else len(done or ())
        if session_id is not None and n == 0:
            raise NotFound(f"session_id: {session_id[:140]!r} is not in this scope")
        return Forgotten(session_id=session_id, forgotten=n)

    def program(self) -> ProgramRecord:
        d = self.memory.deployment
        running = ScoredAs(mode(d.task_model), d.task_model, d.embedder, d.precision,
                           d.pipeline_version)  # fmt: skip
        scored = read_scored_as(self._source)
        return ProgramRecord(
            sha256=d.program_sha256, path=str(self._program),
            scored_as=ScoredAsOut(**asdict(scored)) if scored else None,
            running_as=ScoredAsOut(**asdict(running)),
            differences=scored.differences(running) if scored else [],
            transfer=_transfer_lines(self._source),
        )  # fmt: skip

    def health(self) -> Health:
        waiting, running = self._sched.depths()
        return Health(status="ok" if self._sched.admitting else "draining",
                      uptime_s=round(time.monotonic() - self._started, 3),
                      waiting=sum(waiting.values()), running=sum(running.values()))  # fmt: skip

    async def stats(self, scopes: tuple[str, ...] | None = None) -> Stats:
        """The service's figures; per-scope depths only of ``scopes`` (None: all)."""
        if self._isolation is None:
            self._isolation = await asyncio.to_thread(self._isolation_probe)
        waiting, running = self._sched.depths()
        with self._lat_lock:
            latency = {}
            for verb, window in self._latency.items():
                ms = sorted(window)
                latency[verb] = VerbLatency(count=self._counts[verb], p50_ms=_percentile(ms, 0.5),
                                            p99_ms=_percentile(ms, 0.99))  # fmt: skip
        mine = (lambda s: True) if scopes is None else (lambda s: s in scopes)
        health = self.health()
        return Stats(
            status=health.status, uptime_s=health.uptime_s, waiting=health.waiting,
            running=health.running,
            waiting_by_scope={s: n for s, n in waiting.items() if mine(s)},
            running_by_scope={s: n for s, n in running.items() if mine(s)},
            limits={f.name: float(getattr(self.limits, f.name)) for f in fields(self.limits)},
            latency=latency, refused={k: self._sched.refused[k] for k in
                                      ("busy", "draining", "deadline")},
            live_hosts=self.memory.live_hosts(), isolation=self._isolation,
        )  # fmt: skip

    # -- stopping -----------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Refuse new verbs from now on (:class:`ShuttingDown`)."""
        self._sched.stop_admitting()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every admitted verb finished; False at ``timeout``."""
        return self._sched.wait_idle(timeout)

    async def drain(self, timeout: float | None = None) -> bool:
        """Refuse new verbs and wait for the admitted ones; False at ``timeout``."""
        self.begin_drain()
        return await asyncio.to_thread(self.wait_idle, timeout)

    def close(self) -> None:
        """Stop the workers and close the memory (snapshots written; the store stays)."""
        if not self._closed:
            self._closed = True
            self._sched.stop()
            self.memory.close()

    # -- running a verb -----------------------------------------------------------------

    def _record(self, verb: str, seconds: float) -> None:
        with self._lat_lock:
            self._latency[verb].append(seconds * 1000)
            self._counts[verb] += 1

    def _retry_after(self, verb: str) -> int:
        with self._lat_lock:
            window = sorted(self._latency[verb])
        typical = window[len(window) // 2] / 1000 if window else 1.0
        return max(1, min(60, math.ceil(typical * self.limits.scope_queue
                                        / self.limits.scope_workers)))  # fmt: skip

    async def _run(self, scope: str, verb: str, fn: Callable[[], T]) -> T:
        if not isinstance(scope, str) or not scope:
            raise ServiceError("scope is a non-empty string")
        task = self._sched.submit(scope, verb, fn, lambda: self._retry_after(verb))
        deadline = self.limits.deadline(verb)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(task.future)),
                                          deadline)  # fmt: skip
        except TimeoutError:
            self._sched.refused["deadline"] += 1
            if self._sched.withdraw(task):
                raise DeadlineExceeded(f"{verb} did not start within its deadline of "
                                       f"{deadline:g} s; nothing was done") from None  # fmt: skip
            raise DeadlineExceeded(f"{verb} did not finish within its deadline of {deadline:g} s"
                                   "; it may still complete (retry an add with the same "
                                   "session_id)") from None  # fmt: skip
        except asyncio.CancelledError:
            self._sched.withdraw(task)  # the caller left: a verb not started is not run
            raise
        except AgentMemoryError as exc:
            raise Failed(str(exc)) from None


def _isolation() -> str:
    return barrier.describe(barrier.survey())
