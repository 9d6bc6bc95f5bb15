"""What a worker process is given and builds: its configuration, embedder and task-LLM client.

The executor hands every job a :class:`WorkerConfig`; the job itself
(:func:`evolve.session.run_conversation`) builds its embedder and LLM client here.

Invariants:
- A :class:`WorkerConfig` is picklable (it crosses to worker processes and Ray nodes).
- One embedder per process and kind: the model loads once per worker, lazily.
- ``reuse=False`` gives the LLM client no response cache.
- ``script`` (tests only) answers through a scripted client instead of litellm; it is never set
  from the command line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evolve.models.clients import llm_client
from evolve.models.embed import Embedder, HashingEmbedder
from evolve.models.llm import LLMClient, ModelConfig, Models


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides the job; picklable."""

    cache_dir: str
    task_model: ModelConfig | None
    embedder: str = "minilm"  # "minilm" or "hashing" (test double, chosen explicitly)
    call_prefix: str = "eval"  # task-model calls are labelled "<call_prefix>/extract", ...
    max_complete_calls: int = 8
    step_seconds: float = 120.0  # wall clock for one hook or retrieve call in the host
    calls_log: str | None = None  # the LLM call log (default: <cache_dir>/llm-calls.sqlite)
    diagnose: bool = False  # add cold-start diagnostics (evolve.diagnostics) to each trace
    reuse: bool = True  # False: no stage output or task reply of another evaluation is reused
    llm_concurrency: int = 16  # model calls one evaluation keeps in flight (its thread pools)
    # Tests only: a picklable ``(role, stage, messages) -> reply`` answering through the
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


def make_embedder(kind: str, cache_dir: str) -> Embedder:
    """One embedder per process and kind (the model loads lazily, on the first cache miss)."""
    key = (kind, cache_dir)
    if key not in _EMBEDDERS:
        if kind == "hashing":
            _EMBEDDERS[key] = HashingEmbedder()
        elif kind == "minilm":
            _EMBEDDERS[key] = Embedder(cache_path=Path(cache_dir) / "embeddings.sqlite")
        else:
            raise ValueError(f"unknown embedder {kind!r} (use minilm or hashing)")
    return _EMBEDDERS[key]


def make_llm(config: WorkerConfig) -> LLMClient | None:
    if config.task_model is None:
        return None
    root = Path(config.cache_dir)
    log = Path(config.calls_log) if config.calls_log else root / "llm-calls.sqlite"
    cache = root / "llm-cache.sqlite" if config.reuse else None
    models = Models(task=config.task_model)
    return llm_client(models, log_path=log, cache_path=cache, script=config.script)
