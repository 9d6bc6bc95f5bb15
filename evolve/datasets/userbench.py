"""The ``jsonl`` bench's loader: a user-format folder (``--data-dir DIR``) as task sets.

Owns :data:`LOADER`, the :class:`~evolve.benches.registry.Loader` of the ``jsonl`` entry:
split names, the default split, the split rule's shipped file, :meth:`UserLoader.load_taskset`,
:meth:`UserLoader.split_files` and :meth:`UserLoader.run_split`.

Invariants:
- ``all`` is every conversation and question and needs no split; a named split (``train``,
  ``valid``, ``guard``, ``holdout``) reads ``DIR/splits.json``, writing it on first use
  (:func:`evolve.datasets.usersplits.ensure_splits`), so every later load (a resumed run)
  reads the same split. A run's roles read train, valid and holdout (for test).
- A folder that does not validate writes nothing: it is read (and rejected) before any split
  is written. A split that holds no question is one DataError line.
- A folder split by question says why once per process, one ``note:`` line on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

from evolve.datasets.types import DataError, TaskSet
from evolve.datasets.userformat import (
    CONVERSATIONS,
    MANIFEST,
    QUESTIONS,
    read_dataset,
    to_taskset,
)
from evolve.datasets.usersplits import NAMES, ROLES, SPLITS, ensure_splits
from evolve.resources import split_file

_told: set[str] = set()  # folders whose split-by-question reason was said


class UserLoader:
    """The ``jsonl`` bench's loader (see the module docstring)."""

    SPLIT_NAMES: tuple[str, ...] = (*NAMES, "all")
    DEFAULT_SPLIT = "all"
    DEFAULT_SPLITS_FILE = split_file("jsonl.json")

    def load_taskset(self, data_dir: Path, split: str) -> TaskSet:
        if split not in self.SPLIT_NAMES:
            raise DataError(f"unknown split {split!r} of a user-format folder (expected one of "
                            f"{', '.join(self.SPLIT_NAMES)})")  # fmt: skip
        folder = Path(data_dir)
        dataset = read_dataset(folder)
        if not dataset.questions:
            raise DataError(f"{folder}: no questions ({QUESTIONS} is missing or empty): add "
                            f"some, or let `evolve synth {folder}` write them")  # fmt: skip
        if split == "all":
            return to_taskset(dataset, split)
        splits, _ = ensure_splits(folder, dataset)
        key = str(folder.resolve())
        if splits.get("reason") and key not in _told:
            _told.add(key)
            print(f"note: {folder}: {splits['reason']}", file=sys.stderr)
        ids = set(splits["splits"][split])
        if splits["by"] == "conversation":
            tasks = to_taskset(dataset, split, conversations=ids)
        else:
            tasks = to_taskset(dataset, split, questions=ids)
        if not tasks.questions:
            n = len(dataset.conversations)
            why = (
                f"a guard split needs at least 5 conversations; {folder} holds {n}"
                if split == "guard" and n < 5
                else f"{len(ids)} {splits['by']}s, no question"
            )
            raise DataError(f"{folder}: split {split!r} holds no questions ({why})")
        return tasks

    def split_files(self, data_dir: Path, split: str, conversations: int | None) -> list[Path]:
        """The data files (every split reads them whole) and, for a named split, the splits
        file (written now when it does not exist yet)."""
        folder = Path(data_dir)
        files = [folder / MANIFEST, folder / CONVERSATIONS]
        if (folder / QUESTIONS).is_file():
            files.append(folder / QUESTIONS)
        if split != "all":
            if not (folder / SPLITS).is_file():
                ensure_splits(folder, read_dataset(folder))
            files.append(folder / SPLITS)
        return files

    def run_split(self, data_dir: Path, role: str) -> str:
        return ROLES.get(role, role)


LOADER = UserLoader()
