"""Benchmark: evidence coverage on a stored evaluation (a measurement script, not a test).

Reads the traces of an ``evolve eval`` run (``questions.jsonl``) and prints, with the real
MiniLM, the new offline fitness (:mod:`evolve.scoring.coverage`) of the retrieved texts as
they are and with their ``[date] `` prefixes stripped (the gaming case of issue 14 §1: the new
metric must not reward it), the old evidence hit rate of both, and the ceiling per split.

    evolve eval --program seeds/hybrid.py --split valid --data-dir DIR --runs-dir RUNS
    python bench/coverage.py --data-dir DIR --traces RUNS/<run-id>/questions.jsonl \
        [--ceiling-splits valid holdout]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from evolve.datasets.beam import load_taskset
from evolve.datasets.types import TaskSet
from evolve.models.embed import Embedder
from evolve.scoring.coverage import CoverageScorer, ceiling
from evolve.scoring.offline import OfflineScorer, ScoreInput
from evolve.trace import TraceError, read_trace

DATE_PREFIX = re.compile(r"^\[[^\]\n]*\] ", re.MULTILINE)


def evidence_of(tasks: TaskSet) -> dict[str, list[str]]:
    """Each question's evidence texts, rendered ``role: content`` as the executor does."""
    out: dict[str, list[str]] = {}
    for conv in tasks.conversations:
        messages = conv.messages()
        for q in tasks.questions:
            if q.conversation_id == conv.id:
                out[q.id] = [
                    f"{messages[e][1].role}: {messages[e][1].content}"
                    for e in q.evidence_ids
                    if e in messages
                ]
    return out


def _mean(values: list[float | None]) -> float:
    return float(np.mean([v for v in values if v is not None]))


def compare_traces(data: Path, traces: Path, embedder: Embedder) -> None:
    try:
        rows = [read_trace(line) for line in traces.read_text().splitlines() if line.strip()]
    except (OSError, TraceError) as exc:
        sys.exit(f"error: {traces}: {exc}")
    tasks = load_taskset(data, "valid")
    by_id, evidence = {q.id: q for q in tasks.questions}, evidence_of(tasks)
    coverage, old = CoverageScorer(embedder), OfflineScorer(embedder)
    for label, strip in (("as retrieved", False), ("date prefixes stripped", True)):
        texts = [DATE_PREFIX.sub("", t.retrieved_text) if strip else t.retrieved_text for t in rows]
        began = time.perf_counter()
        new = coverage.coverage([(evidence[t.id], x) for t, x in zip(rows, texts, strict=True)])
        seconds = time.perf_counter() - began
        items = [
            ScoreInput(by_id[t.id], evidence[t.id], x) for t, x in zip(rows, texts, strict=True)
        ]
        hits = [s["evidence_hit_rate"] for s in old.score(items)]
        print(
            f"{label:24s} coverage {_mean([r['evidence_coverage'] for r in new]):.3f}"
            f"  contained {_mean([r['evidence_contained'] for r in new]):.3f}"
            f"  old hit rate {_mean(hits):.3f}  ({len(rows)} questions, {seconds:.1f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--traces", type=Path, help="questions.jsonl of a valid-split eval")
    parser.add_argument("--ceiling-splits", nargs="*", default=["valid", "holdout"])
    parser.add_argument("--cache-dir", type=Path, help="embedding cache folder (default: temp)")
    args = parser.parse_args()
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="coverage-"))
    embedder = Embedder(cache / "embeddings.sqlite")
    for split in args.ceiling_splits:
        top = ceiling(list(evidence_of(load_taskset(args.data_dir, split)).values()),
                      CoverageScorer(embedder))  # fmt: skip
        print(f"ceiling {split:8s} {top.mean:.3f} (budget {top.budget}, {top.fitness_version})")
    if args.traces:
        compare_traces(args.data_dir, args.traces, embedder)


if __name__ == "__main__":
    main()
