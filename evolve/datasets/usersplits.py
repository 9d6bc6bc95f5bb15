"""Seeded splits of a user-format dataset, written next to the data as ``DIR/splits.json``.

Owns the split rule (:func:`split_dataset`), its text in ``splits/jsonl.json``
(:func:`render_rule`), :func:`read_splits`, :func:`ensure_splits` (read the folder's splits, or
write them the first time) and :func:`mismatch` (whether a splits file still fits the data).

Rule (seed ``s``, default 0): the conversation ids, sorted, are shuffled with
``random.Random(s)`` and cut in order into ``holdout`` (``max(1, round(0.2 n))``, none with
fewer than 3 conversations), ``guard`` (``round(0.2 n)``, only with 5 or more), ``valid``
(``max(1, round(0.2 n))``) and ``train`` (the rest): 2 conversations give train 1, valid 1; 3
give 1 / 1 / 1. A dataset of one conversation is split by question instead (question ids, sorted,
shuffled the same way): holdout and valid ``max(1, m // 4)`` each (with 3 or more questions),
train the rest (at least half); the file says why under ``"reason"``. Each split lists its ids
in dataset order.

Invariants:
- The file is written once, atomically (:func:`evolve.files.write_atomic`), and read on every
  later load, so a resumed run reads the same split; the same data and seed give the same bytes.
- A splits file that no longer fits the data (an id in no split, a listed id that is gone, an
  id in two splits) is one DataError line telling the user to run ``evolve data split DIR``
  (which calls ``ensure_splits(..., rewrite=True)``); so is a folder it cannot be written to.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from evolve.datasets.types import DataError, read_json
from evolve.datasets.userformat import Dataset
from evolve.files import plain_mode, write_atomic

SPLITS = "splits.json"
FORMAT = "prismem-splits"
VERSION = 1
NAMES: tuple[str, ...] = ("train", "valid", "guard", "holdout")  # what a splits file lists
ROLES: dict[str, str] = {"train": "train", "valid": "valid", "test": "holdout"}  # run role -> split
GUARD_FROM = 5  # conversations needed for a guard split
FRACTION = 0.2  # of the conversations: holdout, guard and valid each
GENERATOR = (
    "evolve.datasets.usersplits.split_dataset: the conversation ids, sorted, shuffled with "
    "random.Random(seed), cut in order into holdout max(1, round(0.2 n)) (none below 3 "
    "conversations), guard round(0.2 n) (only from 5), valid max(1, round(0.2 n)), train the "
    "rest; one conversation: its question ids, sorted, shuffled the same way, holdout and valid "
    "max(1, m // 4) each (from 3 questions), train the rest. Written to DIR/splits.json on first "
    "use and read back on every later load; each split lists its ids in dataset order."
)


def _cut(ids: list[str], sizes: dict[str, int], seed: int, order: list[str]) -> dict[str, list]:
    """``ids`` shuffled with ``seed`` and cut into ``sizes`` (in that order), each part listed
    in ``order``'s order."""
    shuffled = sorted(ids)
    random.Random(seed).shuffle(shuffled)
    parts: dict[str, set[str]] = {}
    start = 0
    for name, size in sizes.items():
        parts[name] = set(shuffled[start : start + size])
        start += size
    return {name: [i for i in order if i in parts[name]] for name in NAMES}


