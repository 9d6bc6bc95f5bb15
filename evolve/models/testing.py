"""Test doubles for :mod:`evolve.models`, shipped with the library so every test uses the same.

Owns :class:`ScriptedLLM`, :func:`task_script` (a scripted task model) and re-exports
:class:`~evolve.models.embed.HashingEmbedder`. Importing it registers :class:`ScriptedLLM` as the
``scripted`` double of :data:`evolve.models.DOUBLES` (what
:func:`evolve.models.clients.llm_client` builds for a script): the test suite imports it, and a
worker process does when it unpickles :func:`task_script`. The fake model *server* (a real HTTP
endpoint with injected faults) is :mod:`evolve.models.fake_server`.

Invariants: the doubles subclass the real classes and replace only the pieces that would reach a
model (``LLMClient._load_transport`` and ``_transport``, ``Embedder._encode``), so accounting,
caching, retries and JSON repair run through the real code. Nothing here is ever selected
silently: callers construct a double by name, in tests or explicitly labelled smoke runs.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evolve.models import DOUBLES
from evolve.models.embed import HashingEmbedder
from evolve.models.limiter import Limiter
from evolve.models.llm import ROLES, Completion, LLMClient, Message, ModelConfig, Models

__all__ = ["HashingEmbedder", "ScriptedLLM", "Script", "task_script"]

Script = Sequence[str] | Callable[[str, str, list[Message]], str]


class ScriptedLLM(LLMClient):
    """TEST DOUBLE — answers from a script instead of a model. For tests; never selected silently.

    ``script`` is a list of replies consumed in order (running out raises, which surfaces as
    :class:`~evolve.models.llm.LLMError`), or a callable ``(role, purpose, messages) -> reply``.
    Tokens are whitespace-split words of the prompt's contents and of the reply; cost is
    ``usd_per_token`` × tokens, or None (unknown) when not given. Every role is configured with
    model id ``"scripted"`` unless ``models`` is passed. ``transport_calls`` lists
    ``(role, purpose, messages)`` of each call that reached the script.
    """

    def __init__(
        self,
        script: Script,
        models: Models | None = None,
        *,
        log_path: str | Path | None = None,
        cache_path: str | Path | None = None,
        usd_per_token: float | None = None,
        limiter: Limiter | None = None,
        timeout: float | None = None,
    ) -> None:
        if models is None:
            models = Models(**{role: ModelConfig(model="scripted") for role in ROLES})
        super().__init__(models, log_path=log_path, cache_path=cache_path, limiter=limiter,
                         timeout=timeout)  # fmt: skip
        self.script = script if callable(script) else list(script)
        self.usd_per_token = usd_per_token
        self.transport_calls: list[tuple[str, str, list[Message]]] = []
        self._script_lock = threading.Lock()  # a list script is consumed in order by threads

    def _load_transport(self) -> None:
        """Nothing to load: the script is the model."""

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
        with self._script_lock:
            self.transport_calls.append((role, purpose, messages))
            used = len(self.transport_calls) - 1
        if callable(self.script):
            text = self.script(role, purpose, messages)
        else:
            if used >= len(self.script):
                raise IndexError(f"ScriptedLLM script exhausted after {len(self.script)} replies")
            text = self.script[used]
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        completion_tokens = len(text.split())
        cost = None
        if self.usd_per_token is not None:
            cost = self.usd_per_token * (prompt_tokens + completion_tokens)
        return Completion(text, prompt_tokens, completion_tokens, cost, 0.0, False, config.model)


_ANSWER_MARK = re.compile(r"SCRIPTED-ANSWER\[([^\]]*)\]")
_MESSAGE_LINE = re.compile(r"^\[(?P<id>[^\]]+)\] (?P<role>\w+): (?P<text>.*)$")


def task_script(role: str, purpose: str, messages: list[Message]) -> str:
    """A deterministic task model for executor tests (picklable, so workers can use it).

    Answers the executor's three task prompts by purpose: extraction → one ``{"content": ...}``
    unit per rendered ``[id] role: text`` line (its first 300 characters); planning →
    ``{"text": <the question>}``; answer → a fixed sentence, or ``X`` when the program's answer
    instruction contains ``SCRIPTED-ANSWER[X]`` (so a revision of the instruction changes the
    answers). Programs whose MemoryUnit and
    Query have other required fields get validation errors, as they would from a real model.
    """
    prompt = str(messages[-1].get("content", ""))
    if purpose.endswith("/extract"):
        lines = (_MESSAGE_LINE.match(line) for line in prompt.splitlines())
        units = [{"content": f"{m['role']}: {m['text'][:300]}"} for m in lines if m]
        return json.dumps({"units": units})
    if purpose.endswith("/plan"):
        question = prompt.rsplit("Question: ", 1)[-1].split("\n", 1)[0]
        return json.dumps({"text": question})
    wanted = _ANSWER_MARK.search(prompt)
    return wanted.group(1) if wanted else "This is a scripted answer."


DOUBLES["scripted"] = ScriptedLLM
