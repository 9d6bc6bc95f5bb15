"""The kinds of probing question ``evolve synth`` writes, and what each one asks of the checks.

Owns :class:`Kind` and :data:`KINDS` (by name, in the order a window is asked for them).

Invariants:

- Each kind maps to one capability of :data:`evolve.datasets.types.CAPABILITIES`: factual → F,
  temporal → T, preference → P, multi-session → M, update → T (a changed fact is tracked over
  time), adversarial → A.
- ``sessions`` is the number of distinct sessions a question's evidence must come from (2 for
  multi-session); the windows a kind is asked of can hold that many
  (:mod:`evolve.synth.windows`).
- ``answerable`` is False for the adversarial kind only: its questions are meant to have no
  answer in the history (the right answer says so). The support check asks of them whether the
  cited messages are consistent with that, and the "answerable without the history" check
  does not apply to them: their right answer is what a model with no context gives anyway
  (:mod:`evolve.synth.checks`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    capability: str
    instruction: str  # what the writer is asked for, one sentence or two
    sessions: int = 1  # distinct sessions its evidence must span
    answerable: bool = True  # the history answers its questions (not: adversarial)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "factual",
            "F",
            "ask for a specific fact stated in the messages (a name, number, place, item); the "
            "answer is that fact.",
        ),
        Kind(
            "temporal",
            "T",
            "ask about when something happened or the order or time between events, using the "
            "session dates and what the messages say about time; the answer is a date, a "
            "duration or an order.",
        ),
        Kind(
            "preference",
            "P",
            "ask what the user likes, dislikes, prefers or habitually does, as the messages "
            "show it; the answer states the preference.",
        ),
        Kind(
            "multi-session",
            "M",
            "ask something whose answer needs facts from at least two different sessions "
            "combined (counting, comparing, connecting); cite messages from each session used.",
            sessions=2,
        ),
        Kind(
            "update",
            "T",
            "ask about something that changed or was corrected in the messages (a plan, a "
            "number, a preference); the answer is the latest state; cite the message that "
            "says it last.",
        ),
        Kind(
            "adversarial",
            "A",
            "ask about something plausible that the messages never say, or that rests on a "
            "false premise; the answer says the history does not contain it (and what it does "
            "say, if related); cite the messages closest to the topic.",
            answerable=False,
        ),
    )
}
