"""Fitness: the one number selection reads, one definition per mode (issue 18; design §4).

Owns :data:`MODES`, :data:`VERSION`, :data:`KEY`, :class:`Fitness` (a mode bound to a bench
and a BEAM judge variant: its per-question value and its description), :func:`choose` (the one
function that decides the mode) and :func:`retrieval_fitness` (the offline definition).

Modes (:func:`choose`, from what a run or an evaluation is configured with):

- ``judged`` — a task model answers and a judge is configured: the bench's judged score per
  question. BEAM: the rubric judge in the chosen variant (``described`` by default, or
  ``official``), event ordering's ``tau_norm``; LoCoMo: the judge (``judge_correct``) for
  categories 1–4 and the official rule (``f1_official``) for category 5, which the judge
  protocol leaves out; LongMemEval: the per-type judge. Every question counts, abstention
  questions included.
- ``answer-f1`` — a task model answers, no judge: LoCoMo's official stemmed token F1
  (``f1_official``); BEAM and LongMemEval: ``answer_f1``, the same Porter-stemmed, normalised
  token F1 against the gold answer. Runs in this mode say that answers are scored without a
  judge.
- ``retrieval`` — offline, no task model: the mean of evidence similarity and evidence hit
  rate; questions without any retrieval metric (such as BEAM's abstention questions) have no
  value and are left out.

Invariants: the executor writes each question's value under :data:`KEY` into its trace scores
(so every aggregate block carries the mean of the mode's values as :data:`KEY`), and every
report and run records :meth:`Fitness.describe` (name, version, variant). A score block without
:data:`KEY` (old runs) reads as ``retrieval``. A per-question value is a float in [0, 1] or
None (no value under this mode: left out of means and of the paired test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from evolve.models.llm import ModelConfig

MODES = ("judged", "answer-f1", "retrieval")
VERSION = "1"  # raised whenever a mode's definition changes
KEY = "fitness"  # the per-question (and per-block) value in score dicts
VARIANTS = ("described", "official")  # BEAM's rubric judge variants (beam_judge.VARIANTS)
RETRIEVAL_METRICS = ("evidence_similarity", "evidence_hit_rate")

Mode = Literal["judged", "answer-f1", "retrieval"]
Variant = Literal["described", "official"]

# per mode and bench: the metrics that give a question's value, first non-None wins
_METRICS: dict[str, dict[str, tuple[str, ...]]] = {
    "judged": {
        "beam": ("beam_{variant}",),
        "locomo": ("judge_correct", "f1_official"),  # category 5 has no judge_correct
        "longmemeval": ("judge_correct",),
    },
    "answer-f1": {
        "beam": ("answer_f1",),
        "locomo": ("f1_official",),
        "longmemeval": ("answer_f1",),
    },
}

DEFINITIONS = {
    "judged": "the bench's judged score per question (every question, abstention included)",
    "answer-f1": "token F1 of the answer against the gold answer — answers are scored WITHOUT "
    "a judge",
    "retrieval": "mean of evidence similarity and evidence hit rate (offline retrieval metrics)",
}


def retrieval_fitness(block: dict[str, Any] | None) -> float:
    """Mean of evidence similarity and hit rate; 0 for a missing or empty block."""
    if not block:
        return 0.0
    values = [block.get(m) for m in RETRIEVAL_METRICS]
    present = [v for v in values if isinstance(v, int | float)]
    return sum(present) / len(values) if present else 0.0


@dataclass(frozen=True)
class Fitness:
    """One mode's fitness on one bench (``variant``: BEAM's rubric judge variant)."""

    mode: Mode
    bench: str
    variant: Variant = "described"

    def question(self, scores: dict[str, Any]) -> float | None:
        """A question's value from its trace scores (None: no value under this mode)."""
        if self.mode == "retrieval":
            if any(isinstance(scores.get(m), int | float) for m in RETRIEVAL_METRICS):
                return retrieval_fitness(scores)
            return None
        for template in _METRICS[self.mode].get(self.bench, ()):
            value = scores.get(template.format(variant=self.variant))
            if isinstance(value, int | float):
                return float(value)
        return None

    def describe(self) -> dict[str, Any]:
        """What is recorded in every report, score block and manifest."""
        return {"name": self.mode, "version": VERSION, "variant": self.variant,
                "definition": DEFINITIONS[self.mode]}  # fmt: skip


def choose(
    bench: str,
    task_model: ModelConfig | None,
    judged: bool,
    variant: Variant = "described",
) -> Fitness:
    """The fitness of a run or evaluation: ``judged`` when a task model answers and a judge
    scores, ``answer-f1`` when a task model answers without a judge, else ``retrieval``."""
    if task_model is None:
        return Fitness("retrieval", bench, variant)
    return Fitness("judged" if judged else "answer-f1", bench, variant)


def mode_of(described: dict[str, Any] | None) -> str:
    """The mode name a stored description records; ``retrieval`` for old runs without one."""
    return str((described or {}).get("name") or "retrieval")
