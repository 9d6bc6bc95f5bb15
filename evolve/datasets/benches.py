"""The benchmark registry: one loader module per benchmark, one call to load any of them.

Owns :data:`BENCHES` and :func:`load_taskset`. Each loader module (``evolve.datasets.beam``,
``.locomo``, ``.longmemeval``) exposes ``SPLIT_NAMES`` and ``load_taskset(data_dir, split) ->
TaskSet`` and converts its files into the types of :mod:`evolve.datasets.types`; nothing
downstream knows which benchmark a task set came from, except through ``TaskSet.bench``.

Invariant: a loader module is imported only when its benchmark is asked for.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from evolve.datasets.types import DataError, TaskSet

BENCHES = {
    "beam": "evolve.datasets.beam",
    "locomo": "evolve.datasets.locomo",
    "longmemeval": "evolve.datasets.longmemeval",
}


def load_taskset(bench: str, data_dir: Path, split: str) -> TaskSet:
    """A split of ``bench`` read from ``data_dir`` (DataError with one line on bad input)."""
    if bench not in BENCHES:
        raise DataError(f"unknown benchmark {bench!r} (expected one of {', '.join(BENCHES)})")
    module = importlib.import_module(BENCHES[bench])
    tasks: TaskSet = module.load_taskset(Path(data_dir), split)
    return tasks
