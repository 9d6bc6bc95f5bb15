"""The data files the package ships: seed programs and split files.

Owns :func:`seed_file` and :func:`split_file`, the one way code finds them. The repository keeps
them at its top level (``seeds/``, ``splits/``); ``pyproject.toml`` maps those folders to
``evolve.seeds`` and ``evolve.splits`` (``package-dir``), so a wheel, ``pip install .`` and the
editable install all carry them, and :mod:`importlib.resources` finds them wherever the package
is installed.

Invariants: seeds are candidate programs, read as text and checked in the sandbox like any
other; nothing imports them (only the docstring-only ``__init__.py`` of each folder is imported,
which the editable install needs to find a folder mapped into a package). The paths returned
are real files on disk (the package is never run from a zip).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

SEEDS = "evolve.seeds"
SPLITS = "evolve.splits"


def _file(package: str, name: str) -> Path:
    """``name`` inside the shipped folder ``package`` (it may not exist; callers check)."""
    return Path(str(files(package).joinpath(name)))


def seed_file(name: str) -> Path:
    """A shipped seed program, e.g. ``seed_file("hybrid.py")``."""
    return _file(SEEDS, name)


def split_file(name: str) -> Path:
    """A shipped split file, e.g. ``split_file("beam.json")``."""
    return _file(SPLITS, name)
