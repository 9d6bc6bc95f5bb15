"""The LLM request cache: successful replies by the hash of what was asked.

Owns :func:`request_hash` and :class:`RequestCache` (SQLite table ``responses``, in the call
log's schema, :data:`evolve.models.calllog.CALLS_SCHEMA`); :class:`evolve.models.llm.LLMClient`
reads it before a call and writes it after a success.

Invariants:

- The key is the sha256 of the canonical JSON of (model id, messages, temperature, max_tokens,
  json_schema, extra params without secret-named ones, and ``api_base`` when one is set): the
  same request to the same server, never a secret. Prompts are not stored, only their hash.
- Only successful replies are stored: text, token counts and the model that answered (no
  price: a hit costs nothing). A reply found unusable afterwards is removed again.
- A hit is fast and a miss waits for the model, so whoever can time a call through a cache
  learns whether that request was made before: a cache file is shared only by callers who may
  know each other's requests (one run's evaluations); the runtime gives each user (scope) a
  file of their own (:mod:`evolve.runtime.store`).
- Every access is one transaction (:func:`evolve.models.cache_transaction`: a corrupt file is
  set aside and replaced by a fresh one). A cache with no path holds nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from evolve.models import cache_transaction
from evolve.models.calllog import CALLS_SCHEMA
from evolve.scrub import is_secret_name


class KeyedModel(Protocol):
    """The fields of a model's configuration that the key reads
    (:class:`evolve.models.llm.ModelConfig` has them)."""

    @property
    def model(self) -> str: ...
    @property
    def temperature(self) -> float: ...
    @property
    def api_base(self) -> str | None: ...
    @property
    def extra(self) -> dict[str, Any]: ...


WHAT = "LLM request cache"  # how a set-aside corrupt file is named to the user


def request_hash(
    config: KeyedModel,
    messages: list[dict[str, Any]],
    json_schema: dict[str, Any] | None,
    max_tokens: int,
) -> str:
    """The cache key of one request (see the module's invariants)."""
    extra = {k: v for k, v in config.extra.items() if not is_secret_name(k)}
    payload = [config.model, messages, config.temperature, max_tokens, json_schema, extra]
    if config.api_base is not None:  # another server may serve another model by this name
        payload.append({"api_base": config.api_base})
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Cached:
    """A stored reply."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str


class RequestCache:
    """Replies by request hash in the SQLite file ``path`` (None: nothing is kept)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None

    def get(self, key: str) -> Cached | None:
        if self.path is None:
            return None
        row = cache_transaction(
            self.path,
            CALLS_SCHEMA,
            WHAT,
            lambda conn: conn.execute(
                "SELECT text, prompt_tokens, completion_tokens, model FROM responses"
                " WHERE request_hash = ?",
                (key,),
            ).fetchone(),
        )
        return None if row is None else Cached(*row)

    def put(self, key: str, reply: Cached) -> None:
        if self.path is None:
            return
        cache_transaction(
            self.path,
            CALLS_SCHEMA,
            WHAT,
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                (key, reply.text, reply.prompt_tokens, reply.completion_tokens, reply.model),
            ),
        )

    def forget(self, key: str) -> None:
        """Drop a stored reply that turned out unusable (a replay asks the model again)."""
        if self.path is None or not key:
            return
        cache_transaction(
            self.path,
            CALLS_SCHEMA,
            WHAT,
            lambda conn: conn.execute("DELETE FROM responses WHERE request_hash = ?", (key,)),
        )
