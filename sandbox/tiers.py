"""Tiers 3 and 4 of the sandbox, driven from the optimizer through evaluation's own requests.

Nothing of a tier runs in the host. The optimizer sends the requests an offline evaluation
sends (:class:`evolve.evaluation.pipeline.Pipeline`): ``open`` with the evaluation's backend shape,
per
session ``units`` (offline stand-ins through the program's hook) then ``add``, per question
``query`` then ``retrieve``, and ``dump``; each ``add`` may embed as much as evaluation lets
it (:func:`sandbox.budget.add_embed_chars`, the volume ``Pipeline.add`` names, which grows its
backend budget, :class:`sandbox.budget.BackendBudget`); the program meets the same code path,
the same
:class:`sandbox.serve.RemoteBackend` and the same backend answers (:class:`sandbox.probe.
ProbeBackend`) as in an evaluation, and every verdict is made here from what the requests
return. The rules the requests enforce in the host (``index`` returns None, ``retrieve`` an
exact ``str``, the backend left alone: :class:`sandbox.serve.RuleError`) come back as failures
with rule ``contract``, which :mod:`sandbox.check` reports as the tier's rule.

- **Smoke** (:func:`smoke_tier`): open a memory, add a session of :data:`SMOKE_UNITS`
  synthetic units and an empty one, then ask a question, another, and the first again.
  ``retrieve`` must stay within the 16,000-character budget, and must leave the memory as it
  found it: its stored state (or, for a memory that cannot be stored, the digest of everything
  reachable from it, :func:`contract.state.state_digest`) is the same byte for byte before and
  after the retrieves, and the first question gets the same answer after the second.
  Retrievals are cached per index state and query, so one that depends on earlier retrieves
  would be scored on what a cached run never sees. This backs the static rule of
  :mod:`sandbox.readonly`, which cannot see every route; the comparison covers any route to
  the memory's own objects, and the repeated question any state that changes answers.
- **Complexity probe**, a run (:func:`probe_run`): a fresh memory indexes the first ``units``
  units of the check's synthetic conversation and answers two questions; the CPU time the
  host spent from the first ``add`` to the last ``retrieve`` comes back, read from outside
  (:mod:`sandbox.probe` judges it). ``open`` lets the previous run's memory go and collects
  its garbage before the clock starts.

The synthetic conversation (:class:`SyntheticConversation`) is drawn afresh for each check:
sessions of 6 to 30 messages (:data:`SESSION_SIZES`) whose ids, session ids, roles and dates
follow one of the real benchmarks' styles (BEAM, LoCoMo, LongMemEval), messages of a few words
to a few hundred made of sentences over a vocabulary of about two hundred words, questions of
the benchmarks' shapes.

What this does not hide: a program can always guess from content (the vocabulary is small
and the sentences are generated; a question never matches what was said as a real one does;
the backend's rows carry no meaning, so two paraphrases are not close as MiniLM would put
them), from timing (every row comes back at once, where MiniLM takes milliseconds for a text
it has not cached) and, with the real builtins, from the host's own limits and history (a
check opens several memories in one host). What holds then is evaluation's own
line: every evaluation request has a CPU and wall-clock deadline (:class:`sandbox.isolate.
Limits`; the indexing deadline ``IndexBudget`` and the retrieve timeout of
:mod:`evolve.evaluation.pipeline`), so a program that behaves quadratically only where it is not
watched fails there, on the questions it is scored on, and the step cache keys retrievals on
the index state and query whatever a tier saw.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from typing import Any

from contract.spec import OUT_CHAR_BUDGET
from contract.types import Message, Segment
from sandbox.budget import add_embed_chars
from sandbox.isolate import Host
from sandbox.probe import BackendShape

SMOKE_UNITS = 12
SESSION_SIZES = (6, 30)  # messages per synthetic session (tests/test_cli.py relies on <= 30)


class TierError(Exception):
    """The program failed a tier's rule; the message says which rule, for a model to repair."""


