"""A run's spending caps, held at every model call of every process that logs to the run.

Owns :class:`Caps`, :func:`write_caps` (the run sets its caps), :func:`admit` (what
:class:`~evolve.models.llm.LLMClient` asks before a call that would reach a model),
:class:`SpendCapReached` and :data:`SPEND_CAP` (the text every refusal starts with).

The caps of a run live beside its call log, in ``<log>.caps.json``: the evolution loop writes
them when a run starts or resumes (:func:`write_caps`; a resume with a higher cap rewrites
them), and every client that logs to that call log — the coder, judge and annotator in the
parent, the task model in every evaluation worker — reads them there. A log with no caps file
has no caps (``evolve eval``).

Invariants:

- A call is admitted only while ``spent + (in_flight + 1) × dearest`` stays within every cap,
  per cap (USD, tokens): ``spent`` sums the call log as :class:`~evolve.models.usage.Tally`
  does (read incrementally: only the rows added since the last look); ``in_flight`` counts the
  calls this process admitted that have not returned (their rows are not in the log yet);
  ``dearest`` is the most one logged call has cost (a :data:`~evolve.models.calllog.REBUILT`
  row, a lost log's spend summed into one, counts as spent, not as a call). Until the log
  holds a call that reached a model, a process admits one call at a time (nothing says yet
  what a call costs). A cache hit costs nothing and is never refused. Calls in flight in
  other processes are counted once their rows land in the log.
- A refusal raises :class:`SpendCapReached` before anything is sent; its text starts with
  :data:`SPEND_CAP`, so a failure that crossed a process boundary as text is still known for
  one (:func:`is_spend_cap`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from evolve.models import calllog
from evolve.models.calllog import LLMError
from evolve.models.usage import Tally

SPEND_CAP = "spend cap reached"


class SpendCapReached(LLMError):
    """A model call was refused: the run's spend, with the calls in flight, would pass a cap."""


def is_spend_cap(text: str | None) -> bool:
    """Whether a failure's text (a trace error, an exception's message) is a cap refusal."""
    return bool(text) and SPEND_CAP in str(text)


@dataclass(frozen=True)
class Caps:
    max_usd: float | None = None
    max_tokens: int | None = None


def caps_path(log_path: Path) -> Path:
    return Path(log_path).with_suffix(".caps.json")


def write_caps(log_path: Path, caps: Caps) -> None:
    """Set the caps of every call logged to ``log_path`` (atomically: readers see old or new)."""
    path = caps_path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"max_usd": caps.max_usd, "max_tokens": caps.max_tokens}))
    os.replace(tmp, path)


def read_caps(log_path: Path) -> Caps:
    """The caps beside ``log_path``; none when there is no caps file."""
    try:
        data = json.loads(caps_path(log_path).read_text())
    except FileNotFoundError:
        return Caps()
    return Caps(data.get("max_usd"), data.get("max_tokens"))


class _Ledger:
    """One process's view of one call log: what it holds, the dearest call, calls in flight."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.lock = threading.Condition()
        self.logged = False  # a call that reached a model is in the log
        self.last_id = 0
        self.spent = Tally()
        self.dearest_usd = 0.0
        self.dearest_tokens = 0
        self.in_flight = 0

    def catch_up(self) -> None:
        if not self.log_path.exists():
            return
        for row in calllog.read_rows_after(self.log_path, self.last_id):
            self.last_id = max(self.last_id, int(row["id"]))
            self.spent.add(row)
            if not row["cached"] and row["role"] != calllog.REBUILT:  # a rebuilt sum: no call
                self.logged = True
                tokens = int(row["prompt_tokens"] or 0) + int(row["completion_tokens"] or 0)
                self.dearest_tokens = max(self.dearest_tokens, tokens)
                self.dearest_usd = max(self.dearest_usd, float(row["cost_usd"] or 0.0))

    def refusal(self, caps: Caps) -> str | None:
        n = self.in_flight + 1
        usd, tokens = self.spent.cost_usd, self.spent.tokens
        if caps.max_usd is not None and usd + n * self.dearest_usd > caps.max_usd:
            return (
                f"{SPEND_CAP}: ${usd:.4f} spent, {self.in_flight} calls in flight of up to "
                f"${self.dearest_usd:.4f} each, cap ${caps.max_usd:g}"
            )
        if caps.max_tokens is not None and tokens + n * self.dearest_tokens > caps.max_tokens:
            return (
                f"{SPEND_CAP}: {tokens:,} tokens spent, {self.in_flight} calls in flight of up "
                f"to {self.dearest_tokens:,} tokens each, cap {caps.max_tokens:,}"
            )
        return None


_LEDGERS: dict[str, _Ledger] = {}  # per call log, in this process
_LEDGERS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_LEDGERS.clear)  # a child's calls in flight are its own


@contextmanager
def admit(log_path: Path | None) -> Iterator[None]:
    """Hold a place for one model call under the caps of ``log_path``'s run (see the module
    docstring); SpendCapReached when it would pass one. No log or no caps: always admitted."""
    caps = read_caps(log_path) if log_path is not None else Caps()
    if log_path is None or (caps.max_usd is None and caps.max_tokens is None):
        yield
        return
    with _LEDGERS_LOCK:
        ledger = _LEDGERS.setdefault(str(log_path), _Ledger(Path(log_path)))
    with ledger.lock:
        ledger.catch_up()
        while not ledger.logged and ledger.in_flight:  # no cost known yet: one call at a time
            ledger.lock.wait(0.5)
            ledger.catch_up()
        why = ledger.refusal(caps)
        if why:
            raise SpendCapReached(why)
        ledger.in_flight += 1
    try:
        yield
    finally:
        with ledger.lock:
            ledger.in_flight -= 1
            ledger.lock.notify_all()
