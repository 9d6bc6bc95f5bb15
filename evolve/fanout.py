"""Bounded concurrency with sequential results: the pieces an evaluation's model calls share.

Owns :func:`ordered_map` (a function over items on a bounded thread pool, results in item
order), :func:`attempt` (a computation's outcome, value or exception, kept for later),
:class:`Turns` (numbered tasks enter one section one at a time, in number order) and
:class:`WallClock` (a conversation's wall time split into model wait, sandbox and local
compute) — design §2, execution.

Invariants:
- :func:`ordered_map` with ``workers <= 1`` (or a single item) runs inline in the calling
  thread, in item order: exactly a sequential loop. Otherwise every item runs even when one
  fails, and the exception of the first failing item *in item order* is raised, the one a
  sequential loop would have raised first.
- :class:`Turns` lets task ``k`` in only after tasks ``0 .. k-1`` have passed their turns, so
  whatever runs inside the section runs in the order a sequential run gives it. Leaving the
  ``with`` block passes the turn (also on an exception); a task that never enters (it failed
  before its section) passes it with :meth:`Turns.pass_turn`, and passing again is a no-op,
  so a caller passes every task's turn when the task ends, whatever happened.
- :class:`WallClock` attributes every instant to exactly one of ``model_wait`` (some model call
  in flight), ``sandbox`` (else: the program's host computing) and ``local`` (else), so the
  three sum to the clock's wall time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``workers`` threads; see the module invariants."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        futures = [pool.submit(fn, x) for x in items]  # submitted (and started) in item order
    return [f.result() for f in futures]


def attempt(fn: Callable[[], T]) -> Callable[[], T]:
    """Run ``fn`` now; return a thunk that gives its value, or raises its exception, later."""
    try:
        value = fn()
    except Exception as exc:
        failure = exc

        def fail() -> T:
            raise failure

        return fail
    return lambda: value


class Turns:
    """Numbered tasks ``0, 1, 2, ...`` enter ``with turns.turn(k):`` one at a time, in order."""

    def __init__(self) -> None:
        self._next = 0  # the first task whose turn has not passed
        self._passed: set[int] = set()  # tasks past _next that passed early (never entered)
        self._cond = threading.Condition()

    @contextmanager
    def turn(self, k: int) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self._next >= k)
            if self._next > k:
                raise RuntimeError(f"task {k} entered after passing its turn")
        try:
            yield
        finally:
            self.pass_turn(k)

    def pass_turn(self, k: int) -> None:
        """Task ``k`` is done with its turn (entered or not); the next waiting task may enter."""
        with self._cond:
            if k < self._next:
                return
            self._passed.add(k)
            while self._next in self._passed:
                self._passed.discard(self._next)
                self._next += 1
            self._cond.notify_all()


class WallClock:
    """Splits the wall time since construction into model wait, sandbox and local compute.

    ``with clock.during("model"):`` marks a model call in flight, ``"sandbox"`` a host call,
    ``"local"`` trusted work done *for* the host while its call runs (embedding a request);
    at each instant the first of model, local-for-the-host, sandbox that is active wins, and
    an instant with none active is local.
    """

    KINDS = ("model", "local", "sandbox")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = dict.fromkeys(self.KINDS, 0)
        self._totals = {"model_wait": 0.0, "sandbox": 0.0, "local": 0.0}
        self._since = time.perf_counter()

    def _state(self) -> str:
        if self._active["model"]:
            return "model_wait"
        if self._active["sandbox"] and not self._active["local"]:
            return "sandbox"
        return "local"

    def _shift(self, kind: str, delta: int) -> None:
        with self._lock:
            now = time.perf_counter()
            self._totals[self._state()] += now - self._since
            self._since = now
            self._active[kind] += delta

    @contextmanager
    def during(self, kind: str) -> Iterator[None]:
        self._shift(kind, +1)
        try:
            yield
        finally:
            self._shift(kind, -1)

    def seconds(self) -> dict[str, float]:
        """The split so far, in seconds (rounded to the millisecond)."""
        with self._lock:
            now = time.perf_counter()
            self._totals[self._state()] += now - self._since
            self._since = now
            return {k: round(v, 3) for k, v in self._totals.items()}
