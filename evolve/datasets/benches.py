"""The benchmark registry: one loader module per benchmark, one call to load any of them.

Owns :data:`BENCHES`, :func:`load_taskset`, :func:`default_split` and what ``evolve run``
asks of a benchmark: :func:`run_split`, :func:`split_files`, :func:`splits_file`. Each loader
module (``evolve.datasets.beam``, ``.locomo``, ``.longmemeval``) exposes ``SPLIT_NAMES``,
``DEFAULT_SPLIT``, ``DEFAULT_SPLITS_FILE``, ``load_taskset(data_dir, split) -> TaskSet`` and
``split_files(data_dir, split, conversations) -> list[Path]``, optionally
``run_split(data_dir, role) -> str``, and converts its files into the types of
:mod:`evolve.datasets.types`; nothing downstream knows which benchmark a task set came from,
except through ``TaskSet.bench``.

Invariants: a loader module is imported only when its benchmark is asked for. A run's roles
(``train``, ``valid``, ``test``) read the split of the same name unless the loader's
``run_split`` names another (LoCoMo on its one-conversation sample file).
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


def run_split(bench: str, data_dir: Path, role: str) -> str:
    """The split of ``bench`` that a run's ``role`` (train, valid, test) reads from ``data_dir``."""
    choose = getattr(_loader(bench), "run_split", None)
    return role if choose is None else str(choose(Path(data_dir), role))


def split_files(bench: str, data_dir: Path, split: str, conversations: int | None) -> list[Path]:
    """The data files a split (only its first ``conversations`` conversations) is read from."""
    files: list[Path] = _loader(bench).split_files(Path(data_dir), split, conversations)
    return files


def splits_file(bench: str) -> Path:
    """The shipped splits file of ``bench``."""
    return Path(_loader(bench).DEFAULT_SPLITS_FILE)
