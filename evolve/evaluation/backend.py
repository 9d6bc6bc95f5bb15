"""What the optimizer answers a program host's ``backend`` frames with: embeddings and LLM calls.

A candidate program reaches models only through its backend; inside the confined
:class:`~sandbox.isolate.Host` that backend forwards each call over the pipe, and
:class:`BackendService`, on the trusted side, answers it.

Invariants:
- The sandbox's tiers answer exactly as this does (:class:`sandbox.probe.ProbeBackend`, whose
  limits and refusals are these), so a program cannot tell a check from an evaluation by them.
- ``embed`` takes a list of strings only, at most :data:`MAX_EMBED_TEXTS` per call and no more
  than an answer of :data:`MAX_REPLY_BYTES` holds (texts × the embedder's dimension × 4
  bytes), checked before anything is embedded. The host's request is held to a tighter budget
  before this is called (:class:`sandbox.budget.BackendBudget`); this side does not rely on it.
- ``complete`` goes to the task LLM, counted under role ``task`` and purpose
  ``<call_prefix>/memory``, at most ``max_calls`` per host request (the host enforces the same
  budget; this side does not trust it to), each prompt a string of at most
  :data:`MAX_PROMPT_CHARS` characters and each reply at most :data:`MAX_REPLY_TOKENS` tokens;
  with no task LLM (offline mode), or past a limit, it is refused with a
  :class:`~contract.types.BackendError` before any model is asked.
- Any other method is refused.
"""

from __future__ import annotations

from typing import Any

from contract.types import BackendError
from evolve.models.embed import Embedder
from evolve.models.llm import LLMClient
from sandbox.probe import MAX_EMBED_TEXTS, MAX_REPLY_BYTES, OFFLINE_COMPLETE, embed_texts
from sandbox.wire import pack_array

__all__ = ["MAX_EMBED_TEXTS", "MAX_REPLY_BYTES", "BackendService"]

MAX_PROMPT_CHARS = 128_000  # one backend.complete prompt (about 32k tokens)
MAX_REPLY_TOKENS = 4096


class BackendService:
    """Answers one host's ``backend`` frames (a callable for :class:`~sandbox.isolate.Host`);
    ``calls`` counts the completions of the current host request (the pipeline resets it)."""

    def __init__(self, embedder: Embedder, llm: LLMClient | None, call_prefix: str, max_calls: int):
        self.embedder = embedder
        self.llm = llm
        self.call_prefix = call_prefix
        self.max_calls = max_calls
        self.calls = 0

    def __call__(
        self, header: dict[str, Any], _blobs: list[bytes]
    ) -> tuple[dict[str, Any], list[bytes]]:
        method = header.get("method")
        if method == "embed":
            texts = embed_texts(header, self.embedder.dim)
            meta, blob = pack_array(self.embedder.embed(texts))
            return {"array": meta}, [blob]
        if method == "complete":
            if self.llm is None:
                raise BackendError(OFFLINE_COMPLETE)
            if self.calls >= self.max_calls:
                raise BackendError(f"backend.complete: budget of {self.max_calls} calls spent")
            prompt = header.get("prompt")
            if type(prompt) is not str:
                raise BackendError("backend.complete takes a string prompt")
            if len(prompt) > MAX_PROMPT_CHARS:
                raise BackendError(
                    f"backend.complete: a prompt of {len(prompt):,} characters; at most "
                    f"{MAX_PROMPT_CHARS:,}"
                )
            self.calls += 1
            reply = self.llm.complete(
                "task",
                f"{self.call_prefix}/memory",
                prompt,
                max_tokens=min(int(header.get("max_tokens", 256)), MAX_REPLY_TOKENS),
            )
            return {"text": reply.text}, []
        raise ValueError(f"unknown backend method {method!r}")