def split_dataset(dataset: Dataset, seed: int = 0) -> dict[str, Any]:
    """The splits of ``dataset`` under the module's rule (what ``splits.json`` holds)."""
    ids = [c.id for c in dataset.conversations]
    head: dict[str, Any] = {"format": FORMAT, "version": VERSION, "seed": seed}
    n = len(ids)
    if n >= 2:
        part = max(1, round(FRACTION * n))
        holdout = part if n >= 3 else 0
        guard = round(FRACTION * n) if n >= GUARD_FROM else 0
        sizes = {"holdout": holdout, "guard": guard, "valid": part}
        sizes["train"] = n - sum(sizes.values())
        return {**head, "by": "conversation", "splits": _cut(ids, sizes, seed, ids)}
    qids = [q.id for q in dataset.questions]
    if not ids or not qids:
        raise DataError("one conversation and no questions: nothing to split (add questions, or "
                        "let `evolve synth` write them)")  # fmt: skip
    m = len(qids)
    part = max(1, m // 4) if m >= 3 else 0
    sizes = {"holdout": part, "guard": 0, "valid": part if m >= 3 else m - 1}
    sizes["train"] = m - sum(sizes.values())
    reason = (f"one conversation ({ids[0]}): split by question (train {sizes['train']}, valid "
              f"{sizes['valid']}, holdout {sizes['holdout']} of {m}); a split by conversation "
              "needs at least 2 conversations")  # fmt: skip
    return {**head, "by": "question", "conversation": ids[0], "reason": reason,
            "splits": _cut(qids, sizes, seed, qids)}  # fmt: skip


def render(splits: dict[str, Any]) -> bytes:
    """The bytes of ``splits.json``."""
    return (json.dumps(splits, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def mismatch(splits: dict[str, Any], dataset: Dataset) -> str | None:
    """Why ``splits`` no longer fits ``dataset`` (one clause); None when it does."""
    convs = [c.id for c in dataset.conversations]
    if splits["by"] == "conversation":
        if len(convs) < 2:
            return f"it splits conversations and the data now holds {len(convs)}"
        what, universe = "conversation", convs
    else:
        if convs != [splits.get("conversation")]:
            return f"it splits the questions of conversation {splits.get('conversation')!r}"
        what, universe = "question", [q.id for q in dataset.questions]
    seen: dict[str, str] = {}
    for name in NAMES:
        for i in splits["splits"][name]:
            if i in seen:
                return f"{what} {i!r} is in both {seen[i]} and {name}"
            seen[i] = name
    if missing := [i for i in universe if i not in seen]:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return f"{what} {missing[0]!r} is in no split{more}"
    known = set(universe)
    if gone := [i for i in seen if i not in known]:
        more = f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""
        return f"{what} {gone[0]!r} is listed but no longer in the data{more}"
    return None


def _read(path: Path) -> dict[str, Any]:
    """A splits file, checked for the fields this module reads."""
    try:
        data = read_json(path)
    except DataError as e:
        raise DataError(f"{e}; run `evolve data split {path.parent}` to split again") from None
    ok = (
        isinstance(data, dict)
        and data.get("format") == FORMAT
        and data.get("version") == VERSION
        and data.get("by") in ("conversation", "question")
        and isinstance(data.get("splits"), dict)
        and all(isinstance(data["splits"].get(n), list) for n in NAMES)
        and all(isinstance(i, str) for n in NAMES for i in data["splits"][n])
    )
    if not ok:
        raise DataError(f"{path}: not a splits file of this PrisMem; run `evolve data split "
                        f"{path.parent}` to split again")  # fmt: skip
    return data


def read_splits(folder: Path, dataset: Dataset | None = None) -> dict[str, Any] | None:
    """``folder``'s ``splits.json``, None when there is none; with ``dataset``, DataError (one
    line) when the file no longer fits it."""
    path = Path(folder) / SPLITS
    if not path.exists():
        return None
    splits = _read(path)
    why = None if dataset is None else mismatch(splits, dataset)
    if why is not None:
        raise DataError(f"{path}: no longer matches the data: {why}; run `evolve data split "
                        f"{folder}` to split again (scores on the old split do not compare "
                        "with the new)")  # fmt: skip
    return splits


def ensure_splits(
    folder: Path, dataset: Dataset, seed: int = 0, *, rewrite: bool = False
) -> tuple[dict[str, Any], bool]:
    """(the splits of ``folder``, whether they were written now): ``splits.json`` as written
    earlier (``seed`` is then not read), else split with ``seed`` and written; ``rewrite``
    splits again even when a file exists. DataError (one line) when the file no longer fits
    ``dataset`` or cannot be written."""
    if not rewrite and (splits := read_splits(folder, dataset)) is not None:
        return splits, False
    splits = split_dataset(dataset, seed)
    try:
        write_atomic(Path(folder) / SPLITS, render(splits), mode=plain_mode())
    except OSError as e:
        raise DataError(f"{folder}: cannot write {SPLITS} ({e.strerror or e}); the data folder "
                        "must be writable (its split is kept there)") from None  # fmt: skip
    return splits, True


def build_rule(seed: int = 0) -> dict[str, Any]:
    """The split rule as written to ``splits/jsonl.json`` (the file a run's manifest hashes)."""
    return {"bench": "jsonl", "seed": seed, "generator": GENERATOR, "file": SPLITS,
            "splits": list(NAMES), "roles": dict(ROLES)}  # fmt: skip


def render_rule(seed: int = 0) -> str:
    """The text of ``splits/jsonl.json``. Regenerate the file with ``python -c "import
    evolve.datasets.usersplits as u; print(u.render_rule(), end='')" > splits/jsonl.json``."""
    return json.dumps(build_rule(seed), indent=2, ensure_ascii=False) + "\n"
