"""The benchmark registry: one :class:`Bench` entry per benchmark, found by its name.

Owns the :class:`Loader` protocol (what a benchmark's data module offers), the :class:`Bench`
record (its loader, answer scorer, fitness metrics, default guards, default run size and fetch
source), :data:`ENTRIES` and the lookups :func:`bench`, :func:`names` and :func:`fetchable`.
Every place that depends on which benchmark it runs on reads the entry here: the task sets a
command or a run reads, the answer scorer and fitness of an evaluation, a run's default
conversations and guards, ``--bench``'s choices and those of ``evolve data fetch``.

Adding a benchmark is one module and one line here, its entry in :data:`ENTRIES`. The module
reads the benchmark's files into the types of :mod:`evolve.datasets.types` and satisfies
:class:`Loader` (as :mod:`evolve.datasets.beam`, ``.locomo`` and ``.longmemeval`` do); the
entry names the bench, that loader, an answer scorer (a shipped one of :mod:`evolve.scoring` or
the module's own, an :class:`~evolve.scoring.answers.AnswerScorer`) and the metrics its fitness
reads (:class:`~evolve.scoring.fitness.BenchMetrics`). Nothing else changes: ``evolve eval``,
``compare`` and ``run`` offer it under ``--bench`` and guard specs may name it
(``tests/test_registry.py`` registers a bench of its own and evaluates a program on it).

Invariants: names are unique and are the ``TaskSet.bench`` of what the loader reads; a
loader's ``run_split`` names the split a run's role (train, valid, test) reads, the split of
that name unless the data calls for another (LoCoMo on its one-conversation sample file).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from evolve.datasets import beam, locomo, longmemeval
from evolve.datasets.fetch import fetch_beam
from evolve.datasets.types import DataError, TaskSet
from evolve.datasets.userbench import LOADER as user_loader
from evolve.models.llm import LLMClient, ModelConfig
from evolve.scoring import beam_judge, userjudge
from evolve.scoring import locomo as locomo_scoring
from evolve.scoring import longmemeval as longmemeval_scoring
from evolve.scoring.answers import AnswerScorer
from evolve.scoring.fitness import BenchMetrics, Fitness, Variant, choose


class Loader(Protocol):
    """What a benchmark's data module offers (a module satisfies it with these names)."""

    @property
    def SPLIT_NAMES(self) -> tuple[str, ...]:
        """The named splits of its splits file."""
        ...

    @property
    def DEFAULT_SPLIT(self) -> str:
        """What ``evolve eval`` scores when no split is named."""
        ...

    @property
    def DEFAULT_SPLITS_FILE(self) -> Path:
        """Its shipped splits file."""
        ...

    def load_taskset(self, data_dir: Path, split: str) -> TaskSet:
        """A split read from ``data_dir`` (DataError with one line on bad input)."""
        ...

    def split_files(self, data_dir: Path, split: str, conversations: int | None) -> list[Path]:
        """The data files a split (only its first ``conversations`` conversations) is read
        from."""
        ...

    def run_split(self, data_dir: Path, role: str) -> str:
        """The split a run's ``role`` (train, valid, test) reads from ``data_dir``."""
        ...


ScorerFactory = Callable[[LLMClient | None], AnswerScorer]  # a judge client (or None) -> scorer
Fetch = Callable[[Path, Sequence[str]], dict[str, int]]  # data dir, release parts -> counts


@dataclass(frozen=True)
class Bench:
    """One benchmark: everything PrisMem asks of it."""

    name: str
    loader: Loader
    scorer: ScorerFactory  # its answer scorer, built with the judge's client (None: no judge)
    metrics: BenchMetrics  # the metrics its judged and answer-f1 fitness read
    guards: tuple[str, ...] = ()  # a new run's guard specs when --guard is not given
    conversations: int | None = None  # a new run's train and valid size (None: whole splits)
    fetch: Fetch | None = None  # downloads its release (``evolve data fetch``)
    # its --data-dir is a folder of its own, holding no other bench (a guard of another bench
    # reads $PRISMEM_DATA by default); False: a data root that holds the other benches too
    own_folder: bool = False

    @property
    def splits(self) -> tuple[str, ...]:
        return self.loader.SPLIT_NAMES

    @property
    def default_split(self) -> str:
        return self.loader.DEFAULT_SPLIT

    @property
    def splits_file(self) -> Path:
        return self.loader.DEFAULT_SPLITS_FILE

    def load_taskset(self, data_dir: Path, split: str | None = None) -> TaskSet:
        """A split (default: :attr:`default_split`) read from ``data_dir``."""
        return self.loader.load_taskset(Path(data_dir), split or self.default_split)

    def run_split(self, data_dir: Path, role: str) -> str:
        """The split a run's ``role`` (train, valid, test) reads from ``data_dir``."""
        return self.loader.run_split(Path(data_dir), role)

    def split_files(self, data_dir: Path, split: str, conversations: int | None) -> list[Path]:
        """The data files a split (only its first ``conversations`` conversations) is read
        from."""
        return self.loader.split_files(Path(data_dir), split, conversations)

    def fitness(
        self, task_model: ModelConfig | None, judged: bool, variant: Variant = "described"
    ) -> Fitness:
        """The fitness of a run or evaluation on this bench
        (:func:`evolve.scoring.fitness.choose`)."""
        return choose(self.metrics, task_model, judged, variant)


# The shipped benchmarks. BEAM's default guards: the LoCoMo sample (its one conversation,
# conv-26: other speakers, other question kinds) and the first BEAM-500K conversation of the
# shipped `guard` split (five times longer histories than BEAM-100K), one conversation each, the
# least that still guards (docs/design.md, "Guard sets"). BEAM's default run reads the first 2
# conversations of train and valid: the seed's first evaluation, mostly encoding, grows with
# every conversation read (docs/performance.md, "The default run"); LoCoMo's judged fitness
# reads the official rule for category 5, which its judge protocol leaves out.
# `jsonl` is a user-format folder (--data-dir DIR, docs/user-format.md): no default guards, whole
# splits.
ENTRIES: tuple[Bench, ...] = (
    Bench("beam", beam, beam_judge.Scorer, BenchMetrics(("beam_{variant}",), ("answer_f1",)),
          guards=("locomo:all@1", "beam:guard@1"), conversations=2, fetch=fetch_beam),
    Bench("locomo", locomo, locomo_scoring.Scorer,
          BenchMetrics(("judge_correct", "f1_official"), ("f1_official",))),
    Bench("longmemeval", longmemeval, longmemeval_scoring.Scorer,
          BenchMetrics(("judge_correct",), ("answer_f1",))),
    Bench("jsonl", user_loader, userjudge.Scorer,
          BenchMetrics(("judge_correct",), ("answer_f1",)), own_folder=True),
)  # fmt: skip
REGISTRY: dict[str, Bench] = {entry.name: entry for entry in ENTRIES}


def names() -> tuple[str, ...]:
    """Every registered bench's name, in registry order (``--bench``'s choices)."""
    return tuple(REGISTRY)


def fetchable() -> tuple[str, ...]:
    """The benches ``evolve data fetch`` can download."""
    return tuple(name for name, entry in REGISTRY.items() if entry.fetch is not None)


def bench(name: str) -> Bench:
    """The entry of ``name``; DataError (one line) for a name not registered."""
    if name not in REGISTRY:
        raise DataError(f"unknown benchmark {name!r} (expected one of {', '.join(REGISTRY)})")
    return REGISTRY[name]
