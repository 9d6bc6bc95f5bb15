"""Benchmark: step reuse (a measurement script, not a test; latency is ``bench/scale.py``'s).

Prints a full evaluation of a program on a split with empty stage and embedding caches, then a
retrieval-only revision of it (one retrieval constant changed) on the same caches: wall time,
step counters and texts embedded for each, and their ratio.

    python bench/reuse.py --data-dir ../shared/data [--program seeds/hybrid.py] [--split valid]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import tempfile
import time
from pathlib import Path

from evolve.datasets.beam import load_taskset
from evolve.environment import folder
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup

ROOT = Path(__file__).resolve().parents[1]


def retrieval_variant(source: str) -> str:
    """The same program with TOP_K changed: a change to retrieval only."""
    new, n = re.subn(r"^TOP_K = (\d+)", lambda m: f"TOP_K = {int(m[1]) + 1}", source, flags=re.M)
    if n != 1:
        raise SystemExit("the program needs a module-level TOP_K constant for this benchmark")
    return new


def reuse(program: Path, data_dir: Path, split: str, jobs: int) -> None:
    tasks = load_taskset(data_dir, split)
    cache = Path(tempfile.mkdtemp(prefix="prismem-bench-"))
    child = cache / "child.py"
    child.write_text(retrieval_variant(program.read_text()))
    setup = EvalSetup(cache_dir=str(cache), task_model=None)
    rows = []
    for label, path in (("full", program), ("retrieval-only", child)):
        start = time.perf_counter()
        report = run_eval(path, tasks, setup, jobs=jobs)
        wall = time.perf_counter() - start
        rows.append((label, wall, report))
        steps = " ".join(f"{s}={c['computed']}/{c['reused']}" for s, c in report.steps.items())
        emb = report.work["worker_embedding"]
        print(f"{label:>15}: {wall:7.1f} s  steps computed/reused: {steps}")
        print(f"{'':>15}  worker texts embedded {emb.get('encoded', 0):.0f} "
              f"(cache hits {emb.get('cache_hits', 0):.0f}); step seconds "
              f"{report.work['stage_seconds']}")  # fmt: skip
    full, part = rows[0][1], rows[1][1]
    print(f"retrieval-only re-evaluation takes {part / full:.1%} of the full one "
          f"({full / part:.1f}x faster); {len(tasks.questions)} questions, {split}")  # fmt: skip
    shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--program", type=Path, default=ROOT / "seeds" / "hybrid.py")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    reuse(args.program, args.data_dir, args.split, args.jobs)


if __name__ == "__main__":
    main()
