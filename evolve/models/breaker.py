"""A run's circuit breaker on its model endpoint: a dead endpoint stops every process of the run.

Owns :class:`Breaker`, :func:`shared_breaker` (the breaker of a run's call log on this machine,
one object per process), :class:`EndpointDown`, :func:`is_endpoint_down`, :func:`refusal`
(what in a failed attempt says the endpoint is not there at all) and the thresholds
:data:`FAILED_CALLS` and :data:`FAILED_ATTEMPTS`.

The breaker lives in the run's limiter folder (:func:`evolve.models.limiter.run_folder`), as the
file ``breaker``: every process that calls models for the run — the evaluation workers and the
parent's judge, coder and annotator — reads and writes the same one, so a trip seen by one worker
stops them all. :class:`~evolve.models.llm.LLMClient` asks :meth:`Breaker.check` before every
transport attempt and reports each attempt's and each call's outcome.

Invariants:

- It trips on the first attempt whose connection was refused or whose host does not resolve
  (:func:`refusal`: nothing listens there), on :data:`FAILED_CALLS` calls in a row that spent
  their retries on transient failures, or on :data:`FAILED_ATTEMPTS` transient failures in a
  row (timeouts of a hanging server) — "in a row" across every process of the run: any
  successful attempt resets both counts. Rate limits count neither way; errors that are not
  transient (a bad request) are the call's own and count neither way.
- Tripped, every attempt of the run is refused at once with :class:`EndpointDown`, whose one
  line names the endpoint and what was seen; its text starts with :data:`ENDPOINT_DOWN`, so a
  failure that crossed a process boundary as text is still known (:func:`is_endpoint_down`).
- A trip holds until :meth:`Breaker.reset` (a command starts a run or an evaluation: the
  endpoint may be back) or for :data:`TRIP_TTL_S` seconds, after which attempts go out again.
- The state is one small JSON file, read under a shared and rewritten under an exclusive
  ``flock``; it is opened with ``O_NOFOLLOW`` in a private folder
  (:func:`evolve.models.limiter.private_dir`). An unreadable state reads as closed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from evolve.models.calllog import LLMError
from evolve.models.limiter import private_dir, run_folder

ENDPOINT_DOWN = "model endpoint down"
FAILED_CALLS = 3  # calls in a row that spent their retries on transient failures
FAILED_ATTEMPTS = 20  # transient failures in a row (at 30 % faults: 1 in 3e10)
TRIP_TTL_S = 600.0
_SHARED: dict[str, Breaker] = {}
_SHARED_LOCK = threading.Lock()


class EndpointDown(LLMError):
    """The run's breaker is tripped: its model endpoint is down; the message says why."""


def is_endpoint_down(text: str | None) -> bool:
    """Whether a failure's text (a trace error, an exception's message) is a breaker refusal."""
    return bool(text) and ENDPOINT_DOWN in str(text)


@dataclass
class BreakerState:
    failed_calls: int = 0
    failed_attempts: int = 0
    tripped_at: float = 0.0  # unix seconds; 0: closed
    endpoint: str = ""  # the endpoint that tripped it
    why: str = ""


def refusal(exc: BaseException) -> str | None:
    """What in ``exc`` (or its causes) says nothing serves the endpoint: a refused connection
    or a host that does not resolve; None otherwise."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        if isinstance(e, socket.gaierror):
            return f"host not found ({e.strerror or e})"
        text = str(e)
        if "Connection refused" in text or "[Errno 111]" in text:
            return "connection refused"
        stack += [c for c in (e.__cause__, e.__context__) if c is not None]
        stack += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
    return None


class Breaker:
    """The breaker in ``root`` (the run's limiter folder), shared by every process of the run."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise :class:`EndpointDown` if the run's breaker is tripped."""
        if self.tripped():
            state = self._read()
            raise EndpointDown(
                f"{ENDPOINT_DOWN}: {state.endpoint}: {state.why}; the run stops here — resume "
                "it once the endpoint answers again"
            )

    def tripped(self) -> bool:
        """Whether the breaker is tripped now (attempts are refused)."""
        state = self._read()
        return bool(state.tripped_at) and time.time() - state.tripped_at < TRIP_TTL_S

    def attempt_failed(self, endpoint: str, exc: BaseException, transient: bool) -> None:
        """One failed attempt: a refusal trips at once; a transient failure counts."""
        why = refusal(exc)
        if why is None and not transient:
            return
        with self._update() as state:
            state.failed_attempts += 1
            if why is None and state.failed_attempts >= FAILED_ATTEMPTS:
                why = f"{state.failed_attempts} attempts in a row failed, the last {_short(exc)}"
            if why is not None and not state.tripped_at:
                state.tripped_at, state.endpoint, state.why = time.time(), endpoint, why

    def call_failed(self, endpoint: str, exc: BaseException) -> None:
        """One call that spent its retries on transient failures."""
        with self._update() as state:
            state.failed_calls += 1
            if state.failed_calls >= FAILED_CALLS and not state.tripped_at:
                state.tripped_at, state.endpoint = time.time(), endpoint
                state.why = (f"{state.failed_calls} calls in a row failed after their retries, "
                             f"the last {_short(exc)}")  # fmt: skip

    def succeeded(self) -> None:
        """A successful attempt: both counts start again (written only when one is not 0)."""
        state = self._read()
        if state.failed_calls or state.failed_attempts:
            with self._update() as fresh:
                fresh.failed_calls = fresh.failed_attempts = 0

    def reset(self) -> None:
        """Close the breaker (a command starts: the endpoint may be back)."""
        with self._update() as state:
            state.__dict__.update(asdict(BreakerState()))

    def state(self) -> BreakerState:
        return self._read()

    def _path(self) -> Path:
        for folder in (self.root.parent, self.root):
            private_dir(folder)
        return self.root / "breaker"

    def _open(self) -> int:
        return os.open(self._path(), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def _read(self) -> BreakerState:
        try:
            fd = self._open()
        except OSError:
            return BreakerState()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _parse(os.pread(fd, 4096, 0))
        finally:
            os.close(fd)  # drops the lock

    @contextmanager
    def _update(self) -> Iterator[BreakerState]:
        """The state as a mutable object, written back when the body ends, under an exclusive
        lock of the file (and this object's lock, for threads)."""
        with self._lock:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                state = _parse(os.pread(fd, 4096, 0))
                yield state
                data = json.dumps(asdict(state)).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
            finally:
                os.close(fd)


def _parse(raw: bytes) -> BreakerState:
    try:
        data = json.loads(raw or b"{}")
        return BreakerState(int(data["failed_calls"]), int(data["failed_attempts"]),
                            float(data["tripped_at"]), str(data["endpoint"]),
                            str(data["why"]))  # fmt: skip
    except (ValueError, TypeError, KeyError, AttributeError):  # new or unreadable: closed
        return BreakerState()


def _short(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:160]


def shared_breaker(log_path: Path | None) -> Breaker:
    """The breaker of the run whose calls go to ``log_path`` on this machine (beside its
    limiter); one object per process and folder."""
    root = run_folder(log_path)
    with _SHARED_LOCK:
        return _SHARED.setdefault(str(root), Breaker(root))
