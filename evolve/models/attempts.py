"""One transport attempt of an LLM call: what a call's attempts met, how a failed attempt is
classified, the ``Retry-After`` it carried, and the watchdog that abandons a stuck one.

Owns :class:`Attempts` (the counts of one call's attempts, its slot per attempt, and the retry
budget and pause, whose rule :mod:`evolve.models.llm` states), :class:`AttemptTimeout`,
:func:`is_transient`, :func:`fault_kind`, :func:`retry_after` and :func:`within`.

Invariants: litellm is never imported here (an error can only be litellm's once it is loaded);
:func:`within` returns or raises within its seconds plus :data:`WATCHDOG_GRACE_S`, whatever the
work does — a stuck attempt is left running in a daemon thread that holds nothing of the
caller's.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TypeVar

from evolve.models.limiter import Limiter, retry_after_seconds

T = TypeVar("T")
# Past its timeout, an attempt still running is abandoned. The HTTP library's own timeout fires
# first; this catches what it cannot (a reply trickling in), with room for a loaded machine.
WATCHDOG_GRACE_S = 5.0


class AttemptTimeout(TimeoutError):
    """One HTTP attempt ran past its timeout and was abandoned (transient: retried)."""


class Attempts:
    """What one logical call's transport attempts met so far, and the retry rule applied to
    them, with the run's ``limiter`` (None: unlimited)."""

    def __init__(self, limiter: Limiter | None) -> None:
        self.limiter = limiter
        self.attempts = 0
        self.failures = 0  # failed attempts that were not rate limits (``retry_attempts`` bounds)
        self.rate_limited = 0  # (``rate_limit_attempts`` bounds)
        self.timeouts = 0
        self.retry_after: float | None = None  # the last failed attempt's, if it had one

    @contextmanager
    def attempt(self) -> Iterator[None]:
        """One HTTP attempt (the body): it holds a limiter slot, and its outcome is counted and
        reported to the limiter (a success grows the window, a 429 backs the run off)."""
        self.attempts += 1
        self.retry_after = None
        with self.limiter.slot() if self.limiter is not None else nullcontext():
            started = time.time()
            try:
                yield
            except Exception as exc:
                self._failed(exc, started)
                raise
        if self.limiter is not None:
            self.limiter.succeeded()

    def spent(self, retry_attempts: int, rate_limit_attempts: int) -> bool:
        """Whether the call's retry budget is spent (the rule in :mod:`evolve.models.llm`)."""
        return self.failures >= retry_attempts or self.rate_limited >= rate_limit_attempts

    def pause(self, otherwise: Callable[[], float]) -> float:
        """Seconds before the next attempt: a Retry-After is waited out at the limiter (every
        process together), or here without one; any other failure waits ``otherwise()``."""
        if self.retry_after is not None:
            return 0.0 if self.limiter is not None else self.retry_after
        return otherwise()

    def _failed(self, exc: Exception, started: float) -> None:
        self.retry_after = retry_after(exc)
        kind = fault_kind(exc, self.retry_after)
        if kind == "rate_limit":
            self.rate_limited += 1
            if self.limiter is not None:
                self.limiter.rate_limited(self.retry_after, started)
            return
        self.failures += 1
        self.timeouts += 1 if kind == "timeout" else 0


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, AttemptTimeout):
        return True
    litellm = sys.modules.get("litellm")  # not imported yet: cannot be a litellm error
    if litellm is None:
        return False
    transient = (
        litellm.RateLimitError,
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.ServiceUnavailableError,
        litellm.InternalServerError,
    )
    return isinstance(exc, transient)


def fault_kind(exc: BaseException, retry_after: float | None) -> str:
    """``rate_limit`` (a 429, or a 503 with Retry-After), ``timeout`` or ``other``: how a
    failed attempt is counted."""
    if isinstance(exc, AttemptTimeout):
        return "timeout"
    litellm = sys.modules.get("litellm")
    if litellm is not None and isinstance(exc, litellm.RateLimitError):
        return "rate_limit"
    if litellm is not None and isinstance(exc, litellm.ServiceUnavailableError) and retry_after:
        return "rate_limit"
    if litellm is not None and isinstance(exc, litellm.Timeout):
        return "timeout"
    return "other"


def retry_after(exc: BaseException) -> float | None:
    """The ``Retry-After`` of the HTTP response behind a litellm error, in seconds."""
    for source in (getattr(exc, "response", None), exc):
        headers = getattr(source, "headers", None) or getattr(
            source, "litellm_response_headers", None
        )
        if headers is not None:
            value = headers.get("retry-after")
            if value is not None:
                return retry_after_seconds(str(value))
    return None


def within(seconds: float, work: Callable[[], T]) -> T:
    """``work()`` in a daemon thread, abandoned (:class:`AttemptTimeout`) when it has not
    returned ``seconds`` + :data:`WATCHDOG_GRACE_S` from now."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="llm-attempt", daemon=True)
    thread.start()
    thread.join(seconds + WATCHDOG_GRACE_S)
    if failure:
        raise failure[0]
    if not result:
        raise AttemptTimeout(f"no complete reply within {seconds:g} s: abandoned")
    return result[0]
