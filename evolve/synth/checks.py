"""The four checks a written question must pass to be kept, each dropping it with a reason.

Owns :data:`CHECKS` (their names, in the order they run), :class:`Verdict`, :func:`resolve`
(the evidence ids that exist), the model checks
:func:`support`, :func:`supersede` and :func:`closed_book` (role ``task``, purposes
:data:`PURPOSES`), the model-free :class:`Seen` (the duplicate check) and the text rules they
share (:func:`content_words`, :func:`normalized`).

0. Before any check, :func:`resolve` drops the cited ids that name no message of the window
   the writer saw (a bracketed ``[m3]`` counts as ``m3``), so a kept question cites only
   messages that exist.
1. **unsupported** — before any call, a question left with no evidence, or whose kind needs
   more sessions than its evidence spans (multi-session: two), fails.
   Then a separate call sees ONLY the cited messages, the question and the answer, and says
   whether they support it (for an adversarial question: whether they are consistent with an
   answer that says the history does not hold what is asked).
2. **superseded** — messages after the last cited one that share at least
   :data:`MIN_SHARED` content words with the question and answer (the :data:`MAX_LATER` that
   share most; ties: the earlier) are shown with the question, the answer and the cited
   messages; a call says whether one of them changed the answer. No such message: passed
   with no call.
3. **closed-book** — the model answers the question with no context (``synth/closed-book``);
   an abstention ("unknown", empty) is no match and a reply holding every content word of
   the gold answer is a match, both with no further call; otherwise a judging call
   (``synth/match``) says whether the two answers agree. A match fails the question: it is
   answerable without the history. Not applied to adversarial questions: their right answer
   ("the history does not say") is what a model with no context gives, so every one would be
   dropped.
4. **duplicate** — no model call: a question whose :func:`normalized` text equals, or whose
   :func:`content_words` overlap (Jaccard) at least :data:`DUPLICATE_JACCARD`, that of a kept
   question of the same conversation fails (questions of different conversations ask about
   different histories).

Invariants: every request is a pure function of the question, its window and the history, so
a rerun is answered from the request cache; a check that fails returns its verdict and the
later checks are not run (their calls are not made).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from pydantic import BaseModel, Field, StrictBool, StrictStr, create_model

from contract.types import Message, Segment
from evolve.datasets.types import Conversation
from evolve.models.llm import LLMClient
from evolve.synth.windows import Window, history, show
from evolve.synth.write import Draft, validated

CHECKS = ("unsupported", "superseded", "closed-book", "duplicate")
PURPOSES = {
    "unsupported": "synth/support",
    "superseded": "synth/supersede",
    "closed-book": "synth/closed-book",
    "match": "synth/match",
}
MIN_SHARED = 2
MAX_LATER = 6
DUPLICATE_JACCARD = 0.8
ABSTAIN = frozenset({"", "unknown", "i don t know", "i do not know", "not known", "no idea"})
STOPWORDS = frozenset(
    "the and for are was were has have had with that this what which who whom whose when where "
    "why how did does do you your yours his her hers its our ours their theirs they them she "
    "him not but from into about over after before than then there here any all some can could "
    "would should will shall may might must been being also just very much many more most such "
    "user assistant".split()
)
_WORD = re.compile(r"\w+")
_FLAG_REASON = {"type": "string"}


@dataclass(frozen=True)
class Verdict:
    check: str
    passed: bool
    reason: str


def normalized(text: str) -> str:
    """Lower case, words only, single spaces."""
    return " ".join(_WORD.findall(text.lower()))


def content_words(text: str) -> frozenset[str]:
    """The words of ``text`` that carry its subject: lower-cased, not stop words, three letters
    or more (any number counts)."""
    words = _WORD.findall(text.lower())
    return frozenset(w for w in words if w not in STOPWORDS and (len(w) >= 3 or w.isdigit()))


class _Flag(BaseModel):
    """A yes/no check's reply: ``flag`` (under the check's own key, :func:`_flag_reply`) and a
    reason, any JSON value (kept as one line of at most 300 characters)."""

    flag: StrictBool
    reason: Any = None

    def said(self) -> tuple[bool, str]:
        reason = "" if self.reason is None else " ".join(str(self.reason).split())[:300]
        return self.flag, reason


@cache
def _flag_reply(key: str) -> type[_Flag]:
    """The reply record of a check that says yes or no under ``key``."""
    return create_model(f"_Flag_{key}", __base__=_Flag,
                        flag=(StrictBool, Field(validation_alias=key)))  # fmt: skip


class _Guess(BaseModel):
    answer: StrictStr


def _flag(key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {key: {"type": "boolean"}, "reason": _FLAG_REASON},
        "required": [key, "reason"],
    }


def _ask(client: LLMClient, purpose: str, text: str, key: str) -> tuple[bool, str]:
    """A yes/no call: ``text`` (ending in a newline), then the JSON reply asked for, ``key``
    true or false and a reason; its flag and reason."""
    text += f'Reply with JSON only: {{"{key}": true or false, "reason": "one sentence"}}'
    reply = client.complete_json(
        "task", purpose, text, _flag(key), lambda d: validated(_flag_reply(key), d)
    )
    return reply.said()


def _resolve(cited: str, known: dict[str, str]) -> str | None:
    for candidate in (cited, cited.strip(), cited.strip().strip("[]").strip()):
        if candidate in known:
            return candidate
    return None


def resolve(draft: Draft, window: Window) -> Draft:
    """The draft citing only messages of its window (each once); the other ids it cited go to
    ``unknown``. Run before every check, so whatever is kept cites messages that exist."""
    known = window.session_of()
    found = [_resolve(e, known) for e in draft.evidence]
    evidence = tuple(dict.fromkeys(e for e in found if e is not None))
    unknown = tuple(e for e, f in zip(draft.evidence, found, strict=True) if f is None)
    return replace(draft, evidence=evidence, unknown=unknown)


def support(
    client: LLMClient, draft: Draft, window: Window, conversation: Conversation, chars: int
) -> Verdict:
    """Check 1 (see the module docstring) of a draft :func:`resolve` has seen."""
    known = window.session_of()
    evidence = draft.evidence
    gone = f" (cited ids not in its window: {', '.join(draft.unknown)})" if draft.unknown else ""
    if not evidence:
        return Verdict("unsupported", False, f"no cited message exists{gone}")
    sessions = {known[e] for e in evidence}
    if len(sessions) < draft.kind.sessions:
        why = (f"a {draft.kind.name} question needs evidence from {draft.kind.sessions} "
               f"sessions; its cited messages are from {len(sessions)}{gone}")  # fmt: skip
        return Verdict("unsupported", False, why)
    cited = [(s, m) for s, m in history(conversation) if m.id in evidence]
    if draft.kind.answerable:
        ask = "Do these messages alone support the proposed answer to the question?"
    else:
        ask = ("The question is meant to be unanswerable from the history: the proposed answer "
               "says the history does not hold what is asked, or that its premise is false. "
               "Are these messages consistent with that answer (they concern the topic but do "
               "not state what is asked, or contradict the premise)?")  # fmt: skip
    text = (
        "You check a question written about a user's conversation history. You see only the "
        f"messages it cites.\n\nCited messages:\n{show(cited, chars)}\n\n"
        f"Question: {draft.question}\nProposed answer: {draft.answer}\n\n{ask}\n"
    )
    ok, reason = _ask(client, PURPOSES["unsupported"], text, "supported")
    said = "supported" if ok else "the cited messages do not support it"
    return Verdict("unsupported", ok, f"{said}: {reason}{gone}" if reason else said + gone)


def later_messages(draft: Draft, conversation: Conversation) -> list[tuple[Segment, Message]]:
    """The messages after the last cited one that share the question's subject (check 2's
    candidates, in history order)."""
    placed = history(conversation)
    last = max((i for i, (_, m) in enumerate(placed) if m.id in draft.evidence), default=-1)
    subject = content_words(f"{draft.question} {draft.answer}")
    need = min(MIN_SHARED, len(subject))
    scored = []
    for i in range(last + 1, len(placed)):
        shared = len(subject & content_words(placed[i][1].content))
        if need and shared >= need:
            scored.append((-shared, i))
    picked = sorted(i for _, i in sorted(scored)[:MAX_LATER])
    return [placed[i] for i in picked]


def supersede(client: LLMClient, draft: Draft, conversation: Conversation, chars: int) -> Verdict:
    """Check 2 (see the module docstring)."""
    later = later_messages(draft, conversation)
    if not later:
        return Verdict("superseded", True, "no later message shares its subject")
    cited = [(s, m) for s, m in history(conversation) if m.id in draft.evidence]
    text = (
        "A question about a user's conversation history was answered from these messages:\n"
        f"{show(cited, chars)}\n\nQuestion: {draft.question}\nAnswer: {draft.answer}\n\n"
        f"These messages came later in the same conversation:\n{show(later, chars)}\n\n"
        "Does a later message change, correct or contradict the answer, so that it no longer "
        "holds at the end of the conversation?\n"
    )
    changed, reason = _ask(client, PURPOSES["superseded"], text, "changed")
    said = "a later message changed the answer" if changed else "no later message changed it"
    return Verdict("superseded", not changed, f"{said}: {reason}" if reason else said)


def closed_book(client: LLMClient, draft: Draft) -> Verdict:
    """Check 3 (see the module docstring)."""
    if not draft.kind.answerable:
        return Verdict("closed-book", True, f"not applied to {draft.kind.name} questions")
    text = (
        "Answer this question about a user's past conversations with an assistant. You cannot "
        "see the conversations: answer only if you can tell without them, else answer "
        f'"unknown".\n\nQuestion: {draft.question}\n'
        'Reply with JSON only: {"answer": "..."}'
    )
    schema = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"]}  # fmt: skip
    reply = client.complete_json(
        "task", PURPOSES["closed-book"], text, schema, lambda d: validated(_Guess, d)
    )
    guess = " ".join(reply.answer.split())
    if normalized(guess) in ABSTAIN:
        return Verdict("closed-book", True, "with no context the model did not know")
    gold = content_words(draft.answer)
    if gold and gold <= content_words(guess):
        return Verdict("closed-book", False, f"answered without the history: {guess[:200]}")
    judge = (
        "Do these two answers to the question give the same answer?\n\n"
        f"Question: {draft.question}\nReference answer: {draft.answer}\n"
        f"Other answer: {guess}\n\n"
    )
    same, _ = _ask(client, PURPOSES["match"], judge, "same")
    if same:
        return Verdict("closed-book", False, f"answered without the history: {guess[:200]}")
    return Verdict(
        "closed-book", True, f"with no context the model answered otherwise: {guess[:200]}"
    )


class Seen:
    """Check 4: the kept questions so far, by conversation; not thread-safe (one caller, in a
    fixed order)."""

    def __init__(self) -> None:
        self._kept: dict[str, list[tuple[str, str, frozenset[str]]]] = {}

    def duplicate(self, conversation: str, question: str) -> Verdict:
        text, words = normalized(question), content_words(question)
        for other, other_text, other_words in self._kept.get(conversation, ()):
            union = words | other_words
            if text == other_text or (union and len(words & other_words) / len(union)
                                      >= DUPLICATE_JACCARD):  # fmt: skip
                return Verdict("duplicate", False, f"duplicates {other}")
        return Verdict("duplicate", True, "no kept question of its conversation is the same")

    def keep(self, conversation: str, qid: str, question: str) -> None:
        self._kept.setdefault(conversation, []).append(
            (qid, normalized(question), content_words(question))
        )