_NAMES = "Alice Ben Carla Dev Emma Farid Grace Hugo Iris Jonas Kira Liam Maya Noor Omar".split()
_PLACES = (
    "Paris", "Lisbon", "the office", "the gym", "the park", "Berlin", "the clinic", "the lake",
    "the library", "Kyoto", "the market", "the station", "Denver", "the beach", "Oslo",
)  # fmt: skip
_NOUNS = (
    "project deadline budget meeting database schema report invoice client review server bug "
    "release recipe marathon guitar appointment ticket flight hotel course exam garden car "
    "apartment contract interview concert book movie dinner party birthday gift laptop phone "
    "camera bike dog cat plant painting workshop conference salary loan lease vaccine diet "
    "playlist podcast game puzzle fence roof kitchen"
).split()
_VERBS = (
    "finished started moved booked cancelled fixed reviewed bought sold planned visited "
    "painted cooked watched read signed rescheduled postponed shipped tested deployed "
    "discussed organised rented borrowed returned ordered"
).split()
_ADJECTIVES = (
    "new old big small early late quick long short busy quiet expensive cheap favourite "
    "second final next last weekly monthly annual urgent important tricky"
).split()
_FILLERS = (
    "I think",
    "Honestly,",
    "By the way,",
    "Also,",
    "To be fair,",
    "Well,",
    "Actually,",
    "So",
    "Yeah,",
    "Anyway,",
)
_SENTENCES = (
    "{name} {verb} the {adj} {noun} in {place} on {day}.",
    "We {verb} the {noun} last {weekday} and it took {n} hours.",
    "{filler} the {noun} was {adj}, so I {verb} it again.",
    "Can you remind me when {name} {verb} the {noun}?",
    "My {adj} {noun} costs about {n}0 dollars now.",
    "{filler} I want to keep the {noun} and the {noun2} for {name}.",
    "The {noun} in {place} is {adj} but the {noun2} is not.",
    "Did {name} say anything about the {adj} {noun}?",
    "Sure, here is a plan for the {noun}: first the {noun2}, then {place}, then the {adj} part.",
    "I {verb} {n} {noun}s with {name} after the {noun2}.",
)
_QUESTIONS = (
    "When did {name} {verb_base} the {noun}?",
    "What did I decide about the {adj} {noun}?",
    "Where did we {verb_base} the {noun} with {name}?",
    "How many {noun}s did I {verb_base} before the {noun2}?",
    "What does {name} think of the {noun} in {place}?",
    "Which {noun} did I {verb_base} first, the {adj} one or the {noun2}?",
)
_BASES = "finish start move book cancel fix review buy sell plan visit".split()
_WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()


def _sentence(rng: random.Random, template: str) -> str:
    n1, n2 = rng.sample(_NOUNS, 2)
    return template.format(
        name=rng.choice(_NAMES), verb=rng.choice(_VERBS), verb_base=rng.choice(_BASES),
        adj=rng.choice(_ADJECTIVES), noun=n1, noun2=n2, place=rng.choice(_PLACES),
        filler=rng.choice(_FILLERS), weekday=rng.choice(_WEEKDAYS), n=rng.randint(2, 12),
        day=f"{rng.choice(_WEEKDAYS)} the {rng.randint(1, 28)}th",
    )  # fmt: skip


def _message_text(rng: random.Random) -> str:
    """A few words to a few hundred: most messages one to three sentences, some long answers."""
    count = min(30, max(1, round(rng.lognormvariate(0.6, 0.9))))
    return " ".join(_sentence(rng, rng.choice(_SENTENCES)) for _ in range(count))


@dataclass(frozen=True)
class SyntheticConversation:
    """A check's synthetic history: sessions in order (with their wire form) and questions."""

    sessions: tuple[Segment, ...]
    wire: tuple[dict[str, Any], ...]  # asdict of each session, made once
    questions: tuple[str, ...]
    question_date: str | None

    @classmethod
    def draw(cls, n_units: int, seed: int) -> SyntheticConversation:
        rng = random.Random(seed)
        style = rng.choice(("beam", "locomo", "longmemeval"))
        speakers = ("user", "assistant") if style != "locomo" else tuple(rng.sample(_NAMES, 2))
        day = date(2020, 1, 1) + timedelta(days=rng.randint(0, 5 * 365))
        tag = hashlib.blake2b(seed.to_bytes(8, "big"), digest_size=4).hexdigest()
        sessions: list[Segment] = []
        counter, made = 0, 0
        while made < n_units:
            k = len(sessions) + 1
            size = min(rng.randint(*SESSION_SIZES), n_units - made)
            sid = f"{tag}_{k}" if style == "longmemeval" else str(k)
            messages = []
            for i in range(size):
                if style == "beam":
                    mid = str(counter)
                elif style == "locomo":
                    mid = f"D{k}:{i + 1}"
                else:
                    mid = f"{sid}:{i}"
                messages.append(Message(mid, speakers[i % 2], _message_text(rng)))
                counter += 1
            sessions.append(Segment(sid, day.isoformat(), tuple(messages)))
            made += size
            day += timedelta(days=rng.randint(0, 14))
        questions = tuple(_sentence(rng, rng.choice(_QUESTIONS)) for _ in range(3))
        wire = tuple(asdict(s) for s in sessions)
        return cls(tuple(sessions), wire, questions, (day + timedelta(days=3)).isoformat())

    def __len__(self) -> int:
        """The number of units (messages) in all its sessions."""
        return sum(len(s.messages) for s in self.sessions)

    def prefix(self, n_units: int) -> list[dict[str, Any]]:
        """The first ``n_units`` units' sessions, in wire form (the last one cut to fit)."""
        out, left = [], n_units
        for session in self.wire:
            if left <= 0:
                break
            messages = session["messages"]
            cut = session if len(messages) <= left else {**session, "messages": messages[:left]}
            out.append(cut)
            left -= len(messages)
        return out


