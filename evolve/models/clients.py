"""The one place LLM clients are built: a role's model, its call log, its response cache and
the run's shared limit on requests in flight.

Every client of the package — the task model in the evaluation workers, the judge of
``evolve eval`` and of a run, a run's coder and annotator — comes from :func:`llm_client` or
:func:`role_client`, with the limiter of its call log
(:func:`evolve.models.limiter.shared_limiter`): every client of one run logs to one file, so
``--llm-concurrency`` is one limit for the run on each machine, its breaker
(:func:`evolve.models.breaker.shared_breaker`) stops every client of the run when the endpoint
is down, and ``--llm-timeout`` bounds each attempt. A client that answers from a script
(tests only) is the ``scripted`` test double of the registry :data:`evolve.models.DOUBLES`, which
the tests fill (importing :mod:`evolve.models.testing` registers its doubles); this module never
imports a double.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evolve.models import double
from evolve.models.breaker import shared_breaker
from evolve.models.limiter import DEFAULT_CONCURRENCY, shared_limiter
from evolve.models.llm import LLMClient, ModelConfig, Models


def llm_client(
    models: Models,
    *,
    log_path: Path | None,
    cache_path: Path | None,
    script: Callable[..., str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout: float | None = None,
) -> LLMClient:
    """A client of ``models``, logging each call to ``log_path`` and caching replies in
    ``cache_path`` (None: no log / no cache), at most ``concurrency`` requests in flight with
    every other client of that log on this machine, each attempt abandoned after ``timeout``
    seconds (None: the model's own); with ``script``, the ``scripted`` double."""
    limiter = shared_limiter(log_path, concurrency)
    if script is not None:
        client: LLMClient = double("scripted")(
            script, models, log_path=log_path, cache_path=cache_path, limiter=limiter,
            timeout=timeout,
        )  # fmt: skip
    else:
        client = LLMClient(
            models, log_path=log_path, cache_path=cache_path, limiter=limiter, timeout=timeout
        )
    client.breaker = shared_breaker(log_path)  # a dead endpoint stops the whole run
    return client


def role_client(
    role: str,
    model: ModelConfig | None,
    *,
    log_path: Path | None,
    cache_path: Path | None,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout: float | None = None,
) -> LLMClient | None:
    """The client of one role (``coder``, ``judge``, ...) with ``model``; None without one."""
    if model is None:
        return None
    return llm_client(Models(**{role: model}), log_path=log_path, cache_path=cache_path,
                      concurrency=concurrency, timeout=timeout)  # fmt: skip
