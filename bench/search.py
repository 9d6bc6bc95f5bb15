"""Benchmark: optuna (TPE) vs random constant search for the same budget.

A measurement script, not a test. For each strategy (``--offline-search`` optuna and random)
it runs the evolution loop offline from ``seeds/hybrid.py`` on BEAM-100K with the same budget of
evaluated candidates (``--budget``, seed included; ``--children`` per round, rounds split
1 : 6 : 1 over cold start, refinement and integration), then evaluates the run's best program
(the archive's, selected on valid) on valid and holdout and prints its evidence coverage
(:mod:`evolve.scoring.coverage`) beside the seed's and the ceiling (the gold evidence packed
into the budget), the candidates evaluated (in full, or stopped by the cascade on its
minibatch), the evaluation seconds and the seconds the cascade saved
(:func:`evolve.evolution.cascade.saved_seconds`; ``n/a`` when no candidate went through the
cascade). Both runs share one cache directory, so the seed and any program both reach are
evaluated once.

    python bench/search.py --data-dir ../shared/data --budget 40 --cache-dir /tmp/search-cache
    # a tiny version (a minute): one conversation per split, hashing embedder
    python bench/search.py --data-dir ../shared/data --budget 4 --conversations 1 \\
        --embedder hashing
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from evolve.config import CHILDREN, RunConfig
from evolve.datasets.beam import load_taskset
from evolve.datasets.types import TaskSet
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import make_embedder
from evolve.evolution.cascade import saved_seconds
from evolve.evolution.loop import Evolution
from evolve.evolution.manifest import build_manifest
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.wiring import eval_setup
from evolve.resources import seed_file
from evolve.scoring.coverage import CoverageScorer, ceiling

SPLITS = ("valid", "holdout")


def rounds(budget: int, children: int) -> dict[str, int]:
    """Rounds for ``budget`` evaluated candidates (the seed is one), ``children`` per round,
    split 1 : 6 : 1."""
    total = max(-(-(budget - 1) // children), 1)
    edge = total // 8
    return {"cold_start": max(edge, 1), "refinement": total - max(edge, 1) - edge,
            "integration": edge}  # fmt: skip


def coverage(program: Path, tasks: TaskSet, config: RunConfig, scorer: CoverageScorer) -> float:
    """Mean evidence coverage of ``program`` on ``tasks`` (questions with evidence)."""
    setup = eval_setup(config, Path(config.cache_dir), "bench")
    report = run_eval(program, tasks, setup, jobs=config.jobs)
    ev = tasks.evidence_texts()
    rows = scorer.coverage([(ev[t.id], t.retrieved_text) for t in report.traces])
    values = [r["evidence_coverage"] for r in rows if r["evidence_coverage"] is not None]
    return sum(values) / len(values) if values else float("nan")


def cascade_saved(candidates: list[CandidateMeta]) -> float | None:
    """Seconds the cascade saved in a run (None when no candidate went through it)."""
    return saved_seconds(candidates) if any(c.cascade for c in candidates) else None


def search(config: RunConfig, runs: Path, strategy: str) -> dict[str, Any]:
    """One run with ``strategy``: its best program, evaluated count and seconds."""
    config = config.replace(offline_search=strategy)
    store = RunStore.create(runs, build_manifest(config), run_id=strategy)  # as `evolve run`
    began = time.perf_counter()
    best = Evolution(store, config).run()
    wall = time.perf_counter() - began
    candidates = store.candidates()
    evaluated = [c for c in candidates if c.status in ("evaluated", "stopped")]
    return {"strategy": strategy, "best": best, "path": store.source_path(best.id),
            "evaluated": len(evaluated), "seconds": sum(c.seconds for c in evaluated),
            "wall": wall, "saved": cascade_saved(candidates)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--budget", type=int, default=40, help="evaluated candidates per run")
    parser.add_argument("--conversations", type=int, default=None, help="first N per split")
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--cache-dir", type=Path, help="stage and embedding cache (default: temp)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--children", type=int, default=CHILDREN, help="children per round")
    parser.add_argument("--no-cascade", action="store_true", help="evaluate every child in full")
    parser.add_argument("--strategies", nargs="+", default=["optuna", "random"],
                        choices=["optuna", "random"])  # fmt: skip
    args = parser.parse_args()
    if args.budget < 2:
        parser.error("--budget must be at least 2 (the seed and one child)")
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="search-cache-"))
    runs = Path(tempfile.mkdtemp(prefix="search-runs-"))
    seed = str(seed_file("hybrid.py"))
    config = RunConfig(data_dir=str(args.data_dir.resolve()), seed_program=seed,
                       cache_dir=str(cache.resolve()), jobs=args.jobs, embedder=args.embedder,
                       rounds=rounds(args.budget, args.children), children=args.children,
                       cascade=not args.no_cascade, conversations=args.conversations)  # fmt: skip
    scorer = CoverageScorer(make_embedder(args.embedder, str(cache)))
    tasks = {s: load_taskset(args.data_dir, s).first(args.conversations) for s in SPLITS}
    tops = {s: ceiling(list(tasks[s].evidence_texts().values()), scorer).mean for s in SPLITS}
    start = {s: coverage(Path(seed), tasks[s], config, scorer) for s in SPLITS}
    print(f"budget {args.budget} evaluated candidates, rounds {config.rounds}, children "
          f"{config.children}, cascade {config.cascade}, embedder {args.embedder}, "
          f"conversations {args.conversations or 'all'}")  # fmt: skip
    print(f"{'':8s} {'valid':>16s} {'holdout':>16s}  evaluated  eval s  wall s  cascade saved s")
    line = "  ".join(f"{start[s]:.3f} of {tops[s]:.3f}" for s in SPLITS)
    print(f"{'seed':8s} {line}")
    for strategy in args.strategies:
        got = search(config, runs, strategy)
        cov = {s: coverage(got["path"], tasks[s], config, scorer) for s in SPLITS}
        saved = "n/a" if got["saved"] is None else f"{got['saved']:.0f}"
        line = "  ".join(f"{cov[s]:.3f} of {tops[s]:.3f}" for s in SPLITS)
        print(
            f"{strategy:8s} {line}  {got['evaluated']:9d}  {got['seconds']:6.0f}  "
            f"{got['wall']:6.0f}  {saved}   best {got['best'].id}: {got['best'].message}"
        )


if __name__ == "__main__":
    main()
