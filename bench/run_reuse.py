"""Benchmark: a whole ``evolve run`` with step reuse against the same run with ``--no-reuse``.

A measurement script, not a test. It runs ``evolve run`` twice with the same arguments (those
after ``--``), the second time with ``--no-reuse``, each in a new empty cache directory (step
store and LLM response cache) and runs directory. The embedding cache is keyed by text, not by
stage, so it stays on in both runs; with ``--embeddings FILE`` both start from a copy of it.
For each run it prints the wall time, the calls and tokens per role from the run's call log,
the step counters summed over every evaluation, and the sandbox and evaluation seconds per
candidate; then the ratios of the reuse run to the baseline.

    # offline (no model): wall time only, no tokens
    python bench/run_reuse.py --data-dir ../shared/data -- --conversations 2 --rounds 1,3,0
    # a task model served locally, on a slice of BEAM (tokens and wall time)
    python bench/run_reuse.py --data-dir ../shared/data --slice -- --model openai/smollm2 \\
        --api-base http://127.0.0.1:8080/v1 --coder none --task-max-tokens 128 --rounds 1,3,0

``--slice`` runs on :func:`evolve.datasets.slices.write_slice` of the data (every train and
valid conversation cut to a few messages and two questions), so a CPU-served model finishes.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evolve.datasets.slices import write_slice
from evolve.environment import folder
from evolve.evolution.report import report_data
from evolve.evolution.store import RunStore

EVOLVE = Path(sys.executable).with_name("evolve")  # the console script of this environment


def run_once(label: str, data: Path, work: Path, extra: list[str], embeddings: Path | None,
             no_reuse: bool) -> dict[str, Any]:  # fmt: skip
    cache, runs = work / label / "cache", work / label / "runs"
    cache.mkdir(parents=True)
    if embeddings is not None:
        shutil.copyfile(embeddings, cache / "embeddings.sqlite")
    command = [str(EVOLVE), "run", "--bench", "beam", "--data-dir", str(data),
               "--cache-dir", str(cache), "--runs-dir", str(runs), "--no-progress", *extra,
               *(["--no-reuse"] if no_reuse else [])]  # fmt: skip
    print(f"{label}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{label}: evolve run failed ({done.returncode}): {done.stderr.strip()}")
    (run_id,) = [p.name for p in runs.iterdir() if p.is_dir()]
    store = RunStore.open(runs, run_id)
    report = report_data(store)
    candidates = [c for c in store.candidates() if c.status == "evaluated"]
    sandbox = [sum(t["seconds"] for t in (c.sandbox or {}).get("tiers", [])) for c in candidates]
    children = [c.seconds for c in candidates if c.stage != "seed"]
    return {
        "label": label,
        "wall": wall,
        "spend": report["spend"],
        "cache": report["cache"],
        "evaluated": len(candidates),
        "candidates": len(report["matrix"]),
        "sandbox_s": statistics.mean(sandbox) if sandbox else 0.0,
        "seed_s": sum(c.seconds for c in candidates if c.stage == "seed"),
        "child_s": statistics.mean(children) if children else 0.0,
        "best": report["best"],
    }


def show(row: dict[str, Any]) -> None:
    spend = row["spend"]
    print(f"  {row['label']}: wall {row['wall']:.1f} s; {row['candidates']} candidates "
          f"({row['evaluated']} evaluated); best {row['best']}")  # fmt: skip
    for role, tally in spend["by_role"].items():
        print(f"    {role}: {tally['calls']} calls ({tally['cached_calls']} from the response "
              f"cache), {tally['prompt_tokens']:,} prompt + {tally['completion_tokens']:,} "
              f"completion tokens")  # fmt: skip
    stages = ", ".join(f"{s} {c['computed']}/{c['reused']}" for s, c in row["cache"].items())
    print(f"    steps computed/reused over all evaluations: {stages}")
    print(f"    train+valid evaluation: seed {row['seed_s']:.1f} s, each evaluated child "
          f"{row['child_s']:.1f} s on average; sandbox {row['sandbox_s']:.1f} s per "
          f"candidate")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--slice", action="store_true", help="run on a small slice of BEAM")
    parser.add_argument("--embeddings", type=Path, default=None,
                        help="an embedding cache both runs start from (a copy)")  # fmt: skip
    parser.add_argument("extra", nargs="*", help="arguments for evolve run (after --)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="prismem-run-reuse-") as tmp:
        work = Path(tmp)
        data = write_slice(args.data_dir, work / "data") if args.slice else args.data_dir
        rows = [run_once(label, data, work, args.extra, args.embeddings, label == "no-reuse")
                for label in ("reuse", "no-reuse")]  # fmt: skip
    for row in rows:
        show(row)
    reuse, base = rows
    print(f"wall time with reuse: {reuse['wall'] / base['wall']:.2f}x the baseline's "
          f"({base['wall'] / reuse['wall']:.1f}x faster)")  # fmt: skip
    tokens, base_tokens = reuse["spend"]["total"]["tokens"], base["spend"]["total"]["tokens"]
    if base_tokens:
        print(f"tokens with reuse: {tokens:,} vs {base_tokens:,} = {tokens / base_tokens:.2f}x")
    else:
        print("tokens: none in either run (offline: no model configured)")
    if reuse["child_s"] and base["child_s"]:
        print(f"a child's evaluation with reuse: {reuse['child_s'] / base['child_s']:.2f}x "
              f"the baseline's ({base['child_s'] / reuse['child_s']:.1f}x faster)")  # fmt: skip
        print(f"sandbox time per candidate: {reuse['sandbox_s']:.1f} s = "
              f"{reuse['sandbox_s'] / reuse['child_s']:.0%} of a child's evaluation with reuse, "
              f"{base['sandbox_s'] / base['child_s']:.0%} without")  # fmt: skip


if __name__ == "__main__":
    main()
