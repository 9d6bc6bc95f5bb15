"""Shared pytest fixtures and helpers, and the switches that turn a skip into a failure.

A test that needs something the machine may lack (Chromium, a model server, Ray, root) skips
and says why, unless its switch is set to ``require`` (``.ci/run`` sets them all):
``PRISMEM_CHROMIUM``, ``PRISMEM_REAL_LLM``, ``PRISMEM_RAY``, ``PRISMEM_BARRIER``.

Numpy's BLAS runs one thread in every test process and in the processes they start
(:func:`pytest_configure`): the suite runs a worker per core, and a second BLAS thread per
process only spins against the other worker.

Owns the test programs and configurations more than one module starts from: :data:`MINIMAL`
(``fixtures/minimal_program.py``) and :func:`minimal` (it with edits), :func:`run_config` (an
offline run of the hybrid seed with the hashing embedder); and :func:`check_once`, which lets a
module about the loop pass each distinct program through the sandbox's real check once per test
process.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from threadpoolctl import threadpool_limits

import evolve.models.testing  # noqa: F401  (registers the test doubles in evolve.models.DOUBLES)
import sandbox.check
from evolve.config import RunConfig
from evolve.datasets.beam import load_conversation
from evolve.datasets.types import Conversation, TaskSet
from evolve.environment import folder
from evolve.evolution.archive import improves
from evolve.evolution.store import CandidateMeta
from sandbox.check import CheckedProgram, CheckReport
from sandbox.fingerprint import fingerprints
from sandbox.static import imported_modules

Unavailable = Callable[[str, str], NoReturn]  # (switch, why)

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = (Path(__file__).parent / "fixtures" / "minimal_program.py").read_text()
PACKAGES = ("evolve", "sandbox", "contract")
_CHECKED: dict[str, CheckReport] = {}  # check_once's reports, by the call's arguments


def skip_or_fail(switch: str, why: str) -> NoReturn:
    """Skip with ``why``; fail instead when the environment variable ``switch`` is ``require``."""
    if os.environ.get(switch) == "require":
        pytest.fail(f"{why} ({switch}=require)")
    pytest.skip(why)


def pytest_configure(config: pytest.Config) -> None:
    """One BLAS thread here and, through the environment, in every process a test starts."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    threadpool_limits(int(os.environ["OPENBLAS_NUM_THREADS"]), user_api="blas")


@pytest.fixture(scope="session")
def unavailable() -> Unavailable:
    """:func:`skip_or_fail`, for tests that find out at run time what they lack."""
    return skip_or_fail


@pytest.fixture(scope="session")
def offline_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for the offline runs (no LLM: only step outputs and embeddings are
    cached) of tests that compare outcomes rather than count computed stages; shared across
    modules, so the stages they have in common (the seed's, to begin with) run once."""
    return tmp_path_factory.mktemp("offline-cache")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data root (holds ``beam/``): ``$PRISMEM_DATA``, else ../shared/data."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    path = Path(folder("DATA") or default)
    if not path.is_dir():
        pytest.fail(f"benchmark data not found at {path} (set PRISMEM_DATA)")
    return path


@pytest.fixture
def other_version(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``other_version(dist)``: from then on, ``importlib.metadata`` reports another version of
    the installed distribution ``dist`` (every other one is unchanged); undone after the test."""
    real = importlib.metadata.version

    def install(dist: str) -> None:
        monkeypatch.setattr(
            importlib.metadata,
            "version",
            lambda name: "0.0.0-other" if name == dist else real(name),
        )

    return install


def paired_beats(new: CandidateMeta, old: CandidateMeta, capability: str | None) -> bool:
    """Whether ``new`` beats ``old`` by the archive's paired test on valid, on one capability's
    questions (None: all of them): what a specialist or best-overall claim must rest on."""

    def questions(c: CandidateMeta) -> dict[str, float]:
        caps = c.scores["valid"].question_capabilities
        per = c.scores["valid"].questions
        return {q: v for q, v in per.items() if capability in (None, caps[q])}

    seed = f"{new.source_sha256}|{old.source_sha256}|{capability}"
    return improves(questions(new), questions(old), seed)


def first_sessions(data_dir: Path, sessions: int, most: int, conv_id: str = "1") -> TaskSet:
    """The first ``sessions`` sessions of BEAM-100K conversation ``conv_id`` and (at most
    ``most``) of the questions whose evidence lies entirely there."""
    conv, questions = load_conversation(data_dir, "100K", conv_id)
    kept = conv.sessions[:sessions]
    ids = {m.id for s in kept for m in s.messages}
    keep = [q for q in questions if q.evidence_ids and set(q.evidence_ids) <= ids][:most]
    return TaskSet("beam", "small", (Conversation(conv.id, kept, conv.meta),), tuple(keep))


def unchecked(source: str, path: str | Path = "p.py") -> CheckedProgram:
    """``source`` as if it had passed the sandbox's checks: for tests of what holds when a
    program slipped past them, and of evaluation steps that need no check."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    return CheckedProgram(source, str(path), digest, fingerprints(source), imported_modules(source))


def minimal(*edits: tuple[str, str]) -> str:
    """:data:`MINIMAL` with each ``(old, new)`` edit made once, in order (``old`` must occur)."""
    source = MINIMAL
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new, 1)
    return source


def run_config(data_dir: Path, cache: Path, **over: Any) -> RunConfig:
    """An offline run of ``seeds/hybrid.py`` on the first conversation of each split, one job,
    the hashing embedder (deterministic, meaningless numbers), step outputs in ``cache``;
    ``over`` sets any other field."""
    base = {"data_dir": str(data_dir), "seed_program": str(ROOT / "seeds" / "hybrid.py"),
            "cache_dir": str(cache), "jobs": 1, "embedder": "hashing",
            "conversations": 1}  # fmt: skip
    return RunConfig(**{**base, **over})


@pytest.fixture(scope="module")
def check_once() -> Iterator[None]:
    """For the module that asks for it (``pytestmark = pytest.mark.usefixtures("check_once")``):
    each distinct call of :func:`sandbox.check.check_program` (program and arguments) runs the
    real check once per test process, and a repeat gets a copy of that report. For modules about
    the loop, whose runs check the same seed and children again and again; never for a test of
    the sandbox."""
    real = sandbox.check.check_program

    def once(*args: Any, **kwargs: Any) -> CheckReport:
        key = repr((args, sorted(kwargs.items())))
        if key not in _CHECKED:
            _CHECKED[key] = real(*args, **kwargs)
        return copy.deepcopy(_CHECKED[key])

    def point(old: object, new: object) -> None:  # each project module's name for it
        for name, module in list(sys.modules.items()):
            if name.split(".")[0] in PACKAGES and vars(module).get("check_program") is old:
                module.check_program = new  # type: ignore[attr-defined]

    point(real, once)
    try:
        yield
    finally:
        point(once, real)
