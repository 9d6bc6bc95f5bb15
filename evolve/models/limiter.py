"""One limit on LLM requests in flight for a whole run on one machine, with a joint back-off.

Owns :class:`Limiter`, :func:`shared_limiter` (the limiter of a run's call log on this machine,
one object per process), :func:`run_folder` (where a run's limiter and breaker live),
:data:`DEFAULT_CONCURRENCY` and :func:`retry_after_seconds` (a ``Retry-After`` header's value).

A limiter lives in a folder of small files (design §2): ``slot-<i>.lock`` for each of the
``limit`` slots, and ``state`` (the shared window and "not before" time). Every process that
opens a limiter on the same folder — the executor's worker processes, the parent's judge,
annotator and coder clients — shares one limit; :func:`shared_limiter` keys the folder on the
run's call log and puts it in this machine's temporary directory, so on Ray the limit is per
node. Making one removes the folders of runs long gone (untouched for :data:`FORGET_S`, no slot
held), so the temporary directory does not fill with a folder per call log ever used.

Invariants:

- A slot is an exclusive ``flock`` on its lock file, taken with ``LOCK_NB`` through the
  process's own open file description. The kernel drops the lock when its holder dies, also on
  ``SIGKILL``: a killed process never leaks a slot. A child process made by ``fork`` closes the
  descriptors it inherited (they share their parent's locks) and opens its own.
- At most ``limit`` requests hold a slot at once across every process; a new request takes a
  slot only among the first ``floor(window)`` ones, so at most ``window`` new ones start.
- The window adapts AIMD, shared across processes: a success adds ``1 / window`` (one slot per
  window's worth of successes), a 429 halves it — at most once per burst: only a request that
  started after the last decrease halves it again — and it stays in ``[1, limit]``.
- A 429 sets the shared "not before" time to now + its ``Retry-After`` (or
  :data:`DEFAULT_BACKOFF_S` without one); no process starts a request before it. The time only
  moves forward. A state untouched for :data:`STALE_S` seconds is read as fresh (full window).
- The folders are private: ``prismem-llm-<uid>`` and each limiter folder in it are made with
  mode 0700 (one others may only read is closed to 0700); a folder that is a link, belongs to
  another user or that others may write to is refused (:func:`private_dir`,
  :class:`PermissionError`) before any file in it is opened, and files are opened with
  ``O_NOFOLLOW``, so a planted link is never followed.
- The state is read under a shared and written under an exclusive ``flock`` of ``state``;
  within a process, one lock serialises every use of the limiter's descriptors, so it is safe
  to use from many threads.
"""

from __future__ import annotations

import email.utils
import fcntl
import hashlib
import os
import random
import stat
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONCURRENCY = 16
DEFAULT_BACKOFF_S = 1.0  # the joint back-off after a 429 that names no Retry-After
STALE_S = 600.0  # a state untouched this long is a previous run's: read as fresh
FORGET_S = 86400.0  # a folder untouched this long, no slot held, is removed (_sweep)
POLL_S = (0.005, 0.05)  # first and longest pause between looks for a free slot
_STATE = struct.Struct("<dddd")  # window, not_before, decreased_at, updated (unix seconds)
_LIMITERS: weakref.WeakSet[Limiter] = weakref.WeakSet()  # to forget their descriptors on fork
_SHARED: dict[tuple[str, int], Limiter] = {}  # shared_limiter's, per (folder, limit)
_SHARED_LOCK = threading.Lock()


@dataclass(frozen=True)
class LimiterState:
    """The shared state: the AIMD window, the time before which no request starts, when the
    window was last halved and when the state was last written (unix seconds)."""

    window: float
    not_before: float = 0.0
    decreased_at: float = 0.0
    updated: float = 0.0


