"""Benchmark: evidence coverage on a stored evaluation (a measurement script, not a test).

Reads the traces of an ``evolve eval`` run (``questions.jsonl``) and prints, with the real
MiniLM, the offline fitness (:mod:`evolve.scoring.coverage`) of the retrieved texts as they
are and with their ``[date] `` prefixes stripped (the gaming case: the metric
must not reward it), the hit rate of both, and the ceiling per split. ``--calibrate`` measures
what the meaning ramp (COS_FLOOR, COS_FULL, SEMANTIC_CAP) gives where containment does not
decide: each question's evidence against another conversation's retrieved text (unrelated),
the evidence its own retrieved text did not contain (same-topic neighbours), and the
hand-written paraphrases of ``bench/paraphrases.json`` (evidence ids of BEAM-100K valid).

    evolve eval --program seeds/hybrid.py --split valid --data-dir DIR --runs-dir RUNS
    python bench/coverage.py --data-dir DIR --traces RUNS/<run-id>/questions.jsonl \
        [--ceiling-splits valid holdout] [--calibrate] [--shares holdout]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from evolve.datasets.beam import load_taskset
from evolve.models.embed import Embedder
from evolve.scoring import coverage as cv
from evolve.scoring.coverage import CoverageScorer, ceiling
from evolve.trace import QuestionTrace, TraceError, read_trace

DATE_PREFIX = re.compile(r"^\[[^\]\n]*\] ", re.MULTILINE)
PARAPHRASES = Path(__file__).with_name("paraphrases.json")


def _mean(values: list[float | None]) -> float:
    return float(np.mean([v for v in values if v is not None]))


def _rows(traces: Path) -> list[QuestionTrace]:
    try:
        return [read_trace(line) for line in traces.read_text().splitlines() if line.strip()]
    except (OSError, TraceError) as exc:
        sys.exit(f"error: {traces}: {exc}")


def compare_traces(data: Path, traces: Path, embedder: Embedder) -> None:
    rows = _rows(traces)
    evidence = load_taskset(data, "valid").evidence_texts()
    scorer = CoverageScorer(embedder)
    for label, strip in (("as retrieved", False), ("date prefixes stripped", True)):
        texts = [DATE_PREFIX.sub("", t.retrieved_text) if strip else t.retrieved_text for t in rows]
        began = time.perf_counter()
        new = scorer.coverage([(evidence[t.id], x) for t, x in zip(rows, texts, strict=True)])
        seconds = time.perf_counter() - began
        print(
            f"{label:24s} coverage {_mean([r['evidence_coverage'] for r in new]):.3f}"
            f"  contained {_mean([r['evidence_contained'] for r in new]):.3f}"
            f"  hit rate {_mean([r['evidence_hit_rate'] for r in new]):.3f}"
            f"  ({len(rows)} questions, {seconds:.1f} s)"
        )


def _cosines(scorer: CoverageScorer, pairs: list[tuple[list[str], str]], missed: bool) -> list:
    """Max cosines of the pairs' evidence messages (``missed``: only those not contained)."""
    return [x for m in scorer.measure(pairs) for c, x in zip(m.contained, m.cosines, strict=True)
            if not (missed and c)]  # fmt: skip


def calibrate(data: Path, traces: Path, embedder: Embedder) -> None:
    """What the meaning ramp gives to unrelated text, same-topic neighbours and paraphrases."""
    tasks = load_taskset(data, "valid")
    evidence = tasks.evidence_texts()
    rows = [t for t in _rows(traces) if evidence.get(t.id)]
    others = [next(o for o in rows[i + 1 :] + rows[:i] if o.conversation_id != t.conversation_id)
              for i, t in enumerate(rows)]  # fmt: skip
    texts = {f"{c.id}#{m}": msg.text() for c in tasks.conversations
             for m, (_, msg) in c.messages().items()}  # fmt: skip
    written = [
        ([texts[p["evidence"]]], p["paraphrase"]) for p in json.loads(PARAPHRASES.read_text())
    ]
    scorer = CoverageScorer(embedder)
    groups = {
        "unrelated (other conversation)": _cosines(
            scorer, [(evidence[t.id], o.retrieved_text) for t, o in zip(rows, others, strict=True)],
            missed=False),
        "same-topic, not contained": _cosines(
            scorer, [(evidence[t.id], t.retrieved_text) for t in rows], missed=True),
        "hand-written paraphrases": _cosines(scorer, written, missed=True),
    }  # fmt: skip
    print(f"ramp: floor {cv.COS_FLOOR}, full {cv.COS_FULL}, cap {cv.SEMANTIC_CAP}")
    for label, values in groups.items():
        cos = np.array(values)
        credit = float(np.mean([cv.semantic_credit(c) for c in cos]))
        spread = f"p90 {np.percentile(cos, 90):.3f} max {cos.max():.3f}"
        print(
            f"{label:32s} n {len(cos):4d}  cosine mean {cos.mean():.3f} {spread}  "
            f"credit {credit:.3f}"
        )


def part(text: str, where: str, share: float) -> str:
    """The head, middle or tail of ``text`` holding ``share`` of its characters."""
    n = int(len(text) * share)
    start = {"head": 0, "middle": (len(text) - n) // 2, "tail": len(text) - n}[where]
    return text[start : start + n]


def shares(data: Path, split: str, embedder: Embedder) -> None:
    """The credit of a part of a long evidence message (over 3,000 characters): its head,
    middle and tail at a few shares of its length (about the share, wherever)."""
    evidence = load_taskset(data, split).evidence_texts().values()
    longs = list(dict.fromkeys(t for texts in evidence for t in texts if len(t) > 3000))
    scorer = CoverageScorer(embedder)
    print(f"{len(longs)} evidence messages over 3,000 characters, {split}, {cv.FITNESS_VERSION}")
    for share in (0.1, 0.25, 0.5, 0.75):
        cells = []
        for where in ("head", "middle", "tail"):
            credits = scorer.credits([([t], part(t, where, share)) for t in longs])
            cells.append(f"{where} {_mean([c[0] for c in credits]):.3f}")
        print(f"share {share:4.2f}: " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--traces", type=Path, help="questions.jsonl of a valid-split eval")
    parser.add_argument("--ceiling-splits", nargs="*", default=["valid", "holdout"])
    parser.add_argument("--cache-dir", type=Path, help="embedding cache folder (default: temp)")
    parser.add_argument("--calibrate", action="store_true", help="measure the meaning ramp")
    parser.add_argument("--shares", metavar="SPLIT", help="credit of parts of long evidence")
    args = parser.parse_args()
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="coverage-"))
    embedder = Embedder(cache / "embeddings.sqlite")
    for split in args.ceiling_splits:
        top = ceiling(list(load_taskset(args.data_dir, split).evidence_texts().values()),
                      CoverageScorer(embedder))  # fmt: skip
        print(f"ceiling {split:8s} {top.mean:.3f} (budget {top.budget}, {top.fitness_version})")
    if args.traces:
        compare_traces(args.data_dir, args.traces, embedder)
    if args.traces and args.calibrate:
        calibrate(args.data_dir, args.traces, embedder)
    if args.shares:
        shares(args.data_dir, args.shares, embedder)


if __name__ == "__main__":
    main()
