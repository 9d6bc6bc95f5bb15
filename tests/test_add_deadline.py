"""An ``add``'s deadline measures the program, not the optimizer's embedding: however slow the
embedder, embedding what the session gave the program (up to ``ADD_EMBED_VOLUME`` times its
characters) never times the add out, while a program that asks for more embedding than that
is still held to the capped extension (:mod:`sandbox.isolate`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from contract.types import Message, Segment
from evolve.evaluation.pipeline import Pipeline
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


def add_once(repeat: int) -> None:
    source = embedding(repeat)
    assert source != SIMPLE
    pipeline = Pipeline(source, "p.py", llm=None, embedder=SlowEmbedder(), call_prefix="t",
                        max_complete_calls=0, call_timeout=30.0)  # fmt: skip
    try:
        pipeline.open()
        segment = Segment("s1", "2024-05-01", tuple(
            Message(f"m{i}", "user", f"message {i} about the garden and the piano")
            for i in range(4)))  # fmt: skip
        units = [{"content": m.content} for m in segment.messages]
        pipeline.add(segment, units, timeout=0.5)
    finally:
        pipeline.close()


def test_embedding_the_sessions_own_text_never_times_an_add_out() -> None:
    add_once(repeat=1)  # 2.5 s of embedding against a 0.5 s timeout and a 2 s cap


def test_embedding_beyond_the_volume_is_held_to_the_cap() -> None:
    with pytest.raises(HostTimeout, match=r"^add timed out after 0\.5 s of the program's time"):
        add_once(repeat=4 * ADD_EMBED_VOLUME)


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
    monkeypatch.setattr("evolve.evaluation.conversation.INDEX_SECONDS", 1.0)
    monkeypatch.setattr("evolve.evaluation.conversation.INDEX_SECONDS_PER_UNIT", 0.0)
    real = embed.HashingEmbedder.embed

    def slow(self: embed.HashingEmbedder, texts: list[str]) -> np.ndarray:
        time.sleep(1.5)  # more than the whole budget, per call
        return real(self, texts)

    monkeypatch.setattr(embed.HashingEmbedder, "embed", slow)
    program = ROOT / "seeds" / "dense.py"
    config = EvalSetup(cache_dir=str(tmp_path), task_model=None, embedder="hashing")
    result = run_conversation(program.read_text(), str(program), conv, questions[:2], config)
    assert [t.error for t in result.traces] == [None, None]
