"""One request to a model through litellm, and its reply read back.

Owns :data:`LOCAL_API_KEY`, :class:`ModelFields` (the fields of a model's configuration a
request reads), :class:`Reply` (what a reply says: its text, token counts and cost), :func:`load`,
:func:`send` and :func:`parse_json_reply` (the JSON value in a reply's text). The client around
it (:class:`evolve.models.llm.LLMClient`: request cache, limiter slot, timeout, retries,
breaker, JSON repair, accounting) calls :func:`load` before an attempt's clock starts,
:func:`send` once per attempt, and :func:`parse_json_reply` on each reply it asked JSON of.

Invariants:

- litellm is imported by :func:`load` and :func:`send` only, never when this module is
  imported; :mod:`evolve.models.llm`, which imports this module inside the methods that use it,
  sets ``LITELLM_LOCAL_MODEL_COST_MAP`` first, so litellm never fetches prices.
- :func:`send` makes exactly one call (litellm's own retries off); a failure is litellm's
  exception, for the client to classify and retry.
- A local server given by ``api_base`` with no provider key in the environment gets
  :data:`LOCAL_API_KEY`: local OpenAI-compatible servers accept any key, but litellm's provider
  refuses to call without one. No key is ever written anywhere.
- A reply with no usage counts as 0 tokens; a cost litellm cannot price is None.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

# Sent to an ``api_base`` whose provider key is not in the environment (see the invariants).
LOCAL_API_KEY = "no-key"


class ModelFields(Protocol):
    """What a request reads of a model's configuration (:class:`evolve.models.llm.ModelConfig`
    has these fields)."""

    @property
    def model(self) -> str: ...
    @property
    def temperature(self) -> float: ...
    @property
    def timeout(self) -> float: ...
    @property
    def api_base(self) -> str | None: ...
    @property
    def extra(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Reply:
    """A model's reply: its text, the tokens it counted and its cost (None: no known price)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None


def load() -> None:
    """Import litellm (seconds, the first time) and quiet its banner."""
    import litellm

    litellm.suppress_debug_info = True


def send(
    config: ModelFields,
    messages: list[dict[str, Any]],
    *,
    json_schema: dict[str, Any] | None,
    max_tokens: int,
) -> Reply:
    """One litellm completion with ``config``'s model, no retries (``json_schema``: ask for a
    JSON object of that schema)."""
    import litellm  # loaded by load()

    kwargs = dict(config.extra)
    if config.api_base is not None:
        kwargs["api_base"] = config.api_base
        env = litellm.validate_environment(model=config.model, api_base=config.api_base)
        if "api_key" not in kwargs and not env.get("keys_in_environment", True):
            kwargs["api_key"] = LOCAL_API_KEY
    if json_schema is not None:
        kwargs["response_format"] = {"type": "json_object", "schema": json_schema}
    response = litellm.completion(
        model=config.model,
        messages=messages,
        temperature=config.temperature,
        max_tokens=max_tokens,
        timeout=config.timeout,
        num_retries=0,
        **kwargs,
    )
    try:
        cost: float | None = float(litellm.completion_cost(completion_response=response))
    except Exception:
        cost = None
    usage = getattr(response, "usage", None)
    return Reply(
        text=response.choices[0].message.content or "",
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=cost,
    )


def parse_json_reply(text: str) -> Any:
    """The JSON value in an LLM reply: the whole text, else a fenced block, else the first
    object/array that decodes. Raises ValueError when there is none."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for block in re.findall(r"```(?:json)?\s*(.*?)```", text, flags=re.DOTALL | re.IGNORECASE):
        try:
            return json.loads(block)
        except ValueError:
            continue
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[{\[]", text):
        try:
            return decoder.raw_decode(text, match.start())[0]
        except ValueError:
            continue
    raise ValueError(f"no JSON object or array found in the reply: {text[:200]!r}")
