"""Benchmark: stage reuse and retrieval latency (a measurement script, not a test).

Prints, in one run:
1. a full evaluation of a program on a split with empty stage and embedding caches, then a
   retrieval-only revision of it (one retrieval constant changed) on the same caches: wall
   time, stage counters and texts embedded for each, and their ratio;
2. ``retrieve()`` latency (p50 / p95 over every question, several repeats) of the dense seed
   over one BEAM-1M conversation, indexed offline (one unit per message).

    python bench/reuse.py --data-dir ../shared/data [--program seeds/hybrid.py] [--split valid]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from evolve.datasets.beam import load_conversation, load_taskset
from evolve.executor import evaluate
from evolve.models.embed import Embedder
from evolve.program import build_record, load_program
from evolve.worker import WorkerConfig

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
    config = WorkerConfig(cache_dir=str(cache), task_model=None)
    rows = []
    for label, path in (("full", program), ("retrieval-only", child)):
        start = time.perf_counter()
        report = evaluate(path, tasks, config, jobs=jobs)
        wall = time.perf_counter() - start
        rows.append((label, wall, report))
        stages = " ".join(f"{s}={c['computed']}/{c['reused']}" for s, c in report.stages.items())
        emb = report.work["worker_embedding"]
        print(f"{label:>15}: {wall:7.1f} s  stages computed/reused: {stages}")
        print(f"{'':>15}  worker texts embedded {emb.get('encoded', 0):.0f} "
              f"(cache hits {emb.get('cache_hits', 0):.0f}); stage seconds "
              f"{report.work['stage_seconds']}")  # fmt: skip
    full, part = rows[0][1], rows[1][1]
    print(f"retrieval-only re-evaluation takes {part / full:.1%} of the full one "
          f"({full / part:.1f}x faster); {len(tasks.questions)} questions, {split}")  # fmt: skip
    shutil.rmtree(cache, ignore_errors=True)


class LocalBackend:
    """The dense seed's backend for the in-process latency run (a trusted seed, so no host)."""

    def __init__(self, embedder: Embedder) -> None:
        self.dim, self.max_complete_calls, self._embedder = embedder.dim, 0, embedder

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embedder.embed(list(texts))

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        raise RuntimeError("no LLM in this benchmark")


def latency(data_dir: Path, conv: str, repeats: int, cache_dir: Path) -> None:
    conversation, questions = load_conversation(data_dir, "1M", conv)
    program = load_program((ROOT / "seeds" / "dense.py").read_text(), "seeds/dense.py")
    embedder = Embedder(cache_path=cache_dir / "embeddings.sqlite")
    backend = LocalBackend(embedder)
    memory = program.module.Memory(backend)
    ns = vars(program.module)
    start = time.perf_counter()
    n_units = 0
    for segment in conversation.sessions:
        units = [
            build_record(program.memory_unit, f"{m.role}: {m.content}", ns, date=segment.date)
            for m in segment.messages
        ]
        n_units += len(units)
        memory.index(units, segment)
    index_s = time.perf_counter() - start
    memory.retrieve(program.module.Query(text="warm-up"))
    backend.embed([q.question for q in questions])  # so that only round 0 misses the cache
    cold: list[float] = []  # first round: the query is embedded (an embedding cache miss)
    warm: list[float] = []  # later rounds: query embeddings are cached, retrieval itself
    nonce = uuid.uuid4().hex[:8]
    for round_ in range(repeats):
        for q in questions:
            t0 = time.perf_counter()
            text = q.question if round_ else f"{q.question} ({nonce})"  # a nonce forces a miss
            memory.retrieve(program.module.Query(text=text))
            (warm if round_ else cold).append((time.perf_counter() - t0) * 1000)
    print(f"BEAM-1M conversation {conv}: {n_units} units, {conversation.n_chars:,} chars, "
          f"indexed in {index_s:.1f} s (embedding cache at {cache_dir})")  # fmt: skip
    for label, times in (("with query embedding", cold), ("query embedding cached", warm)):
        p50, p95 = statistics.median(times), float(np.percentile(times, 95))
        print(f"dense retrieve(), {label}: p50 {p50:.1f} ms, p95 {p95:.1f} ms ({len(times)} calls)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("EVOLVE_DATA", "")))
    parser.add_argument("--program", type=Path, default=ROOT / "seeds" / "hybrid.py")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--conv", default="3", help="BEAM-1M conversation for the latency run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "prismem")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    reuse(args.program, args.data_dir, args.split, args.jobs)
    latency(args.data_dir, args.conv, args.repeats, args.cache_dir)


if __name__ == "__main__":
    main()
