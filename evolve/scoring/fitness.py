"""Fitness: the one number selection reads, one definition per mode (design §4).

Owns :data:`MODES`, :data:`VERSION`, :data:`KEY`, :class:`BenchMetrics` (the metrics a bench's
answering modes read, given by its registry entry, :mod:`evolve.benches.registry`),
:class:`Fitness` (a mode bound to a bench's metrics and a BEAM judge variant: its per-question
value, its description and :meth:`Fitness.objective`, the words the LLM coder is told),
:func:`choose` (the one function that decides the mode) and :func:`retrieval_fitness` (the
offline definition).

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
- ``retrieval`` — offline, no task model: **evidence coverage** (:mod:`.coverage`, version
  :data:`~evolve.scoring.coverage.FITNESS_VERSION`): per evidence message, 1 when its text
  reached the context verbatim or nearly (whatever headers, bullets or order surround it), else
  the mean over its pieces (1 for a contained piece, else a capped credit by meaning), so part
  of a long message earns about its share; the mean over the question's evidence. Questions
  without evidence (such as BEAM's abstention questions) have no value and are left out.
  Evidence similarity and hit rate (:mod:`.retrieval`) are reported beside it, never selected on.

Invariants: the executor writes each question's value under :data:`KEY` into its trace scores
(so every aggregate block carries the mean of the mode's values as :data:`KEY`), and every
report and run records :meth:`Fitness.describe` (name, version, variant, and ``coverage``:
the coverage scorer's version), so :func:`mismatch` can refuse to mix scores of two
definitions. A score block without :data:`KEY` (old runs) reads as ``retrieval`` of its own
time: coverage where the block has it, else the version-1 mean of evidence similarity and hit
rate. A per-question value is a float in [0, 1] or None (no value under this mode: left out of
means and of the paired test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from evolve.models.llm import ModelConfig
from evolve.scoring.coverage import FITNESS_VERSION as COVERAGE_VERSION

MODES = ("judged", "answer-f1", "retrieval")
VERSION = "2"  # raised whenever a mode's definition changes (2: retrieval is evidence coverage)
KEY = "fitness"  # the per-question (and per-block) value in score dicts
VARIANTS = ("described", "official")  # BEAM's rubric judge variants (beam_judge.VARIANTS)
RETRIEVAL_METRIC = "evidence_coverage"
LEGACY_METRICS = ("evidence_similarity", "evidence_hit_rate")  # version 1's retrieval fitness
RECORDED = ("name", "version", "coverage", "variant")  # what must match to mix scores

Mode = Literal["judged", "answer-f1", "retrieval"]
Variant = Literal["described", "official"]

DEFINITIONS = {
    "judged": "the bench's judged score per question (every question, abstention included)",
    "answer-f1": "token F1 of the answer against the gold answer — answers are scored WITHOUT "
    "a judge",
    "retrieval": "evidence coverage: per evidence message 1 when its text reached the context "
    "(verbatim or nearly, in any format), else piece by piece (a part earns about its share); "
    "mean over the evidence",
}


def _retrieval_value(scores: dict[str, Any]) -> float | None:
    """Coverage where a block or trace has it; else (stored before coverage) version 1's mean of
    similarity and hit rate; None where it has neither."""
    value = scores.get(RETRIEVAL_METRIC)
    if isinstance(value, int | float):
        return float(value)
    legacy = [scores.get(m) for m in LEGACY_METRICS]
    present = [v for v in legacy if isinstance(v, int | float)]
    return sum(present) / len(legacy) if present else None


def retrieval_fitness(block: dict[str, Any] | None) -> float:
    """The retrieval fitness of a score block (evidence coverage); 0 when missing or empty."""
    return (_retrieval_value(block) if block else None) or 0.0


@dataclass(frozen=True)
class BenchMetrics:
    """A bench's metrics per answering mode that give a question's value, first non-None wins
    (``{variant}`` in a name: BEAM's rubric judge variant)."""

    judged: tuple[str, ...]
    answer_f1: tuple[str, ...]


@dataclass(frozen=True)
class Fitness:
    """One mode's fitness on one bench: ``metrics``, the bench's metrics of this mode (none for
    ``retrieval``); ``variant``: BEAM's rubric judge variant."""

    mode: Mode
    metrics: tuple[str, ...] = ()
    variant: Variant = "described"

    def question(self, scores: dict[str, Any]) -> float | None:
        """A question's value from its trace scores (None: no value under this mode)."""
        if self.mode == "retrieval":
            return _retrieval_value(scores)
        for template in self.metrics:
            value = scores.get(template.format(variant=self.variant))
            if isinstance(value, int | float):
                return float(value)
        return None

    def objective(self) -> str:
        """The fitness in words, for a proposer that must know what selection rewards: built from
        :data:`DEFINITIONS` and the mode's metrics, so it follows every change of either."""
        if self.mode == "retrieval":
            metric = RETRIEVAL_METRIC
        else:
            metric = " else ".join(self.metrics)
            metric = metric.format(variant=self.variant)
        return (
            f"Selection reads one value per question, {DEFINITIONS[self.mode]} (fitness "
            f"`{self.mode}` version {VERSION}, metric {metric}); a program is kept when its "
            "mean over held-out questions beats the current best's (a paired test). Other scores "
            "are shown for diagnosis only."
        )

    def describe(self) -> dict[str, Any]:
        """What is recorded in every report, score block and manifest."""
        return {"name": self.mode, "version": VERSION, "coverage": COVERAGE_VERSION,
                "variant": self.variant, "definition": DEFINITIONS[self.mode]}  # fmt: skip


def choose(
    metrics: BenchMetrics,
    task_model: ModelConfig | None,
    judged: bool,
    variant: Variant = "described",
) -> Fitness:
    """The fitness of a run or evaluation on a bench with ``metrics``: ``judged`` when a task
    model answers and a judge scores, ``answer-f1`` when a task model answers without a judge,
    else ``retrieval``."""
    if task_model is None:
        return Fitness("retrieval", (), variant)
    if judged:
        return Fitness("judged", metrics.judged, variant)
    return Fitness("answer-f1", metrics.answer_f1, variant)


def mode_of(described: dict[str, Any] | None) -> str:
    """The mode name a stored description records; ``retrieval`` for old runs without one."""
    return str((described or {}).get("name") or "retrieval")


def mismatch(stored: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """Why scores recorded under ``stored`` (a :meth:`Fitness.describe`) cannot be mixed with
    scores under ``current``; None when they can. A run from before versions were recorded
    never matches."""
    old = stored or {}
    differ = [k for k in RECORDED if old.get(k) != current.get(k)]
    if not differ:
        return None
    was = ", ".join(f"{k} {old.get(k) or 'unrecorded'}" for k in differ)
    now = ", ".join(f"{k} {current.get(k)}" for k in differ)
    return f"its scores were recorded under fitness {was}; this version scores {now}"
