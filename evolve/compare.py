"""Side-by-side evaluation of several memory programs on one split (``evolve compare``).

Owns :data:`REFERENCE_PROGRAMS`, :class:`ProgramRow` (one program's figures; ``as_json()`` is
its ``evolve compare --json`` entry) and :func:`compare_programs`. Each program is evaluated with
:func:`evolve.evaluation.executor.run_eval` exactly as ``evolve eval`` would (same sandbox check,
same step reuse, same scoring); the comparison adds what a user weighs against the scores: the
context a program hands to the answer model (characters and estimated tokens per question) and
how long ``retrieve()`` takes, and the coverage ceiling of the split (the same for every
program: the gold evidence packed into the budget).

Invariants: every program sees the same task set and the same
:class:`~evolve.evaluation.setup.EvalSetup`; a question a program fails counts as 0 in its
scores, and its row says how many failed and the first error (``errors``, ``first_error``),
which the CLI shows beside the figures; retrieval latency is the wall time of the host's
``retrieve`` call for each question (indexing excluded), recorded when the retrieval was
computed and kept with its cached output, so a cached run reports the latency measured when it
was computed (None for outputs cached before latencies were kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evolve.datasets.types import GROUPS, TaskSet
from evolve.evaluation.distributed import JobBackend
from evolve.evaluation.executor import ProgressFn, run_eval
from evolve.evaluation.report import FitnessMode, ReportScores
from evolve.evaluation.setup import EvalSetup
from evolve.evolution.archive import fitness
from evolve.models.llm import LLMClient
from evolve.resources import seed_file
from evolve.scoring.fitness import Variant, retrieval_fitness
from evolve.trace import first_error

REFERENCE_PROGRAMS = ("simple", "dense", "hybrid", "prism", "ariadne")
CHARS_PER_TOKEN = 4  # an estimate; the table says so


def reference_programs() -> list[Path]:
    """The shipped seeds and reference programs that exist in this installation."""
    paths = [seed_file(f"{name}.py") for name in REFERENCE_PROGRAMS]
    return [p for p in paths if p.is_file()]


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass(frozen=True)
class ProgramRow:
    """One program of a comparison: fitness (the mode's) overall and per capability, the
    retrieval fitness (evidence coverage) beside its ceiling, similarity and hit rate as
    diagnostics, context size, retrieval latency (p50/p95 ms), failed questions and the first
    error, and the full report's scores."""

    program: str
    fitness: float
    fitness_mode: FitnessMode | None
    retrieval_fitness: float
    ceiling: float | None
    by_capability: dict[str, float]
    evidence_similarity: float | None
    evidence_hit_rate: float | None
    context_chars: float | None
    context_tokens: float | None
    retrieve_ms_p50: float | None
    retrieve_ms_p95: float | None
    latency_questions: int
    errors: int
    first_error: str | None
    scores: ReportScores

    def as_json(self) -> dict[str, Any]:
        mode = None if self.fitness_mode is None else self.fitness_mode.model_dump()
        return {**self.__dict__, "fitness_mode": mode, "scores": self.scores.model_dump()}


def compare_programs(
    paths: list[Path],
    tasks: TaskSet,
    setup: EvalSetup,
    *,
    backend: JobBackend,
    judge: LLMClient | None = None,
    on_progress: ProgressFn | None = None,
    judge_variant: Variant = "described",
) -> list[ProgramRow]:
    """One row per program (:class:`ProgramRow`), in the order given."""
    rows = []
    for path in paths:
        report = run_eval(path, tasks, setup, judge=judge, on_progress=on_progress,
                          backend=backend, judge_variant=judge_variant)  # fmt: skip
        traces = [t for t in report.traces if not t.error]
        chars = [len(t.retrieved_text) for t in traces]
        latency = [t.retrieve_ms for t in traces if t.retrieve_ms is not None]
        overall, by_cap = report.scores.overall, report.scores.by_capability
        rows.append(ProgramRow(
            program=str(path),
            fitness=fitness(overall),
            fitness_mode=report.meta.fitness,
            retrieval_fitness=retrieval_fitness(overall.as_scores()),
            ceiling=overall.ceiling,
            by_capability={c: fitness(by_cap.get(c)) for c in GROUPS if c in by_cap},
            evidence_similarity=overall.metric("evidence_similarity"),
            evidence_hit_rate=overall.metric("evidence_hit_rate"),
            context_chars=float(np.mean(chars)) if chars else None,
            context_tokens=float(np.mean(chars)) / CHARS_PER_TOKEN if chars else None,
            retrieve_ms_p50=_percentile(latency, 50),
            retrieve_ms_p95=_percentile(latency, 95),
            latency_questions=len(latency),
            errors=report.meta.errors,
            first_error=first_error(report.traces) or None,
            scores=report.scores,
        ))  # fmt: skip
    return rows