class Limiter:
    """Slots under ``root`` shared by every process that opens the same folder (see the module
    docstring); ``limit`` is the most requests in flight at once."""

    def __init__(self, root: Path, limit: int = DEFAULT_CONCURRENCY) -> None:
        if limit < 1:
            raise ValueError(f"the LLM concurrency must be at least 1, not {limit}")
        self.root = Path(root)
        self.limit = limit
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}
        self._held: set[int] = set()
        _LIMITERS.add(self)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for the body (one HTTP attempt); blocks until one is free and the
        shared "not before" time has passed."""
        index = self._acquire()
        try:
            yield
        finally:
            self._release(index)

    def state(self) -> LimiterState:
        with self._lock:
            return self._read(fcntl.LOCK_SH)

    def succeeded(self) -> None:
        """Additive increase: one slot more per window's worth of successes."""
        with self._lock, self._locked_state() as state:
            self._write(state.window + 1.0 / state.window, state.not_before, state.decreased_at)

    def rate_limited(self, retry_after: float | None, started: float) -> None:
        """A request started at ``started`` (unix seconds) got a 429: back off jointly until
        ``retry_after`` seconds from now, and halve the window once per burst."""
        now = time.time()
        wait = DEFAULT_BACKOFF_S if retry_after is None else max(retry_after, 0.0)
        with self._lock, self._locked_state() as state:
            window, decreased = state.window, state.decreased_at
            if started >= decreased:
                window, decreased = window / 2, now
            self._write(window, max(state.not_before, now + wait), decreased)

    def _acquire(self) -> int:
        pause = POLL_S[0]
        while True:
            with self._lock:
                state = self._read(fcntl.LOCK_SH)
                now = time.time()
                index = self._try_slots(int(state.window)) if now >= state.not_before else None
            if index is not None:
                return index
            if now < state.not_before:  # wake at the shared time, spread a little
                time.sleep(state.not_before - now + random.uniform(0, POLL_S[0]))
            else:
                time.sleep(random.uniform(pause / 2, pause))
                pause = min(pause * 2, POLL_S[1])

    def _try_slots(self, window: int) -> int | None:
        for index in range(min(max(window, 1), self.limit)):
            if index in self._held:
                continue
            try:
                fcntl.flock(self._fd(f"slot-{index}.lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            self._held.add(index)
            return index
        return None

    def _release(self, index: int) -> None:
        with self._lock:
            fcntl.flock(self._fd(f"slot-{index}.lock"), fcntl.LOCK_UN)
            self._held.discard(index)

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            if not self._fds:  # the first file of this process: the folders are checked first
                for folder in (self.root.parent, self.root):
                    private_dir(folder)
            fd = os.open(self.root / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            self._fds[name] = fd
        return fd

    def _read(self, lock: int) -> LimiterState:
        fd = self._fd("state")
        fcntl.flock(fd, lock)
        try:
            raw = os.pread(fd, _STATE.size, 0)
        finally:
            if lock == fcntl.LOCK_SH:
                fcntl.flock(fd, fcntl.LOCK_UN)
        if len(raw) < _STATE.size:
            return LimiterState(float(self.limit))
        state = LimiterState(*_STATE.unpack(raw))
        if time.time() - state.updated > STALE_S:
            return LimiterState(float(self.limit))
        window = min(max(state.window, 1.0), float(self.limit))
        return LimiterState(window, state.not_before, state.decreased_at, state.updated)

    @contextmanager
    def _locked_state(self) -> Iterator[LimiterState]:
        """The state, read and held under an exclusive lock until the body ends (the caller
        holds ``self._lock``)."""
        try:
            yield self._read(fcntl.LOCK_EX)
        finally:
            fcntl.flock(self._fd("state"), fcntl.LOCK_UN)

    def _write(self, window: float, not_before: float, decreased_at: float) -> None:
        window = min(max(window, 1.0), float(self.limit))
        os.pwrite(self._fd("state"), _STATE.pack(window, not_before, decreased_at, time.time()), 0)

    def _forget_after_fork(self) -> None:
        """In a forked child: the inherited descriptors share the parent's locks; close them."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._held.clear()
        self._lock = threading.Lock()


def _after_fork() -> None:
    for limiter in list(_LIMITERS):
        limiter._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork)


def shared_limiter(log_path: Path | None, limit: int = DEFAULT_CONCURRENCY) -> Limiter:
    """The limiter of the run whose calls go to ``log_path``, on this machine: every client of
    one run logs to one file, so keying on it gives the run one limit (a client without a log
    gets one of its own process). One object per process and (folder, limit), so a worker that
    builds a client per job keeps one set of open lock files."""
    root = run_folder(log_path)
    key = (str(root), limit)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _sweep(root.parent, keep=root)
            _SHARED[key] = Limiter(root, limit)
        return _SHARED[key]


def run_folder(log_path: Path | None) -> Path:
    """The folder of the run whose calls go to ``log_path`` on this machine (its limiter and
    its breaker, :mod:`evolve.models.breaker`): in the temporary directory, keyed on the log;
    without a log, this process's own."""
    scope = str(Path(log_path).resolve()) if log_path is not None else f"pid-{os.getpid()}"
    digest = hashlib.sha256(scope.encode("utf-8")).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"prismem-llm-{os.getuid()}" / digest


def _sweep(parent: Path, keep: Path) -> None:
    """Remove the limiter folders under ``parent`` of runs long gone: nothing in them written
    for :data:`FORGET_S` seconds and no slot held now (a run that wakes up after that opens its
    folder anew). A folder another process is sweeping or using is left alone."""
    cutoff = time.time() - FORGET_S
    try:
        folders = [p for p in parent.iterdir()
                   if p.is_dir() and not p.is_symlink() and p != keep]  # fmt: skip
    except OSError:  # no parent yet
        return
    for folder in folders:
        try:
            files = list(folder.iterdir())
            if max([folder.stat().st_mtime, *(f.stat().st_mtime for f in files)]) > cutoff:
                continue
            if any(_held(f) for f in files if f.name.startswith("slot-")):
                continue
            for f in files:
                f.unlink()
            folder.rmdir()
        except OSError:
            continue


def private_dir(path: Path) -> None:
    """Make ``path`` (mode 0700) unless it exists; refuse it, with PermissionError, unless it
    is a real folder (not a link) owned by this user that no one else could write to; one that
    others may only read or enter (an older version's 0755) is closed to 0700."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"LLM limiter: {path} is not a folder (a link?); remove it")
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(
            f"LLM limiter: {path} belongs to uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):o}; it must be yours and writable by you only: "
            "remove it"
        )
    if info.st_mode & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)


def _held(path: Path) -> bool:
    """Whether some process holds the slot lock file at ``path`` now."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the lock this check may have taken
    return False


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date; None when
    absent or unreadable."""
    if value is None or not value.strip():
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)
