"""The models and limits an evaluation runs with (:class:`EvalSetup`), and the embedder and
task-LLM client built from them.

An evaluation runs with one :class:`EvalSetup`: the executor hands it to every job, whose
conversation (:func:`evolve.evaluation.conversation.run_conversation`, in a worker process) builds
its embedder
and LLM client here; the runtime (:mod:`evolve.runtime.api`) builds its own from one the same way.

Invariants:
- A :class:`EvalSetup` is picklable (it crosses to worker processes and Ray nodes).
- One embedder per process and kind: the model loads once per worker, lazily. The runtime
  asks for one of each user's own instead (``own``, caches in the user's folder; the model's
  weights stay one per process).
- ``reuse=False`` gives the LLM client no response cache.
- The task-LLM client shares the run's limit on requests in flight (``llm_concurrency``, one
  limit for every process of the run on the machine; :mod:`evolve.models.limiter`) and abandons
  an attempt after ``llm_timeout`` seconds.
- The task-LLM client shares the run's breaker (:mod:`evolve.models.breaker`, keyed on the
  call log like the limiter): a dead endpoint seen by one worker stops every worker's calls;
  :func:`check_endpoint` tells the parent after an evaluation.
- ``script`` (tests only) answers through a scripted client instead of litellm; it is never set
  from the command line.
- Offline (no task model) loads nothing of the task-model client's machinery: the client
  builder (:mod:`evolve.models.clients`) and the breaker are imported by the functions that
  use them, so the runtime's import stays light (``tests/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evolve.models.embed import Embedder, HashingEmbedder
from evolve.models.limiter import DEFAULT_CONCURRENCY
from evolve.models.llm import LLMClient, ModelConfig, Models


@dataclass(frozen=True)
class EvalSetup:
    """What an evaluation runs with besides the program and tasks: cache, task model, embedder,
    limits; picklable."""

    cache_dir: str
    task_model: ModelConfig | None
    embedder: str = "minilm"  # "minilm" or "hashing" (test double, chosen explicitly)
    call_prefix: str = "eval"  # task-model calls are labelled "<call_prefix>/extract", ...
    max_complete_calls: int = 8
    call_timeout: float = 120.0  # wall clock for one hook or retrieve call in the host
    calls_log: str | None = None  # the LLM call log (default: <cache_dir>/llm-calls.sqlite)
    diagnose: bool = False  # add cold-start diagnostics (evaluation.diagnostics) to each trace
    reuse: bool = True  # False: no step output or task reply of another evaluation is reused
    llm_concurrency: int = DEFAULT_CONCURRENCY  # LLM requests in flight, whole run, per machine
    llm_timeout: float = 120.0  # seconds one LLM request may take before it is retried
    # Tests only: a picklable ``(role, purpose, messages) -> reply`` answering through the
    # ``scripted`` test double (evolve.models.clients) instead of litellm. Never set from the
    # command line.
    script: Callable[..., str] | None = None

    @property
    def offline(self) -> bool:
        return self.task_model is None

    @property
    def model_sig(self) -> str:
        return "offline" if self.task_model is None else self.task_model.model_dump_json()


_EMBEDDERS: dict[tuple[str, str], Embedder] = {}


def make_embedder(kind: str, cache_dir: str, *, own: bool = False) -> Embedder:
    """The embedder of ``kind``, MiniLM's disk cache ``<cache_dir>/embeddings.sqlite`` (the
    hashing double has none): one per process, kind and folder (the model loads lazily, on the
    first cache miss); ``own``: a new one, whose caches no other caller's texts reach (a
    runtime user's, ``cache_dir`` that user's folder; the model's weights are still shared)."""
    key = (kind, cache_dir)
    if own or key not in _EMBEDDERS:
        if kind == "hashing":
            made: Embedder = HashingEmbedder()
        elif kind == "minilm":
            made = Embedder(cache_path=Path(cache_dir) / "embeddings.sqlite")
        else:
            raise ValueError(f"unknown embedder {kind!r} (use minilm or hashing)")
        if own:
            return made
        _EMBEDDERS[key] = made
    return _EMBEDDERS[key]


def calls_log(setup: EvalSetup) -> Path:
    """The call log the task model's calls go to (and the run's breaker is keyed on)."""
    root = Path(setup.cache_dir)
    return Path(setup.calls_log) if setup.calls_log else root / "llm-calls.sqlite"


def check_endpoint(setup: EvalSetup) -> None:
    """Raise :class:`~evolve.models.breaker.EndpointDown` when the breaker of ``setup``'s
    call log is tripped (a worker or the judge found the model endpoint down); offline: never."""
    if setup.task_model is not None:
        from evolve.models.breaker import shared_breaker

        shared_breaker(calls_log(setup)).check()


def reset_endpoint(setup: EvalSetup) -> None:
    """Close the breaker of ``setup``'s call log: a command starts, the endpoint may be back."""
    if setup.task_model is not None:
        from evolve.models.breaker import shared_breaker

        shared_breaker(calls_log(setup)).reset()


def make_llm(setup: EvalSetup, cache_dir: str | None = None) -> LLMClient | None:
    """The task model's client (None offline), its request cache
    ``<cache_dir or setup.cache_dir>/llm-cache.sqlite`` (none without ``setup.reuse``); its
    call log, limit on requests in flight and breaker are the run's (:func:`calls_log`)."""
    if setup.task_model is None:
        return None
    from evolve.models.clients import llm_client

    log = calls_log(setup)
    folder = Path(cache_dir if cache_dir is not None else setup.cache_dir)
    cache = folder / "llm-cache.sqlite" if setup.reuse else None
    models = Models(task=setup.task_model)
    return llm_client(models, log_path=log, cache_path=cache, script=setup.script,
                      concurrency=setup.llm_concurrency, timeout=setup.llm_timeout)  # fmt: skip
