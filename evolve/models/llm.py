"""LLM calls by role: configuration, transport with retries, JSON repair, request cache, accounting.

Owns :data:`ROLES`, :class:`ModelConfig`, :class:`Models`, :class:`LLMClient`, :class:`Completion`,
:class:`UsageRecord` and :class:`JSONReplyError`; re-exports
:class:`~evolve.models.calllog.LLMError`. The request itself (one litellm call, its reply read
back, the JSON in a reply's text) is :mod:`evolve.models.transport`; one transport attempt and
the retry rule's bookkeeping are :mod:`evolve.models.attempts`; the call log's table and its
readers, :mod:`evolve.models.calllog`.

Invariants:

- Construction never imports litellm nor touches the network; litellm is imported on the first
  real transport call (with ``LITELLM_LOCAL_MODEL_COST_MAP`` set, so it never fetches prices).
- Every :meth:`LLMClient.complete` call — success, cache hit (``cached=True``, cost 0) or failure —
  becomes one :class:`UsageRecord`, kept in memory and, when ``log_path`` is set, appended to the
  call log (:func:`evolve.models.calllog.append`). Token counts on a cache hit are those of the
  cached response (the work the request represents); ``cost_usd`` is money actually spent (None
  when litellm has no price).
- The request cache (``cache_path``; :mod:`evolve.models.requestcache`) is read before a call
  and written after a success; a reply :meth:`LLMClient.complete_json` finds no usable JSON in
  is dropped from it again.
- A call that would reach a model is first admitted under the caps of the run it logs to
  (:func:`evolve.models.spendcap.admit`, counted in flight until its record is logged); a
  refusal raises :class:`~evolve.models.spendcap.SpendCapReached` and is not logged.
- Each HTTP attempt holds one slot of the client's :class:`~evolve.models.limiter.Limiter`
  (the run's shared limit; none: unlimited) for the attempt only, never across a retry's sleep,
  and is abandoned after the timeout (the client's ``timeout``, else the model's) plus
  a grace, even when the reply trickles in (:func:`evolve.models.attempts.within`), so a reply
  that never completes holds neither the caller nor a slot.
- Transient transport errors (rate limit, timeout, connection, 503, 500, a malformed body) are
  retried; anything else raises :class:`LLMError` with a one-line message. The retry budget
  (design §2): a call fails for good after ``retry_attempts`` attempts that failed for any
  reason but a rate limit, or after ``rate_limit_attempts`` rate-limited ones (a 429, or a 503
  with Retry-After), whichever comes first, so a provider's rate limits do not spend the
  budget meant for real failures. A ``Retry-After`` (seconds or an HTTP date) is waited out
  jointly: the limiter's shared "not before" time holds every process of the run back (without
  a limiter, the call sleeps it itself); other failures wait ``retry_wait`` (exponential
  backoff with jitter). A timed-out attempt counts as a real failure. A call's retries are
  logged at DEBUG, but its :data:`LOUD_RETRY`-th, a warning: every retry is in the call log.
- A client with a ``breaker`` (the run's, :mod:`evolve.models.breaker`) reports every
  attempt's outcome to it and asks it before each call and attempt: tripped, a call is refused
  at once with :class:`~evolve.models.breaker.EndpointDown` (not logged when no attempt was
  made) and a call in its retries stops retrying.
- The record of a call counts its transport ``retries`` (attempts after the first), how many
  of its attempts were ``rate_limited`` (429) and how many ``timeouts``, and ``repair`` (the
  call re-asked for valid JSON after an unusable reply, :meth:`LLMClient.complete_json`).
- A client is safe to call from many threads: the records are kept under a lock, and each
  SQLite transaction (call log, request cache) borrows a connection from the process's pool for
  that file (:func:`evolve.models.sqlite_connection`), so threads that end leave none open.
- Importing this module loads none of a client's call machinery (transport, attempts,
  breaker, spend caps, request cache, usage tallies, secret scrubbing): each method imports
  what it uses, so what only needs the records (:class:`ModelConfig`, :class:`Models`), as the
  runtime does offline, stays light (``tests/test_layers.py`` counts the modules it loads).
- API keys are never written: ModelConfig holds none (litellm reads them from the environment;
  a local server given by ``api_base`` with no key in the environment gets
  :data:`~evolve.models.transport.LOCAL_API_KEY`),
  secret-named extra params are left out of the request hash, and error texts are redacted
  (both by the rules of :mod:`evolve.scrub`).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from evolve.models import calllog
from evolve.models.calllog import LLMError
from evolve.models.limiter import Limiter

if TYPE_CHECKING:
    from evolve.models.attempts import Attempts
    from evolve.models.breaker import Breaker

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROLES = ("task", "judge", "annotator", "coder")
JSON_ATTEMPTS = 3
# The retry of a call that says so on stderr (a warning): earlier retries are logged at DEBUG
# only, as every retry is counted in the call log, so a flaky provider does not flood the run.
LOUD_RETRY = 3

T = TypeVar("T")
Message = dict[str, Any]
log = logging.getLogger(__name__)


class JSONReplyError(LLMError):
    """The model answered, but no reply held valid JSON after :data:`JSON_ATTEMPTS` attempts."""


class ModelConfig(BaseModel):
    """One role's model. ``model`` is a litellm id, e.g. ``openai/qwen3`` with ``api_base``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    temperature: float = 0.0
    max_tokens: int = 1024
    timeout: float = 120.0
    api_base: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class Models(BaseModel):
    """Role → ModelConfig; None means the role is not configured. ``models["task"]``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: ModelConfig | None = None
    judge: ModelConfig | None = None
    annotator: ModelConfig | None = None
    coder: ModelConfig | None = None

    def __getitem__(self, role: str) -> ModelConfig | None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        config: ModelConfig | None = getattr(self, role)
        return config


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    latency_s: float
    cached: bool
    model: str
    request_hash: str = ""  # the request's key in the request cache (set by complete)


@dataclass(frozen=True)
class UsageRecord:
    """One ``complete`` call as logged; picklable, so workers can ship theirs to the parent."""

    ts: float
    role: str
    purpose: str  # what the call is for ("eval/extract", "cold_start/propose"); stored in the
    # ``stage`` column of calls.sqlite (evolve.models.calllog maps the name both ways)
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    latency_s: float
    cached: bool
    request_hash: str
    error: str | None
    retries: int = 0  # transport attempts after the first
    rate_limited: int = 0  # attempts answered 429
    timeouts: int = 0  # attempts abandoned at their timeout
    repair: bool = False  # the call re-asked for valid JSON (LLMClient.complete_json)


def _say_retry(state: RetryCallState, call: str, config: ModelConfig) -> None:
    """Log a retry of ``call``: a warning at its :data:`LOUD_RETRY`-th attempt, else DEBUG."""
    failure = state.outcome.exception() if state.outcome is not None else None
    pause = state.next_action.sleep if state.next_action is not None else 0.0
    loud = state.attempt_number == LOUD_RETRY
    why = _redact(f"{type(failure).__name__}: {failure}", config)[:200]
    more = " (its further retries are counted, not shown)" if loud else ""
    log.log(logging.WARNING if loud else logging.DEBUG,
            "%s %s: attempt %d failed (%s); retrying in %.1f s%s",
            call, config.model, state.attempt_number, why, pause, more)  # fmt: skip


def _endpoint(config: ModelConfig) -> str:
    """The endpoint a config's calls go to, as a breaker names it."""
    return f"{config.api_base} ({config.model})" if config.api_base else config.model


