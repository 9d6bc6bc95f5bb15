"""The backend budget of one host request: what a program may ask the optimizer to do for it.

Owns :class:`BackendBudget`, which :class:`sandbox.isolate.Host` checks every ``backend`` frame
against before its ``serve`` callback runs (embedding, a task-model call). A program is assumed
to hold the real builtins, so the host's own counts are not trusted: the optimizer counts.

Invariants: a refusal is a one-line string that starts with the verb and names
:data:`OVER_BUDGET`, the figure asked and the most allowed; counting is per host request and
only what fits is counted; the default budget grows with the request's own data (the
``embed_chars`` a caller names), so the work a program can make the optimizer do stays bounded
by the data it was given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_MIB = 1 << 20
OVER_BUDGET = "over the request's backend budget"
# How much embedding an ``add`` may ask for in full time: this many times the characters of the
# session's messages and units (chunks overlap, texts are embedded in several forms); however
# slow the machine, embedding them never times an add out.
ADD_EMBED_VOLUME = 4


def add_embed_chars(contents: Iterable[str], units: Iterable[dict[str, Any]]) -> int:
    """The ``embed_chars`` of an ``add`` request (evaluation's and the tiers' alike): the
    session's message ``contents`` and its units' string fields, times
    :data:`ADD_EMBED_VOLUME`."""
    given = sum(len(c) for c in contents)
    given += sum(len(v) for u in units for v in u.values() if isinstance(v, str))
    return ADD_EMBED_VOLUME * given


@dataclass(frozen=True)
class BackendBudget:
    """What the backend requests of one host request may ask of the optimizer, checked before
    the ``serve`` callback runs: ``embed`` texts and characters per call and in all, ``complete``
    prompt characters per call and in all; and the most one answer to the host may carry
    (``reply_bytes``: an embedding is texts × dimension × 4 bytes, so ``texts_per_call`` rows
    of up to 4,096 dimensions fit)."""

    texts_per_call: int = 4096
    chars_per_call: int = 2_000_000  # a BEAM-1M session holds at most about 500,000
    texts: int = 16_384
    chars: int = 4_000_000
    prompt_chars: int = 128_000  # one completion's prompt (about 32k tokens)
    prompts_chars: int = 1_024_000  # eight such prompts
    reply_bytes: int = 64 * _MIB

    @classmethod
    def for_request(cls, embed_chars: int = 0) -> BackendBudget:
        """The default budget grown by a request's own data volume (``embed_chars``, as
        :meth:`sandbox.isolate.Host.call` takes it): as many more characters, and a text more
        per 16 of them."""
        base = cls()
        extra = max(0, embed_chars)
        return cls(texts=base.texts + extra // 16, chars=base.chars + extra)

    def refusal(self, header: dict[str, Any], spent: dict[str, int]) -> str | None:
        """Why the backend request ``header`` is over the budget, given what the request has
        ``spent`` so far (counted in it when it fits), or None."""
        method, texts, prompt = header.get("method"), header.get("texts"), header.get("prompt")
        if method == "embed" and isinstance(texts, list):
            n, chars = len(texts), sum(len(t) for t in texts if isinstance(t, str))
            for what, got, most in (
                ("texts in one call", n, self.texts_per_call),
                ("characters in one call", chars, self.chars_per_call),
                ("texts in this request", spent["texts"] + n, self.texts),
                ("characters in this request", spent["chars"] + chars, self.chars),
            ):
                if got > most:
                    return f"backend.embed {OVER_BUDGET}: {got:,} {what}; at most {most:,}"
            spent["texts"] += n
            spent["chars"] += chars
        elif method == "complete" and isinstance(prompt, str):
            for what, got, most in (
                ("characters in one prompt", len(prompt), self.prompt_chars),
                ("prompt characters in this request", spent["prompts"] + len(prompt),
                 self.prompts_chars),
            ):  # fmt: skip
                if got > most:
                    return f"backend.complete {OVER_BUDGET}: {got:,} {what}; at most {most:,}"
            spent["prompts"] += len(prompt)
        return None
