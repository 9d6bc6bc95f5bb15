"""Guard sets: data a run never diagnoses, targets or tunes on, which its bests must not lose.

Owns the guard spec's syntax (:class:`Guard`, :func:`parse_guard`), the rule of which data
root a guard reads (:func:`guard_root`) and :func:`load_guard`, which reads a guard's task set
and refuses one that shares a conversation with the run's own splits. A run's default guards
are its bench's (``Bench.guards``, :mod:`evolve.benches.registry`); the non-inferiority rule
that reads guard scores is :mod:`evolve.evolution.archive`'s.

Spec: ``BENCH:SPLIT`` or ``BENCH:SPLIT@N``. ``SPLIT`` is any split the bench's loader reads
(``evolve eval --split``; it may itself hold a colon, as in ``beam:all:500K``); ``@N`` keeps
only its first N conversations (:meth:`~evolve.datasets.types.TaskSet.first`, the rule of
``--conversations``). :attr:`Guard.name` is the canonical spelling, and the key its scores are
filed under on a candidate is :attr:`Guard.key` (``guard:<name>``).

Data roots: a guard of the run's own bench reads the run's data dir (a user-format bench's
folder holds its own guard split); a guard of another bench reads the guard data root
(``evolve run --guard-data-dir``; by default the run's data dir, a data root holding every
bench, but ``$PRISMEM_DATA`` for a bench whose data dir is a folder of its own, as a user's
data is: ``Bench.own_folder``).

Invariants: parsing needs no data (a config validates its guards offline); loading checks that
the split exists, has questions, and shares no conversation with the run's train or valid, so
a guard's questions can never reach diagnosis, failing cases or a proposer through them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from evolve.benches.registry import bench, names
from evolve.datasets.types import DataError, TaskSet

KEY_PREFIX = "guard:"  # a candidate's scores key of a guard: KEY_PREFIX + Guard.name
_SPEC = re.compile(r"^(?P<bench>[a-z0-9_]+):(?P<split>[A-Za-z0-9_:.-]+?)(?:@(?P<n>[0-9]+))?$")


@dataclass(frozen=True)
class Guard:
    """One guard set: a bench's split, only its first ``conversations`` (None: all)."""

    bench: str
    split: str
    conversations: int | None = None

    @property
    def name(self) -> str:
        tail = "" if self.conversations is None else f"@{self.conversations}"
        return f"{self.bench}:{self.split}{tail}"

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.name


def parse_guard(text: str) -> Guard:
    """A guard spec as :class:`Guard`; ValueError with one line when it is not one."""
    match = _SPEC.match(text.strip())
    if match is None:
        raise ValueError(f"guard {text!r} is not BENCH:SPLIT or BENCH:SPLIT@N "
                         "(e.g. locomo:all@1, beam:guard@1)")  # fmt: skip
    name, split, n = match["bench"], match["split"], match["n"]
    if name not in names():
        raise ValueError(f"guard {text!r}: unknown bench {name!r} (one of {', '.join(names())})")
    if n is not None and int(n) < 1:
        raise ValueError(f"guard {text!r}: @N needs at least 1 conversation")
    return Guard(name, split, None if n is None else int(n))


def guard_root(guard: Guard, bench_name: str, data_dir: Path, guard_data_dir: Path | None) -> Path:
    """The data root ``guard`` reads in a run of bench ``bench_name`` whose data dir is
    ``data_dir``: that dir for a guard of the same bench, else ``guard_data_dir`` (None: the
    run's data dir)."""
    if guard.bench == bench_name or guard_data_dir is None:
        return data_dir
    return guard_data_dir


def load_guard(guard: Guard, data_dir: Path, run_splits: list[TaskSet]) -> TaskSet:
    """The guard's task set, read from ``data_dir``. DataError (one line) when the split does not
    load, holds no question, or shares a conversation with one of ``run_splits`` (the run's
    train and valid)."""
    try:
        tasks = bench(guard.bench).load_taskset(data_dir, guard.split).first(guard.conversations)
    except DataError as exc:
        raise DataError(f"guard {guard.name}: {exc}") from None
    if not tasks.questions:
        raise DataError(f"guard {guard.name}: no questions to evaluate")
    mine = {c.id for c in tasks.conversations}
    for split in run_splits:
        shared = sorted(mine & {c.id for c in split.conversations})
        if shared:
            raise DataError(
                f"guard {guard.name} shares {', '.join(shared)} with the run's "
                f"{split.split} split: a guard must be data the run never sees"
            )
    return tasks