class _Driver:
    """Evaluation's requests on ``host``, each with what is left of one deadline."""

    def __init__(self, host: Host, shape: BackendShape, deadline: float) -> None:
        self.host = host
        self.shape = shape
        self.deadline = deadline

    def call(self, op: str, payload: dict[str, Any] | None = None) -> tuple[Any, list[bytes]]:
        return self.host.call(op, payload, timeout=max(0.1, self.deadline - time.monotonic()))

    def open(self) -> None:
        self.call("open", self.shape.limits())

    def add(self, segment: dict[str, Any]) -> None:
        units, _ = self.call("units", {"segment": segment, "records": None})
        volume = add_embed_chars((m["content"] for m in segment["messages"]), units)
        payload = {"segment": segment, "units": units}
        self.host.call("add", payload, timeout=max(0.1, self.deadline - time.monotonic()),
                       embed_chars=volume)  # fmt: skip

    def ask(self, question: str, when: str | None) -> str:
        query, _ = self.call("query", {"question": question, "date": when, "record": None})
        result, _ = self.call("retrieve", {"query": query})
        text = result.get("text") if isinstance(result, dict) else None
        raw = result.get("raw_chars") if isinstance(result, dict) else None
        if type(text) is not str or type(raw) is not int:
            raise TierError("the host's answer to retrieve was not a text and its length")
        if raw > OUT_CHAR_BUDGET:
            raise TierError(
                f"Memory.retrieve returned {raw} characters; the budget is {OUT_CHAR_BUDGET}"
            )
        return text

    def state(self) -> str | None:
        """The memory's stored state's sha256, or the digest of a state that cannot be stored;
        None when neither can be had."""
        result, _ = self.call("dump", {"digest": True})
        if not isinstance(result, dict):
            return None
        if not result.get("stored"):
            digest = result.get("digest")
            return f"reachable:{digest}" if isinstance(digest, str) else None
        size, got, sha = result.get("bytes"), 0, hashlib.sha256()
        while type(size) is int and got < size:
            _, blobs = self.call("state_chunk", {"offset": got})
            if len(blobs) != 1 or not blobs[0]:
                raise TierError("the host's state chunks did not add up")
            sha.update(blobs[0])
            got += len(blobs[0])
        return f"stored:{sha.hexdigest()}"


_STATE_CHANGED = (
    "Memory.retrieve changed the memory's state; retrieve must leave the memory as it found it "
    "(retrievals are cached per index and query): compute it in index(), or keep it in a local "
    "variable of retrieve"
)
_ANSWER_CHANGED = (
    "Memory.retrieve answered the same query differently after another retrieve; its answer "
    "must depend on the indexed memory and the query only (retrievals are cached per index and "
    "query): keep nothing from one retrieve to the next"
)


def smoke_tier(host: Host, shape: BackendShape, seconds: float, seed: int) -> dict[str, Any]:
    """Tier 3 (see the module docstring): its details, or :class:`TierError`."""
    run = _Driver(host, shape, time.monotonic() + seconds)
    conversation = SyntheticConversation.draw(SMOKE_UNITS + 40, seed)  # a session after the units
    sessions = conversation.prefix(SMOKE_UNITS)
    empty = {**conversation.wire[len(sessions)], "messages": []}
    run.open()
    for session in (*sessions, empty):
        run.add(session)
    indexed = run.state()
    one, two, _ = conversation.questions
    when = conversation.question_date
    answer = run.ask(one, when)
    if indexed is not None and run.state() != indexed:
        raise TierError(_STATE_CHANGED)
    run.ask(two, when)
    if run.ask(one, when) != answer:
        raise TierError(_ANSWER_CHANGED)
    if indexed is not None and run.state() != indexed:
        raise TierError(_STATE_CHANGED)
    compared = indexed.split(":")[0] if indexed else None
    return {"retrieved_chars": len(answer), "retrieve_state_checked": indexed is not None,
            "state_compared": compared}  # fmt: skip


def probe_run(
    host: Host,
    shape: BackendShape,
    conversation: SyntheticConversation,
    units: int,
    deadline: float,
) -> dict[str, float]:
    """One run of the probe (see the module docstring): the host's CPU seconds and the
    number of sessions indexed."""
    run = _Driver(host, shape, deadline)
    sessions = conversation.prefix(units)
    run.open()
    before = host.cpu_seconds()
    for session in sessions:
        run.add(session)
    for question in conversation.questions[:2]:
        run.ask(question, conversation.question_date)
    return {"cpu_s": round(host.cpu_seconds() - before, 4), "sessions": len(sessions)}
