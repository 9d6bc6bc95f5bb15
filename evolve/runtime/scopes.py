"""Live scopes: confined hosts per user (scope) id, a bounded pool of them, and their locks.

Owns :class:`Scopes`. A scope's memory lives in pipelines
(:class:`evolve.evaluation.pipeline.Pipeline`:
the program in its own confined host), each built from the memory store (:mod:`.store`): the newest
snapshot of the deployment's build, then the log's sessions after it.

Invariants:

- **Users apart.** Every host serves one scope only, for its whole life: a scope's hosts are
  closed when it is evicted, and its next use starts new ones. Program code is hostile and its
  module globals live as long as its host, so this is what keeps one user's text from another's
  context, whatever the program does.
- **No channel through a cache.** A program can time whatever it asks for, so a cache hit on a
  text another user's memory embedded (or a prompt another user's program sent) would tell it
  that text. Each pipeline is made for its scope (``make_pipeline(user)``) with an embedder and
  a task-model client of the scope's own, whose caches (in memory and in the scope's folder)
  hold the scope's requests only: another user's texts are misses, and no user's use evicts
  another's entries. What the scopes do share (the process, the model's weights, the task
  model's limit on requests in flight, the CPU, the pool of hosts) holds no user's text.
- **Writes serialised, reads concurrent.** Each scope has a readers-writer lock
  (:mod:`.rwlock`). A write (``add``, ``forget``, snapshot, eviction, close) holds it alone; reads
  (``context``, ``answer``, ``history``) hold it together, so the task model's planning and
  answer calls of one user's reads overlap, and no read sees half a session. A host serves one
  request at a time, so the program's own steps (its ``postprocess_query`` hook, ``retrieve``)
  of one user's reads share a host by taking turns, unless the scope has more than one: a
  read that finds every host of its scope busy starts another, up to ``read_hosts``.
  Operations on different scopes run side by side.
- **A scope's hosts hold the same memory.** The first is started from the store; a further one
  is started from the store too, under the read lock (so from the same log). An ``add``
  extracts the session once and indexes those units in every host of the scope (side by side),
  under the write lock; every host holds the same sessions when the write lock is released.
- **Acknowledged = logged, then indexed.** :meth:`Scopes.add` appends the session to the
  scope's log (fsync'd) before the hosts index it, and returns after both. When indexing fails
  the session is taken back out of the log and the scope's hosts are closed: its next use
  rebuilds the memory from the log, so a failed ``add`` leaves nothing behind (a crash between
  the append and the return leaves the whole session logged, never half of it). A read whose
  host broke closes that host (the next read starts another); a read whose program raised
  keeps it (``retrieve`` cannot change the memory: :mod:`sandbox.readonly`).
- **Bounded.** At most ``max_live`` hosts stay started: using a scope evicts the least recently
  used idle scope — its memory is dumped to a snapshot (when the program's state can be stored)
  and its hosts closed. A scope in use in another thread is never evicted; the pool can then
  hold more hosts than ``max_live`` until one is idle.
- **Snapshots cost linear time in all.** A memory is snapshotted (under the write lock, from
  the scope's first host) when ``snapshot_every`` sessions and :data:`SNAPSHOT_GROWTH` times
  the sessions of its last snapshot (or the last restored) have been added since, counting a
  log tail indexed when it was started (a dump costs time in the memory's size, so evenly
  spaced snapshots would make ingest quadratic), and when its scope is evicted or closed. After a
  crash, at most that tail of the log is indexed again.
- **Forget rebuilds.** :meth:`Scopes.forget` closes the scope's hosts (their memory holds the
  session) without a snapshot, then removes its files (:mod:`.upkeep`) under the write lock;
  the next use starts from what the store holds then.
- A memory whose state cannot be stored is rebuilt from the log each time its scope is started;
  the reason is reported once per store (``notice``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from contract.types import Segment
from evolve.evaluation.pipeline import Pipeline
from evolve.fanout import ordered_map
from evolve.runtime.log import SessionLog
from evolve.runtime.rwlock import ReadWriteLock
from evolve.runtime.store import MemoryStore
from evolve.runtime.upkeep import forget_scope, forget_session

SNAPSHOT_GROWTH = 0.25  # a new snapshot waits for this share of the sessions the last one held


@dataclass
class Live:
    """One started host of a scope: its pipeline and how many log sessions its memory holds."""

    pipeline: Pipeline
    held: int  # sessions of the log the memory holds (always a prefix of the log)
    reads: int = 0  # reads in flight on this host (under its scope's monitor)


@dataclass
class Scope:
    """One user's log and hosts. ``monitor`` (a condition) protects the fields after it (held
    briefly, never across a host call); ``lock`` is the readers-writer lock of the module's
    invariants."""

    lock: ReadWriteLock = field(default_factory=ReadWriteLock)
    monitor: threading.Condition = field(default_factory=threading.Condition)
    log: SessionLog | None = None
    lives: list[Live] = field(default_factory=list)  # started hosts, lives[0] snapshots
    starting: int = 0  # hosts being started by reads
    snapshotted: int = 0  # sessions the newest snapshot of this memory holds


def _index(live: Live, *, segment: Segment, units: list[dict[str, Any]]) -> None:
    live.pipeline.add(segment, units)


class Scopes:
    """The scopes of one opened store (see the module's invariants)."""

    def __init__(
        self,
        store: MemoryStore,
        make_pipeline: Callable[[str], Pipeline],
        *,
        max_live: int,
        snapshot_every: int,
        notice: Callable[[str], None],
        read_hosts: int = 1,
    ) -> None:
        self.store = store
        self.make_pipeline = make_pipeline
        self.max_live = max_live
        self.snapshot_every = snapshot_every
        self.notice = notice
        self.read_hosts = read_hosts
        self._scopes: dict[str, Scope] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()  # scopes with hosts, LRU first
        self._hosts = 0  # hosts started in all scopes
        self._lock = threading.Lock()  # the three fields above
        self._unstored_said = False

    def scope(self, user: str) -> Scope:
        with self._lock:
            return self._scopes.setdefault(user, Scope())

    def _log(self, user: str, scope: Scope) -> SessionLog:
        with scope.monitor:
            if scope.log is None:
                scope.log = self.store.open_log(user)
            return scope.log

    # -- reads ---------------------------------------------------------------------------

    def read(self, user: str, fn: Callable[[Live], Any]) -> Any:
        """``fn(a host of the scope)`` under the scope's read lock (:meth:`_borrow` picks the
        host)."""
        scope = self.scope(user)
        with scope.lock.reading():
            live = self._borrow(user, scope)
            try:
                result = fn(live)
            finally:
                self._give_back(user, scope, live)
        self._used(user)
        return result

    def history(self, user: str) -> list[Segment]:
        """The sessions of the user's log, read under the scope's read lock (never beside an
        append, whose record an open would take for a torn tail)."""
        scope = self.scope(user)
        with scope.lock.reading():
            return list(self._log(user, scope).sessions)

    def _borrow(self, user: str, scope: Scope) -> Live:
        """A host for one read: an idle one, else a new one while the scope may have more,
        else the one serving the fewest reads (its host calls take turns)."""
        log = self._log(user, scope)
        with scope.monitor:
            while True:
                idle = [live for live in scope.lives if not live.reads]
                if idle or (scope.lives and len(scope.lives) + scope.starting >= self.read_hosts):
                    live = idle[0] if idle else min(scope.lives, key=lambda x: x.reads)
                    live.reads += 1
                    return live
                if len(scope.lives) + scope.starting < self.read_hosts:
                    scope.starting += 1
                    break
                scope.monitor.wait()  # the scope's first host is being started by another read
        try:
            live, restored = self._start(user, log)
        except BaseException:
            with scope.monitor:
                scope.starting -= 1
                scope.monitor.notify_all()
            raise
        with scope.monitor:
            scope.starting -= 1
            if not scope.lives:
                scope.snapshotted = restored
            live.reads = 1
            scope.lives.append(live)
            scope.monitor.notify_all()
        self._counted(user, +1)
        return live

    def _give_back(self, user: str, scope: Scope, live: Live) -> None:
        """End one read of ``live``; a host that broke is closed (the next read starts
        another; a program that raised keeps its host, whose memory retrieve cannot change)."""
        with scope.monitor:
            live.reads -= 1
            closing = live.pipeline.broken and live in scope.lives
            if closing:
                scope.lives.remove(live)
            left = len(scope.lives) + scope.starting
        if closing:
            live.pipeline.close()
            self._counted(user, -1, gone=not left)

    # -- writes --------------------------------------------------------------------------

    def add(self, user: str, segment: Segment) -> tuple[int, bool]:
        """Log ``segment`` durably, then index it in every host of the scope;
        ``(its log position, whether it is new)``."""
        scope = self.scope(user)
        with scope.lock.writing():
            log = self._log(user, scope)
            try:
                if not scope.lives:
                    live, scope.snapshotted = self._start(user, log)
                    scope.lives.append(live)
                    self._counted(user, +1)
                position, new = log.append(segment)
                try:
                    self._catch_up(scope.lives, log)
                except BaseException:
                    if new:  # not acknowledged: the log is left as it was (the memory dropped)
                        log.drop_last()
                    raise
                held = scope.lives[0].held
                since = held - scope.snapshotted
                if since >= self.snapshot_every and since >= scope.snapshotted * SNAPSHOT_GROWTH:
                    self._snapshot(user, scope)
            except BaseException:
                self._drop(user, scope)
                raise
        self._used(user)
        return position, new

    def forget(self, user: str, session_id: str | None) -> int:
        """Forget one session of the scope (None: the whole scope) under its write lock; the
        sessions forgotten (an unknown session id: 0, and nothing is changed)."""
        scope = self.scope(user)
        folder = self.store.scope_dir(user)
        with scope.lock.writing():
            if session_id is not None and self._log(user, scope).position(session_id) is None:
                return 0
            self._drop(user, scope)
            with scope.monitor:
                scope.log = None  # read again from the store at the next use
                scope.snapshotted = 0
            if session_id is None:
                return forget_scope(self.store.root, folder)
            return forget_session(folder, session_id)

    def _start(self, user: str, log: SessionLog) -> tuple[Live, int]:
        """A new host holding the newest snapshot plus the log's later sessions; with the
        sessions that snapshot holds (0: none was restored)."""
        pipeline = self.make_pipeline(user)
        try:
            found = self.store.snapshot(user, len(log))
            live = Live(pipeline, 0)
            if found is not None:
                try:
                    pipeline.restore(found[1])
                    live.held = found[0]
                except Exception as exc:  # a snapshot the program cannot restore: rebuild
                    self.notice(f"runtime: a snapshot could not be restored ({exc}); rebuilding "
                                "this user's memory from the log")  # fmt: skip
                    pipeline.open()
            else:
                pipeline.open()
            restored = live.held
            self._catch_up([live], log)
        except BaseException:
            pipeline.close()
            raise
        return live, restored

    def _catch_up(self, lives: list[Live], log: SessionLog) -> None:
        """Index the log's sessions the hosts (which hold the same sessions) do not hold yet,
        in order, each once: extracted by the first host, indexed by all, side by side."""
        first = lives[0]
        assert all(live.held == first.held for live in lives), "a scope's hosts differ"
        for segment in log.sessions[first.held :]:
            units = first.pipeline.extract(segment)
            ordered_map(partial(_index, segment=segment, units=units), lives, len(lives))
            for live in lives:
                live.held += 1

    def _snapshot(self, user: str, scope: Scope) -> None:
        live = scope.lives[0]
        dumped = live.pipeline.dump()
        scope.snapshotted = live.held  # not storable: do not ask again before the next batch
        if dumped.state is not None:
            self.store.put_snapshot(user, live.held, dumped.state)
        elif not self._unstored_said:
            self._unstored_said = True
            self.notice(f"runtime: this program's memory cannot be snapshotted "
                        f"({dumped.reason}); "
                        "each user's memory is rebuilt from the log when started")  # fmt: skip

    # -- the pool ------------------------------------------------------------------------

    def _counted(self, user: str, change: int, gone: bool = False) -> None:
        """``change`` hosts started (or closed) in ``user``'s scope; ``gone``: it has none."""
        with self._lock:
            self._hosts += change
            if gone:
                self._recent.pop(user, None)
            else:
                self._recent[user] = None

    def _used(self, user: str) -> None:
        with self._lock:
            if user in self._recent:
                self._recent.move_to_end(user)
        self._evict_beyond(keep=user)

    def _drop(self, user: str, scope: Scope) -> None:
        """Close every host of the scope (the caller holds its write lock)."""
        with scope.monitor:
            lives, scope.lives = scope.lives, []
        for live in lives:
            live.pipeline.close()
        with self._lock:
            self._hosts -= len(lives)
            self._recent.pop(user, None)

    def _evict_beyond(self, keep: str) -> None:
        while True:
            with self._lock:
                if self._hosts <= self.max_live:
                    return
                victims = [u for u in self._recent if u != keep]
            for victim in victims:
                scope = self.scope(victim)
                if scope.lock.try_write():
                    try:
                        self._close_scope(victim, scope)
                    finally:
                        scope.lock.release_write()
                    break
            else:
                return  # every other scope is in use: over the bound until one is idle

    def _close_scope(self, user: str, scope: Scope) -> None:
        if scope.lives and scope.lives[0].held > scope.snapshotted:
            try:
                self._snapshot(user, scope)
            except Exception as exc:  # the log still holds every session
                self.notice(f"runtime: a snapshot failed ({exc}); the log keeps every session")
        self._drop(user, scope)

    def live_count(self) -> int:
        """Hosts started, in all scopes."""
        with self._lock:
            return self._hosts

    def close(self) -> None:
        """Snapshot and close every live scope."""
        with self._lock:
            users = list(self._recent)
        for user in users:
            scope = self.scope(user)
            with scope.lock.writing():
                self._close_scope(user, scope)
