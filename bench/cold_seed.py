"""Benchmark: where a cold seed evaluation's time goes (a measurement script, not a test).

Evaluates a program the way ``evolve run`` evaluates its seed (offline, train then valid, the
first N conversations of each, 2 workers) from empty stage and embedding caches, and prints per
split the wall time, the workers' seconds per step (extraction, indexing, planning — which
includes starting the program host —, retrieval), the texts the workers encoded and how long
that took, and the parent's scoring encode (evidence similarity embeds the evidence messages
and every retrieved block).

    python bench/cold_seed.py --data-dir ../shared/data [--conversations 1] [--program P]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from evolve.config import RunConfig
from evolve.environment import folder
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup, make_embedder
from evolve.evolution.wiring import task_set

ROOT = Path(__file__).resolve().parents[1]


def cold_seed(program: Path, data_dir: Path, conversations: int, jobs: int) -> None:
    cache = Path(tempfile.mkdtemp(prefix="prismem-cold-"))
    run = RunConfig(data_dir=str(data_dir), seed_program=str(program), cache_dir=str(cache),
                    conversations=conversations)  # fmt: skip
    setup = EvalSetup(cache_dir=str(cache), task_model=None)
    parent = make_embedder("minilm", str(cache))  # the executor's scorer shares this one
    total = 0.0
    for split in ("train", "valid"):
        tasks = task_set(run, split)
        parent.stats.reset()
        start = time.perf_counter()
        report = run_eval(program, tasks, setup, jobs=jobs)
        wall = time.perf_counter() - start
        total += wall
        emb = report.work["worker_embedding"]
        stages = ", ".join(f"{k} {v:.1f}" for k, v in report.work["stage_seconds"].items() if v)
        print(f"{split}: {len(tasks.conversations)} conversations, {len(tasks.questions)} "
              f"questions, {wall:.1f} s wall")  # fmt: skip
        print(f"  worker seconds per step (summed over workers): {stages}")
        print(f"  worker encode: {emb.get('encoded', 0):.0f} texts in "
              f"{emb.get('encode_seconds', 0):.1f} s")  # fmt: skip
        print(f"  parent scoring encode: {parent.stats.encoded} texts in "
              f"{parent.stats.encode_seconds:.1f} s")  # fmt: skip
    print(f"seed evaluation (train + valid): {total:.1f} s")
    shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--program", type=Path, default=ROOT / "seeds" / "hybrid.py")
    parser.add_argument("--conversations", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")  # fmt: skip
    cold_seed(args.program.resolve(), args.data_dir.resolve(), args.conversations, args.jobs)


if __name__ == "__main__":
    main()