def _as_messages(messages: list[Message] | str) -> list[Message]:
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)


def _redact(text: str, config: ModelConfig) -> str:
    """One line, at most 500 characters, with environment and config secrets masked as
    ``***`` (:func:`evolve.scrub.mask_secrets`)."""
    from evolve.scrub import is_secret_name, mask_secrets, secret_values

    extra = [str(v) for k, v in config.extra.items() if is_secret_name(k)]
    return " ".join(mask_secrets(text, secret_values(extra), "***").split())[:500]


class LLMClient:
    """Role-based LLM calls through litellm. Paths may be the same file; None = memory only.

    ``limiter`` is the run's shared limit on requests in flight (None: unlimited); ``timeout``
    the seconds one attempt may take (None: each model's ``timeout``). ``retry_attempts``,
    ``rate_limit_attempts`` and ``retry_wait`` (tenacity) govern transport retries (the rule is
    in the module docstring); tests set the wait to ``tenacity.wait_none()``.
    """

    retry_attempts: int = 8  # at a 20 % failure rate, one call in 400,000 is lost
    rate_limit_attempts: int = 20
    retry_wait: wait_base = wait_random_exponential(multiplier=1, max=30)

    def __init__(
        self,
        models: Models,
        *,
        log_path: str | Path | None = None,
        cache_path: str | Path | None = None,
        limiter: Limiter | None = None,
        timeout: float | None = None,
        breaker: Breaker | None = None,
    ) -> None:
        from evolve.models.requestcache import RequestCache

        self.models = models
        self.breaker = breaker
        self.log_path = Path(log_path) if log_path is not None else None
        self.cache = RequestCache(cache_path)
        self.limiter = limiter
        self.timeout = timeout
        self._records: list[UsageRecord] = []
        self._lock = threading.Lock()  # protects _records

    def available(self, role: str) -> bool:
        return self.models[role] is not None

    def complete(
        self,
        role: str,
        purpose: str,
        messages: list[Message] | str,
        *,
        json_schema: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        repair: bool = False,
    ) -> Completion:
        """One logical call (``repair``: it re-asks for valid JSON, as counted in the log)."""
        from evolve.models import spendcap
        from evolve.models.attempts import Attempts, is_transient
        from evolve.models.breaker import EndpointDown
        from evolve.models.requestcache import Cached, request_hash

        config = self.models[role]
        if config is None:
            raise LLMError(f"no model configured for role {role!r}")
        if self.timeout is not None:
            config = config.model_copy(update={"timeout": self.timeout})
        msgs = _as_messages(messages)
        max_tokens = max_tokens if max_tokens is not None else config.max_tokens
        key = request_hash(config, msgs, json_schema, max_tokens)
        began = time.perf_counter()
        found = self.cache.get(key)
        if found is not None:
            hit = Completion(found.text, found.prompt_tokens, found.completion_tokens, 0.0,
                             time.perf_counter() - began, True, found.model, key)  # fmt: skip
            self._record(role, purpose, hit, key, None, Attempts(None), repair)
            return hit
        if self.breaker is not None:  # the run's endpoint is down: refused, not logged
            self.breaker.check()
        counts = Attempts(self.limiter)
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=lambda _: (
                counts.spent(self.retry_attempts, self.rate_limit_attempts)
                or (self.breaker is not None and self.breaker.tripped())
            ),
            wait=lambda state: counts.pause(lambda: float(self.retry_wait(state))),
            before_sleep=lambda state: _say_retry(state, f"{role}/{purpose}", config),
            reraise=True,
        )
        with spendcap.admit(self.log_path):  # the run's caps, this call counted in flight
            try:
                reply = retrying(
                    self._attempt, counts, role, purpose, config, msgs, json_schema, max_tokens
                )
            except Exception as exc:
                error = f"{role}/{purpose} {config.model}: {type(exc).__name__}: {exc}"
                error = _redact(error, config)
                failed = Completion("", 0, 0, None, time.perf_counter() - began, False,
                                    config.model)  # fmt: skip
                self._record(role, purpose, failed, key, error, counts, repair)
                if self.breaker is not None and is_transient(exc):
                    self.breaker.call_failed(_endpoint(config), exc)
                down = isinstance(exc, EndpointDown)
                raise (EndpointDown(str(exc)) if down else LLMError(error)) from None
            reply = replace(reply, latency_s=time.perf_counter() - began, cached=False,
                            request_hash=key)  # fmt: skip
            self.cache.put(key, Cached(reply.text, reply.prompt_tokens, reply.completion_tokens,
                                       reply.model))  # fmt: skip
            self._record(role, purpose, reply, key, None, counts, repair)
        return reply

    def _attempt(
        self,
        counts: Attempts,
        role: str,
        purpose: str,
        config: ModelConfig,
        messages: list[Message],
        json_schema: dict[str, Any] | None,
        max_tokens: int,
    ) -> Completion:
        """One HTTP attempt, holding a limiter slot and abandoned at its timeout; counted. The
        transport is loaded first, so its first import counts against neither."""
        from evolve.models.attempts import fault_kind, is_transient, retry_after, within

        self._load_transport()
        if self.breaker is None:
            with counts.attempt():
                return within(config.timeout, lambda: self._transport(
                    role, purpose, config, messages, json_schema=json_schema, max_tokens=max_tokens
                ))  # fmt: skip
        self.breaker.check()  # tripped by any process of the run since the call began
        try:
            with counts.attempt():
                reply = within(config.timeout, lambda: self._transport(
                    role, purpose, config, messages, json_schema=json_schema, max_tokens=max_tokens
                ))  # fmt: skip
        except Exception as exc:
            counted = is_transient(exc) and fault_kind(exc, retry_after(exc)) != "rate_limit"
            self.breaker.attempt_failed(_endpoint(config), exc, counted)
            raise
        self.breaker.succeeded()
        return reply

    def complete_json(
        self,
        role: str,
        purpose: str,
        messages: list[Message] | str,
        schema: dict[str, Any],
        validate: Callable[[Any], T],
        *,
        max_tokens: int | None = None,
    ) -> T:
        """Parse the reply as JSON and ``validate`` it (it raises ValueError on bad data); on
        either failure, show the model its reply and the error and ask again, at most
        :data:`JSON_ATTEMPTS` calls in all."""
        from evolve.models.transport import parse_json_reply

        conversation = _as_messages(messages)
        problem = ""
        for _ in range(JSON_ATTEMPTS):
            reply = self.complete(role, purpose, conversation, json_schema=schema,
                                  max_tokens=max_tokens, repair=problem != "")  # fmt: skip
            try:
                return validate(parse_json_reply(reply.text))
            except ValueError as exc:
                problem = " ".join(str(exc).split())[:1000]
                self.cache.forget(reply.request_hash)  # not the JSON asked for: no success
            conversation = [
                *conversation,
                {"role": "assistant", "content": reply.text},
                {
                    "role": "user",
                    "content": f"That reply could not be used: {problem}\n"
                    "Reply again with only the corrected JSON.",
                },
            ]
        raise JSONReplyError(
            f"{role}/{purpose}: no valid JSON after {JSON_ATTEMPTS} attempts: {problem}"
        )

    def usage_summary(self) -> dict[str, dict[str, float | int]]:
        """Per role: calls, prompt_tokens, completion_tokens, cost_usd (known costs summed),
        cached_calls, errors, summed by :class:`~evolve.models.usage.Tally`."""
        from evolve.models.usage import by_role

        tallies = by_role(asdict(r) for r in self.records)
        return {role: tally.summary() for role, tally in tallies.items()}

    @property
    def records(self) -> tuple[UsageRecord, ...]:
        """The calls this client made (or merged) since it was created or last drained."""
        with self._lock:
            return tuple(self._records)

    def view(self) -> LLMClient:
        """This client (models, log, cache, limiter, transport, the same double's script) with
        in-memory records of its own, starting empty: what one evaluation or one labelling pass
        calls through, so its records are its calls only (not those of a sibling sharing the
        client), and are dropped with it rather than kept by the shared client for a whole run
        (the call log keeps every call)."""
        twin = copy.copy(self)
        twin._records = []
        twin._lock = threading.Lock()
        return twin

    def drain_records(self) -> list[UsageRecord]:
        """Return and forget the in-memory records (already in the SQLite log, if any)."""
        with self._lock:
            records, self._records = self._records, []
        return records

    def merge_records(self, records: Iterable[UsageRecord]) -> None:
        """Add records drained from a worker's client to this one's memory (not re-logged)."""
        with self._lock:
            self._records.extend(records)

    def _load_transport(self) -> None:
        """Import litellm (seconds, the first time), outside any slot or timeout."""
        from evolve.models.transport import load

        load()

    def _transport(
        self,
        role: str,
        purpose: str,
        config: ModelConfig,
        messages: list[Message],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
    ) -> Completion:
        """One litellm call (:func:`evolve.models.transport.send`), no retries; ``latency_s``
        and ``cached`` are set by the caller."""
        from evolve.models.transport import send

        reply = send(config, messages, json_schema=json_schema, max_tokens=max_tokens)
        return Completion(reply.text, reply.prompt_tokens, reply.completion_tokens,
                          reply.cost_usd, 0.0, False, config.model)  # fmt: skip

    def _record(
        self,
        role: str,
        purpose: str,
        reply: Completion,
        key: str,
        error: str | None,
        counts: Attempts,
        repair: bool,
    ) -> None:
        record = UsageRecord(
            ts=time.time(),
            role=role,
            purpose=purpose,
            model=reply.model,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cost_usd=reply.cost_usd,
            latency_s=reply.latency_s,
            cached=reply.cached,
            request_hash=key,
            error=error,
            retries=max(counts.attempts - 1, 0),
            rate_limited=counts.rate_limited,
            timeouts=counts.timeouts,
            repair=repair,
        )
        with self._lock:
            self._records.append(record)
        if self.log_path is not None:
            calllog.append(self.log_path, asdict(record))
