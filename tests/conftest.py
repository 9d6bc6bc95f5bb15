"""Shared pytest fixtures and helpers, and the switches that turn a skip into a failure.

A test that needs something the machine may lack (Chromium, a model server, Ray, root) skips
and says why, unless its switch is set to ``require`` (``.ci/run`` sets them all):
``PRISMEM_CHROMIUM``, ``PRISMEM_REAL_LLM``, ``PRISMEM_RAY``, ``PRISMEM_BARRIER``.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

import evolve.models.testing  # noqa: F401  (registers the test doubles in evolve.models.DOUBLES)
from evolve.datasets.beam import load_conversation
from evolve.datasets.types import Conversation, TaskSet
from evolve.evolution.archive import improves
from evolve.evolution.store import CandidateMeta

Unavailable = Callable[[str, str], NoReturn]  # (switch, why)


def skip_or_fail(switch: str, why: str) -> NoReturn:
    """Skip with ``why``; fail instead when the environment variable ``switch`` is ``require``."""
    if os.environ.get(switch) == "require":
        pytest.fail(f"{why} ({switch}=require)")
    pytest.skip(why)


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
    """The benchmark data root (holds ``beam/``): ``$EVOLVE_DATA``, else ../shared/data."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    path = Path(os.environ.get("EVOLVE_DATA") or default)
    if not path.is_dir():
        pytest.fail(f"benchmark data not found at {path} (set EVOLVE_DATA)")
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
        caps = c.scores["valid"]["question_capabilities"]
        per = c.scores["valid"]["questions"]
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
