"""An ``add``'s deadline measures the program, not the optimizer's embedding: however slow the
embedder, embedding what the session gave the program (up to ``ADD_EMBED_VOLUME`` times its
characters) never times the add out, while a program that asks for more embedding than that
is still held to the capped extension (:mod:`sandbox.isolate`). Every add runs under the one
indexing deadline rule (:class:`~evolve.evaluation.pipeline.IndexBudget`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from conftest import unchecked

from contract.types import Message, Segment
from evolve.evaluation.pipeline import INDEX_SECONDS, INDEX_SECONDS_PER_UNIT, IndexBudget, Pipeline
from evolve.models.embed import HashingEmbedder
from sandbox.budget import ADD_EMBED_VOLUME
from sandbox.isolate import HostTimeout

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = (ROOT / "seeds" / "simple.py").read_text()
SLOW_EMBED_S = 2.5  # one embedding call; the add's own timeout is 0.5 s, its cap 4 x 0.5 s


def embedding(repeat: int) -> str:
    """simple.py that embeds each unit's text ``repeat`` times over when indexing."""
    return SIMPLE.replace(
        "        self.units.extend(units)\n",
        "        self.units.extend(units)\n"
        f"        self.backend.embed([u.content * {repeat} for u in units])\n",
    )


class SlowEmbedder(HashingEmbedder):
    """A hashing embedder on a very slow machine."""

    def embed(self, texts: list[str]) -> np.ndarray:
        time.sleep(SLOW_EMBED_S)
        return super().embed(texts)


def add_once(repeat: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One add whose deadline is 0.5 s (:class:`IndexBudget` with no time per unit)."""
    monkeypatch.setattr("evolve.evaluation.pipeline.INDEX_SECONDS", 0.5)
    monkeypatch.setattr("evolve.evaluation.pipeline.INDEX_SECONDS_PER_UNIT", 0.0)
    source = embedding(repeat)
    assert source != SIMPLE
    pipeline = Pipeline(unchecked(source), llm=None, embedder=SlowEmbedder(), call_prefix="t",
                        max_complete_calls=0, call_timeout=30.0)  # fmt: skip
    try:
        pipeline.open()
        segment = Segment("s1", "2024-05-01", tuple(
            Message(f"m{i}", "user", f"message {i} about the garden and the piano")
            for i in range(4)))  # fmt: skip
        units = [{"content": m.content} for m in segment.messages]
        pipeline.add(segment, units)
    finally:
        pipeline.close()


def test_embedding_the_sessions_own_text_never_times_an_add_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    add_once(1, monkeypatch)  # 2.5 s of embedding against a 0.5 s timeout and a 2 s cap


def test_embedding_beyond_the_volume_is_held_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HostTimeout, match=r"^add timed out after 0\.5 s of the program's time"):
        add_once(4 * ADD_EMBED_VOLUME, monkeypatch)


def test_a_conversations_index_budget_counts_the_programs_time_only(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluation's adds share one budget of the program's time: embedding done for them by the
    optimizer, however slow, does not use it up (BEAM-100K conversation 1: 3 sessions, each
    embedding slower than the whole budget)."""
    from evolve.datasets.beam import load_conversation
    from evolve.evaluation.conversation import run_conversation
    from evolve.evaluation.setup import EvalSetup
    from evolve.models import embed

    conv, questions = load_conversation(data_dir, "100K", "1")
    assert len(conv.sessions) == 3
    monkeypatch.setattr("evolve.evaluation.pipeline.INDEX_SECONDS", 1.0)
    monkeypatch.setattr("evolve.evaluation.pipeline.INDEX_SECONDS_PER_UNIT", 0.0)
    real = embed.HashingEmbedder.embed

    def slow(self: embed.HashingEmbedder, texts: list[str]) -> np.ndarray:
        time.sleep(1.5)  # more than the whole budget, per call
        return real(self, texts)

    monkeypatch.setattr(embed.HashingEmbedder, "embed", slow)
    program = ROOT / "seeds" / "dense.py"
    config = EvalSetup(cache_dir=str(tmp_path), task_model=None, embedder="hashing")
    result = run_conversation(unchecked(program.read_text(), program), conv, questions[:2], config)
    assert [t.error for t in result.traces] == [None, None]


def test_every_add_has_one_deadline_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """An add given no budget may take INDEX_SECONDS plus INDEX_SECONDS_PER_UNIT per unit (the
    runtime's adds); adds charged to one budget (a conversation's build) share it, each less
    the program's own time of the adds before it (the optimizer's time serving it is not)."""
    pipeline = Pipeline(unchecked(SIMPLE), llm=None, embedder=HashingEmbedder(), call_prefix="t",
                        max_complete_calls=0, call_timeout=30.0)  # fmt: skip
    asked: list[float | None] = []

    def call(*_: object, timeout: float | None = None, **__: object) -> tuple[None, list[bytes]]:
        asked.append(timeout)
        time.sleep(0.1)
        pipeline.backend_seconds += 0.09  # of which the optimizer served the program 0.09 s
        return None, []

    monkeypatch.setattr(pipeline, "call", call)
    segment = Segment("s1", "2024-05-01", (Message("m0", "user", "the garden"),))
    units = [{"content": "the garden"}] * 4
    one = INDEX_SECONDS + 4 * INDEX_SECONDS_PER_UNIT
    pipeline.add(segment, units)
    pipeline.add(segment, units)
    assert asked == [one, one]  # each on its own budget
    budget = IndexBudget()
    pipeline.add(segment, units, budget)
    pipeline.add(segment, units, budget)
    assert asked[2] == one
    second = asked[3]
    assert second is not None and one + 4 * INDEX_SECONDS_PER_UNIT - 0.05 < second < one + 1
    assert budget.left < second  # the second add's program time was charged too
