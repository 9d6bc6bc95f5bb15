"""The README's main command, run once per search seed, for the measurement scripts.

Owns :func:`evolve` (run the ``evolve`` console script of this environment, stop with its last
error line) and :func:`one_run` (``evolve run --bench beam`` with ``--search-seed S`` into a
runs folder of its own, its one run read back from that folder, its best program exported).
``bench/seeds.py`` and ``bench/transfer.py`` both run the default run this way and differ only
in where they score the bests.

Invariant: every run gets a runs folder of its own (``WORK/runs-SEED``), so the run read back
is the one started, never a guess by modification time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from evolve.evolution.store import RunStore

EVOLVE = Path(sys.executable).with_name("evolve")  # the console script of this environment


def evolve(*args: str) -> str:
    """Run ``evolve`` with ``args``; its stdout, or exit with its last error line."""
    done = subprocess.run([str(EVOLVE), *args], capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        raise SystemExit(f"evolve {args[0]} failed ({done.returncode}): {lines[-1]}")
    return done.stdout


def one_run(seed: int, common: list[str], work: Path, extra: list[str]) -> dict[str, Any]:
    """The run with search seed ``seed`` (in ``work/runs-SEED``): its wall time, best candidate
    and exported file, and the file of the program it started from."""
    runs = work / f"runs-{seed}"
    start = time.perf_counter()
    evolve("run", "--bench", "beam", *common, "--runs-dir", str(runs), "--search-seed",
           str(seed), "--no-progress", *extra)  # fmt: skip
    return {**read_back(seed, work), "wall": time.perf_counter() - start}


def read_back(seed: int, work: Path) -> dict[str, Any]:
    """The one run in ``work/runs-SEED``: its best candidate, exported to ``work/best-SEED.py``,
    and the file of the program it started from (no wall time: the run is not timed here)."""
    runs = work / f"runs-{seed}"
    (run_id,) = [p.name for p in runs.iterdir() if p.is_dir()]
    store = RunStore.open(runs, run_id)
    best = store.get(store.load_state()["best"])
    out = work / f"best-{seed}.py"
    if not out.exists():  # exported when the run was first read back
        evolve("export", f"{run_id}/{best.id}", "--runs-dir", str(runs), "--out", str(out))
    valid = best.scores["valid"].overall.fitness
    return {"seed": seed, "wall": None, "best": best.id, "valid": valid, "message": best.message,
            "path": out, "start": store.source_path(store.candidates()[0].id)}  # fmt: skip
