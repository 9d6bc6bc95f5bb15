"""Usage totals: the one way LLM calls are summed — a run's spend, an evaluation's usage, a
client's summary.

Owns :class:`Tally`, :func:`by_role` and :func:`fault_text` (the faults of a tally in words). A
call is a mapping with the fields of :class:`~evolve.models.llm.UsageRecord` (a record as a
dict, or a row of the ``calls`` log).

Semantics: a **cache hit** (``cached``) counts as a call and in ``cached_calls``, its tokens go
to ``cached_tokens`` only and it costs 0; ``prompt_tokens``, ``completion_tokens`` and
``tokens`` (what ``--max-tokens`` caps) count calls that reached a model, failures included;
``cost_usd`` sums known prices, and a call with no known price that did not fail counts in
``unpriced_calls``. Transport faults: ``retries`` sums the attempts after each call's first,
``rate_limited`` its 429s, ``timeouts`` its abandoned attempts, and ``repairs`` counts calls that
re-asked for valid JSON; a row of a call log older than these columns counts 0 in each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

SUMMARY = ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "cached_calls", "errors",
           "retries", "rate_limited", "timeouts", "repairs")  # fmt: skip
FAULTS = ("retries", "rate_limited", "timeouts")  # per-call counts of the call log, summed


@dataclass
class Tally:
    """Totals over a set of calls."""

    calls: int = 0
    cached_calls: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    retries: int = 0
    rate_limited: int = 0
    timeouts: int = 0
    repairs: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, row: Mapping[str, Any]) -> None:
        self.calls += 1
        for name in FAULTS:
            setattr(self, name, getattr(self, name) + int(row.get(name) or 0))
        self.repairs += 1 if row.get("repair") else 0
        prompt, completion = int(row["prompt_tokens"] or 0), int(row["completion_tokens"] or 0)
        if row["cached"]:
            self.cached_calls += 1
            self.cached_tokens += prompt + completion
            return
        self.errors += 1 if row["error"] else 0
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        if row["cost_usd"] is None:
            self.unpriced_calls += 0 if row["error"] else 1
        else:
            self.cost_usd += float(row["cost_usd"])

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens, "cost_usd": round(self.cost_usd, 6)}

    def summary(self) -> dict[str, Any]:
        """The short view of a role's usage (:data:`SUMMARY`)."""
        full = self.as_json()
        return {k: full[k] for k in SUMMARY}


def fault_text(tally: Mapping[str, Any]) -> str:
    """``"3 retries (2 rate-limited, 1 timed out), 1 JSON repair"``, or ``""`` without faults;
    ``tally`` is a :meth:`Tally.as_json` (a tally of an older run may lack the counts)."""
    retries, limited, timeouts, repairs = (
        int(tally.get(k) or 0) for k in ("retries", "rate_limited", "timeouts", "repairs")
    )
    causes = [
        f"{limited} rate-limited" if limited else "",
        f"{timeouts} timed out" if timeouts else "",
    ]
    parts = []
    if retries:
        why = ", ".join(c for c in causes if c)
        parts.append(
            f"{retries} retr{'y' if retries == 1 else 'ies'}" + (f" ({why})" if why else "")
        )
    if repairs:
        parts.append(f"{repairs} JSON repair{'' if repairs == 1 else 's'}")
    return ", ".join(parts)


def by_role(rows: Iterable[Mapping[str, Any]]) -> dict[str, Tally]:
    """One tally per role, in order of first appearance."""
    out: dict[str, Tally] = {}
    for row in rows:
        out.setdefault(row["role"], Tally()).add(row)
    return out
