"""The benchmark registry: one loader module per benchmark, one call to load any of them.

Owns :data:`BENCHES`, :func:`load_taskset` and :func:`default_split`. Each loader module
(``evolve.datasets.beam``, ``.locomo``, ``.longmemeval``) exposes ``SPLIT_NAMES``,
``DEFAULT_SPLIT`` and ``load_taskset(data_dir, split) -> TaskSet``, and converts its files
into the types of :mod:`evolve.datasets.types`; nothing downstream knows which benchmark a task
set came from, except through ``TaskSet.bench``.

Invariant: a loader module is imported only when its benchmark is asked for.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from evolve.datasets.types import DataError, TaskSet

BENCHES = {
    "beam": "evolve.datasets.beam",
    "locomo": "evolve.datasets.locomo",
    "longmemeval": "evolve.datasets.longmemeval",
}


def _loader(bench: str) -> ModuleType:
    if bench not in BENCHES:
        raise DataError(f"unknown benchmark {bench!r} (expected one of {', '.join(BENCHES)})")
    return importlib.import_module(BENCHES[bench])


def default_split(bench: str) -> str:
    """The split ``evolve eval`` scores when none is named."""
    return str(_loader(bench).DEFAULT_SPLIT)


def load_taskset(bench: str, data_dir: Path, split: str | None = None) -> TaskSet:
    """A split of ``bench`` (default: :func:`default_split`) read from ``data_dir``
    (DataError with one line on bad input)."""
    tasks: TaskSet = _loader(bench).load_taskset(Path(data_dir), split or default_split(bench))
    return tasks
