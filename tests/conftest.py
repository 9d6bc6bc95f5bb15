"""Shared pytest fixtures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data root (holds ``beam/``): ``$EVOLVE_DATA``, else ../shared/data."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    path = Path(os.environ.get("EVOLVE_DATA") or default)
    if not path.is_dir():
        pytest.fail(f"benchmark data not found at {path} (set EVOLVE_DATA)")
    return path


def write_beam_slice(
    data_dir: Path,
    root: Path,
    *,
    messages: int = 6,
    chars: int = 400,
    refs: list[tuple[str, str]] | None = None,
) -> Path:
    """A tiny BEAM data root under ``root`` for tests that call a real model: the conversations
    ``refs`` (size, number; default every train and valid one of the shipped splits), each cut
    to the first ``messages`` messages of its first session plus those its first
    information-extraction question cites (in their own sessions), each at most ``chars``
    characters, with two questions — that information-extraction one (F) and the first
    abstention (A). Same layout and loader as the real data."""
    from evolve.datasets import beam

    for size, conv in refs or [*beam.split_refs("train"), *beam.split_refs("valid")]:
        src = data_dir / "beam" / "chats" / size / conv
        dst = root / "beam" / "chats" / size / conv
        (dst / "probing_questions").mkdir(parents=True, exist_ok=True)
        questions = json.loads((src / beam.QUESTIONS_FILE).read_text())
        kept = {"information_extraction": questions["information_extraction"][:1],
                "abstention": questions["abstention"][:1]}  # fmt: skip
        cited = set(map(str, kept["information_extraction"][0].get("source_chat_ids") or []))
        batches = []
        for b, batch in enumerate(json.loads((src / "chat.json").read_text())):
            turns = [m for group in batch["turns"] for m in group]
            keep = [{**m, "content": m["content"][:chars]} for i, m in enumerate(turns)
                    if (b == 0 and i < messages) or str(m.get("id")) in cited]  # fmt: skip
            if keep:
                batches.append({**batch, "turns": [keep]})
        (dst / "chat.json").write_text(json.dumps(batches))
        (dst / beam.TOPIC_FILE).write_bytes((src / beam.TOPIC_FILE).read_bytes())
        (dst / beam.QUESTIONS_FILE).write_text(json.dumps(kept))
    return root
