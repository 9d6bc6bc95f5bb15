"""Live scopes: one confined host per user (scope) id, a bounded pool of them, and their locks.

Owns :class:`Scopes`. A scope's memory lives in a pipeline (:class:`evolve.pipeline.Pipeline`:
the program in its own confined host) built from the store (:mod:`.store`): the newest
snapshot of the deployment's build, then the log's sessions after it.

Invariants:

- **Users apart.** Every scope has its own host; a host never serves a second scope, not even
  after its scope is evicted (it is closed, and the scope's next use starts a new one). Program
  code is hostile and its module globals live as long as its host, so this is what keeps one
  user's text from another's context, whatever the program does.
- **Writes serialised per scope, scopes concurrent.** Every operation on a scope (add, context,
  answer, snapshot, eviction) holds that scope's lock; a host serves one request at a time, so
  two reads of one scope also take turns. Operations on different scopes run side by side.
- **Acknowledged = logged, then indexed.** :meth:`Scopes.add` appends the session to the
  scope's log (fsync'd) before the host indexes it, and returns after both. When indexing fails
  the session is taken back out of the log and the memory is closed: the scope's next use
  rebuilds it from the log, so a failed ``add`` leaves nothing behind (a crash between the
  append and the return leaves the whole session logged, never half of it).
- **Bounded.** At most ``max_live`` hosts stay started: using another scope evicts the least
  recently used idle one — its memory is dumped to a snapshot (when the program's state can be
  stored) and its host closed. A scope busy in another thread is never evicted; the pool can
  then hold one host more than ``max_live`` until it is idle.
- **Snapshots cost linear time in all.** A memory is snapshotted when ``snapshot_every``
  sessions and :data:`SNAPSHOT_GROWTH` times the sessions of its last snapshot have been added
  since that snapshot (a dump costs time in the memory's size, so evenly spaced snapshots would
  make ingest quadratic), and when its host is evicted or closed. After a crash, at most that
  tail of the log is indexed again.
- A memory whose state cannot be stored is rebuilt from the log each time its scope is started;
  the reason is reported once per store (``notice``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.types import Segment
from evolve.pipeline import Pipeline
from evolve.runtime.log import SessionLog
from evolve.runtime.store import Store

SNAPSHOT_GROWTH = 0.25  # a new snapshot waits for this share of the sessions the last one held


@dataclass
class Live:
    """One scope's started memory: its pipeline and how many log sessions it holds."""

    pipeline: Pipeline
    held: int  # sessions of the log the memory holds (always a prefix of the log)
    snapshotted: int  # sessions the newest snapshot holds


@dataclass
class Scope:
    lock: threading.RLock = field(default_factory=threading.RLock)
    log: SessionLog | None = None
    live: Live | None = None


