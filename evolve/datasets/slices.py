"""BEAM slices: small data roots cut from the real BEAM files, for runs against slow models.

A slice keeps the release layout (``beam/chats/<size>/<n>/``), so the ordinary loader and split
file read it: the real-LLM test tier and ``bench/run_reuse.py`` use one to run a whole
``evolve run`` with a CPU-served model in minutes. Invariants: every kept message is verbatim up
to ``chars`` characters and keeps its id; a kept question's cited messages are all kept.
"""

from __future__ import annotations

import json
from pathlib import Path

from evolve.datasets import beam


def write_slice(
    data_dir: Path,
    root: Path,
    *,
    messages: int = 6,
    chars: int = 400,
    refs: list[tuple[str, str]] | None = None,
) -> Path:
    """Write a slice of ``data_dir`` under ``root`` and return ``root``: the conversations
    ``refs`` (size, number; default every train and valid one of the shipped splits), each cut
    to the first ``messages`` messages of its first session plus those its first
    information-extraction question cites (in their own sessions), each at most ``chars``
    characters, with two questions — that information-extraction one (F) and the first
    abstention (A)."""
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
