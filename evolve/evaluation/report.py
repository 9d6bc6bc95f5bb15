"""The typed records at evaluation's edges: an evaluation's report and what a candidate keeps.

Owns :class:`EvalReport` (one evaluation: :class:`ReportMeta`, :class:`ReportScores`, step
counters, usage, work, traces), the score records :class:`MetricRow` (one row of means:
``overall``, a capability, a question type) and :class:`ScoreBlock` (what a candidate keeps of
one evaluation, filed per split in ``CandidateMeta.scores``; a frozen candidate's test block is
its :data:`TEST_FIELDS`), the records inside them (:class:`FitnessMode`, :class:`JudgeRecord`,
:class:`CeilingRecord`), and :func:`read_report` (an ``evolve eval`` folder's ``report.json``,
as :class:`SavedReport`).

Invariants:

- **The JSON is what it always was.** Each record dumps to the keys it was read or built with,
  with the same values: declared fields first, in the order evaluation writes them, then the
  keys a record does not declare (a bench's answer metrics in a row, a key of another
  version), in theirs. A declared field is written only when it was set (by the file read, or
  by the code that built the record), so a field an older file lacks reads as its default and
  is not added when the record is written back. A field whose on-disk key is another word
  keeps that key as its alias, read and written (``ScoreBlock.steps`` is ``stages``, the word
  the pipeline's steps were once stored under). A stored candidate's record round-trips byte
  for byte, so its checksum holds (``tests/test_report.py``).
- **Only this module reads these records by key**: everywhere else in ``evolve/`` they are
  read by attribute, which mypy checks (``tests/test_report_keys.py`` fails on a read by key).
- Records are frozen: a changed block is a new one (``model_copy(update=...)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from evolve.trace import QuestionTrace

TEST_FIELDS = ("fitness", "overall", "by_capability", "errors")  # a frozen candidate's test block
Diagnostics = dict[str, dict[str, float | None]]  # group (capability, "overall") -> means
Headline = dict[str, Any]  # the bench's own headline numbers (its answer scorer's summary)


class _Record(BaseModel):
    """A record written back exactly as read: unset declared fields are left out, undeclared
    keys are kept, a field with an on-disk key of its own (``serialization_alias``, also its
    ``validation_alias``) is written under that key (see the module's first invariant)."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    @model_serializer(mode="wrap")
    def _as_read(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        declared = type(self).model_fields
        field_of = {name: name for name in declared}  # a key of the dump -> its field
        field_of |= {f.serialization_alias: n for n, f in declared.items() if f.serialization_alias}
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = field_of.get(key)
            if name is None:  # not declared: kept as read
                out[key] = value
            elif name in self.model_fields_set:
                out[declared[name].serialization_alias or name] = value
        return out

    def is_empty(self) -> bool:
        """Whether nothing was read or set (the JSON is ``{}``)."""
        return not self.model_fields_set


class MetricRow(_Record):
    """Means over a group of questions: ``n`` (questions), the fitness of the evaluation's mode,
    the coverage ceiling, and every other metric of the evaluation (:meth:`metric`), None
    where no question of the group has a value."""

    n: int = 0
    fitness: float | None = None
    ceiling: float | None = None

    def metric(self, name: str) -> float | None:
        """The mean of metric ``name`` (None: not recorded, or no value)."""
        value = self.as_scores().get(name)
        return float(value) if isinstance(value, int | float) else None

    def has(self, name: str) -> bool:
        """Whether the row records metric ``name`` (a row from before it was kept does not)."""
        return name in self.as_scores()

    def as_scores(self) -> dict[str, Any]:
        """The row as its JSON: metric -> mean, and ``n``."""
        return self.model_dump()


class FitnessMode(_Record):
    """A fitness mode as recorded (:meth:`evolve.scoring.fitness.Fitness.describe`); a record
    from before modes were recorded names ``retrieval``."""

    name: str = "retrieval"
    version: str | None = None
    coverage: str | None = None
    variant: str | None = None
    definition: str | None = None


class ScoreBlock(_Record):
    """What a candidate keeps of one evaluation (one split, the minibatch or a guard): the
    fitness mode, the rows overall and per capability, the bench's headline, failed and
    unjudged questions, per-question fitness and capability, step diagnostics (train of the
    seed and its revisions, else None), step counters (``steps``, stored as ``stages``), and,
    for an integrated candidate on valid, its routing comparison. A test block holds
    :data:`TEST_FIELDS` only."""

    fitness: FitnessMode | None = None
    overall: MetricRow = MetricRow()
    by_capability: dict[str, MetricRow] = {}
    headline: Headline | None = None
    errors: int = 0
    unjudged: int = 0
    questions: dict[str, float] = {}
    question_capabilities: dict[str, str | None] = {}
    diagnostics: Diagnostics | None = None
    steps: dict[str, dict[str, int]] = Field(
        default={}, validation_alias="stages", serialization_alias="stages"
    )
    routing: dict[str, Any] | None = None

    @classmethod
    def of(cls, report: EvalReport, questions: dict[str, float]) -> ScoreBlock:
        """The block of ``report``, with the per-question fitness ``questions``."""
        return cls(
            fitness=report.meta.fitness,
            overall=report.scores.overall,
            by_capability=report.scores.by_capability,
            headline=report.scores.headline,
            errors=report.meta.errors,
            unjudged=report.meta.unjudged,
            questions=questions,
            question_capabilities={t.id: t.capability for t in report.traces},
            diagnostics=report.scores.diagnostics,
            steps=report.steps,
        )

    @classmethod
    def test_block(cls, report: EvalReport) -> ScoreBlock:
        """The test block of ``report`` (:data:`TEST_FIELDS`)."""
        m, s = report.meta, report.scores
        return cls(fitness=m.fitness, overall=s.overall, by_capability=s.by_capability,
                   errors=m.errors)  # fmt: skip

    def row(self, capability: str | None) -> MetricRow | None:
        """The overall row (``capability`` None) or a capability's (None where not scored)."""
        if capability is None:
            return self.overall if "overall" in self.model_fields_set else None
        return self.by_capability.get(capability)

    def questions_of(self, capability: str | None) -> dict[str, float]:
        """Per-question fitness of one capability's questions (None: of all of them)."""
        caps = self.question_capabilities
        return {q: v for q, v in self.questions.items()
                if capability is None or caps.get(q) == capability}  # fmt: skip


class JudgeRecord(_Record):
    """The answer scorer's record (:meth:`evolve.scoring.answers.AnswerScorer.describe`)."""

    judge: str | None = None  # the judge model's id; None: no judge
    prompts: dict[str, str] = {}  # prompt name -> sha256
    variants: list[str] = []
    note: str = ""


class CeilingRecord(_Record):
    """The coverage ceiling of the evaluated questions: scorer version, budget, overall."""

    fitness_version: str | None = None
    budget: int | None = None
    overall: float | None = None


class ReportMeta(_Record):
    """What was evaluated and how: program, data, mode, models, scorers, failures, time.
    ``traces`` is set by ``evolve eval`` (where it wrote them). The fields an evaluation folder
    is described by are required; the others read as their defaults from an older report."""

    program: str
    program_hash: str = ""
    fingerprints: dict[str, str] = {}
    bench: str
    split: str
    conversations: int
    questions: int
    mode: str
    models: dict[str, str | None] = {}
    judge: JudgeRecord = JudgeRecord()
    fitness: FitnessMode | None = None
    ceiling: CeilingRecord | None = None
    metrics: list[str] = []
    hit_threshold: float | None = None
    errors: int
    unstored_memory: dict[str, str] = {}  # conversation -> why its memory could not be stored
    unjudged: int = 0
    seconds: float = 0.0
    time: dict[str, float] = {}  # model_wait, sandbox, local (summed over conversations), judging
    traces: str | None = None


class ReportScores(_Record):
    """An evaluation's scores: rows overall, per capability and per question type; the bench's
    headline when a task model answered; step diagnostics when asked for."""

    overall: MetricRow
    by_capability: dict[str, MetricRow] = {}
    by_type: dict[str, MetricRow] = {}
    headline: Headline | None = None
    diagnostics: Diagnostics | None = None


@dataclass
class EvalReport:
    """One evaluation's report. ``steps`` holds the step counters (computed, reused, ...) per
    pipeline step and ``work`` the seconds per step (``stage_seconds``) and the workers'
    embedding work; the JSON keeps the names reports and stored candidate scores were written
    with (``stages`` for the counters)."""

    meta: ReportMeta
    scores: ReportScores
    steps: dict[str, dict[str, int]]
    usage: dict[str, dict[str, Any]]
    work: dict[str, dict[str, float]]
    traces: list[QuestionTrace] = field(repr=False)

    def as_json(self) -> dict[str, Any]:
        """The report as ``report.json`` and ``evolve eval --json`` write it (no traces)."""
        return {"meta": self.meta.model_dump(), "scores": self.scores.model_dump(),
                "stages": self.steps, "usage": self.usage, "work": self.work}  # fmt: skip


@dataclass(frozen=True)
class SavedReport:
    """A ``report.json`` read back: its meta and scores."""

    meta: ReportMeta
    scores: ReportScores


def read_report(path: Path) -> SavedReport:
    """The ``report.json`` at ``path``; OSError when unreadable, ValueError when it is not a
    report (pydantic's ValidationError included)."""
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return SavedReport(
        ReportMeta.model_validate(data["meta"] if "meta" in data else None),
        ReportScores.model_validate(data["scores"] if "scores" in data else None),
    )