class Scopes:
    """The scopes of one opened store (see the module's invariants)."""

    def __init__(
        self,
        store: Store,
        make_pipeline: Callable[[], Pipeline],
        *,
        max_live: int,
        snapshot_every: int,
        notice: Callable[[str], None],
    ) -> None:
        self.store = store
        self.make_pipeline = make_pipeline
        self.max_live = max_live
        self.snapshot_every = snapshot_every
        self.notice = notice
        self._scopes: dict[str, Scope] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()  # live scopes, least recent first
        self._lock = threading.Lock()  # the two maps above
        self._unstored_said = False

    def scope(self, user: str) -> Scope:
        with self._lock:
            return self._scopes.setdefault(user, Scope())

    def run(self, user: str, fn: Callable[[Live, SessionLog], Any]) -> Any:
        """``fn(live memory, log)`` under the scope's lock, the memory started first."""
        scope = self.scope(user)
        with scope.lock:
            if scope.log is None:
                scope.log = self.store.open_log(user)
            if scope.live is None:
                scope.live = self._start(user, scope.log)
            with self._lock:
                self._recent[user] = None
                self._recent.move_to_end(user)
            try:
                return fn(scope.live, scope.log)
            except BaseException:
                self._drop(user, scope)  # a failed step leaves no half-built memory behind
                raise
            finally:
                self._evict_beyond(keep=user)

    def history(self, user: str) -> list[Segment]:
        """The sessions of the user's log, read under the scope's lock (never beside an
        append, whose record an open would take for a torn tail)."""
        scope = self.scope(user)
        with scope.lock:
            if scope.log is None:
                scope.log = self.store.open_log(user)
            return list(scope.log.sessions)

    def add(self, user: str, segment: Segment) -> tuple[int, bool]:
        """Log ``segment`` durably, then index it; ``(its log position, whether it is new)``."""

        def step(live: Live, log: SessionLog) -> tuple[int, bool]:
            position, new = log.append(segment)
            try:
                self._catch_up(live, log)
            except BaseException:
                if new:  # not acknowledged: the log is left as it was (the memory is dropped)
                    log.drop_last()
                raise
            since = live.held - live.snapshotted
            if since >= self.snapshot_every and since >= live.snapshotted * SNAPSHOT_GROWTH:
                self._snapshot(user, live)
            return position, new

        return self.run(user, step)  # type: ignore[no-any-return]

    def _start(self, user: str, log: SessionLog) -> Live:
        """A new host holding the newest snapshot plus the log's later sessions."""
        pipeline = self.make_pipeline()
        try:
            found = self.store.snapshot(user, len(log))
            live = Live(pipeline, 0, 0)
            if found is not None:
                try:
                    pipeline.restore(found[1])
                    live = Live(pipeline, found[0], found[0])
                except Exception as exc:  # a snapshot the program cannot restore: rebuild
                    self.notice(f"runtime: a snapshot could not be restored ({exc}); rebuilding "
                                "this user's memory from the log")  # fmt: skip
                    pipeline.open()
            else:
                pipeline.open()
            self._catch_up(live, log)
            if live.held > live.snapshotted:
                self._snapshot(user, live)
        except BaseException:
            pipeline.close()
            raise
        return live

    def _catch_up(self, live: Live, log: SessionLog) -> None:
        """Index the log's sessions the memory does not hold yet, in order, each once."""
        for segment in log.sessions[live.held :]:
            units = live.pipeline.extract(segment)
            live.pipeline.add(segment, units)
            live.held += 1

    def _snapshot(self, user: str, live: Live) -> None:
        dumped = live.pipeline.dump()
        if dumped.state is not None:
            self.store.put_snapshot(user, live.held, dumped.state)
            live.snapshotted = live.held
        else:
            live.snapshotted = live.held  # not storable: do not ask again before the next batch
            if not self._unstored_said:
                self._unstored_said = True
                self.notice(f"runtime: this program's memory cannot be snapshotted "
                            f"({dumped.reason}); "
                            "each user's memory is rebuilt from the log when started")  # fmt: skip

    def _drop(self, user: str, scope: Scope) -> None:
        if scope.live is not None:
            scope.live.pipeline.close()
            scope.live = None
        with self._lock:
            self._recent.pop(user, None)

    def _evict_beyond(self, keep: str) -> None:
        while True:
            with self._lock:
                if len(self._recent) <= self.max_live:
                    return
                victims = [u for u in self._recent if u != keep]
            for victim in victims:
                scope = self.scope(victim)
                if scope.lock.acquire(blocking=False):
                    try:
                        self._close_scope(victim, scope)
                    finally:
                        scope.lock.release()
                    break
            else:
                return  # every other live scope is busy: over the bound until one is idle

    def _close_scope(self, user: str, scope: Scope) -> None:
        live = scope.live
        if live is not None and live.held > live.snapshotted:
            try:
                self._snapshot(user, live)
            except Exception as exc:  # the log still holds every session
                self.notice(f"runtime: a snapshot failed ({exc}); the log keeps every session")
        self._drop(user, scope)

    def live_count(self) -> int:
        with self._lock:
            return len(self._recent)

    def close(self) -> None:
        """Snapshot and close every live scope."""
        with self._lock:
            users = list(self._recent)
        for user in users:
            scope = self.scope(user)
            with scope.lock:
                self._close_scope(user, scope)
