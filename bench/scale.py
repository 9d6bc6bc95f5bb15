"""Benchmark: indexing against raw encoding, and retrieval latency up to 10M tokens.

A measurement script, not a test. It prints, in one run, each figure beside its named baseline:

1. **Indexing vs raw encoding.** The dense seed indexes one conversation with a cold embedding
   cache (a fresh temporary one); the baseline is all-MiniLM-L6-v2 encoding the same unit texts
   with no cache at all (the physical limit on this machine). Ratio = index / encode.
2. **``retrieve()`` p50 / p95** of the dense seed over a BEAM-100K conversation, a BEAM-1M one and
   a synthetic 10M-token history (the sessions of the BEAM-1M conversations on disk, in order,
   until 10M tokens at 4 characters per token), each question asked twice: with a cold query
   embedding (a nonce makes it a cache miss) and with a cached one. Indexing here reads the
   shared embedding cache (``--cache-dir``): the first run encodes every unit once, later runs
   build the 10M memory from cached vectors.

Sandbox time per candidate is measured in a whole run, beside each candidate's evaluation
time, by ``bench/run_reuse.py``. Programs run in process with a trusted seed (no sandbox
host), so latency is the program's own plus the embedder's.

    python bench/scale.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from contract.program import load_program, offline_units
from contract.state import dump_state, load_state
from evolve.datasets.beam import list_conversations, load_conversation
from evolve.datasets.types import Conversation, Question
from evolve.environment import folder
from evolve.models.embed import Embedder

ROOT = Path(__file__).resolve().parents[1]
CHARS_PER_TOKEN = 4


class LocalBackend:
    """The dense seed's backend in process (a trusted seed, so no host)."""

    def __init__(self, embedder: Embedder) -> None:
        self.dim, self.max_complete_calls, self._embedder = embedder.dim, 0, embedder

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embedder.embed(list(texts))

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        raise RuntimeError("no LLM in this benchmark")


def build(conversation: Conversation, embedder: Embedder) -> tuple[Any, Any, float, list[str]]:
    """The dense seed's memory of ``conversation``; also its seconds and the unit texts."""
    program = load_program((ROOT / "seeds" / "dense.py").read_text(), "seeds/dense.py")
    memory = program.module.Memory(LocalBackend(embedder))
    texts: list[str] = []
    start = time.perf_counter()
    for segment in conversation.sessions:
        units = offline_units(program, segment)
        texts += [u.content for u in units]
        memory.index(units, segment)
    memory.retrieve(program.module.Query(text="warm-up"))  # stacks the matrix once
    return program, memory, time.perf_counter() - start, texts


def restore(program: Any, memory: Any) -> tuple[int, float]:
    """Bytes of the memory's stored state and seconds to restore it and answer one cached
    query: what a candidate that reuses the index step pays instead of indexing."""
    backend = memory.backend
    state = dump_state(memory, program.module.__name__, backend)
    start = time.perf_counter()
    again = load_state(program.module.Memory, state, vars(program.module), backend)
    again.retrieve(program.module.Query(text="warm-up"))
    return len(state), time.perf_counter() - start


def indexing(conversation: Conversation) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cold = Embedder(cache_path=Path(tmp) / "embeddings.sqlite")
        cold.embed(["load the model before the clock starts"])
        _, _, index_s, texts = build(conversation, cold)
    raw = Embedder(cache_path=None)
    raw.embed(["load the model before the clock starts"])
    start = time.perf_counter()
    raw._encode(texts)
    encode_s = time.perf_counter() - start
    print(f"indexing {conversation.id}: {len(texts)} units, {conversation.n_chars:,} chars: "
          f"dense index {index_s:.1f} s vs raw MiniLM encoding {encode_s:.1f} s "
          f"= {index_s / encode_s:.2f}x (goal <= 1.2x)")  # fmt: skip


def latency(label: str, conversation: Conversation, questions: list[Question],
            embedder: Embedder) -> None:  # fmt: skip
    program, memory, index_s, texts = build(conversation, embedder)
    state_bytes, restore_s = restore(program, memory)
    embedder.embed([q.question for q in questions])  # the cached round hits the cache
    for q in questions[:3]:  # torch warms up per input length: not part of steady state
        memory.retrieve(program.module.Query(text=f"{q.question} warm"))
    nonce = uuid.uuid4().hex[:8]
    cold, warm = [], []
    for q in questions:
        for times, text in ((cold, f"{q.question} ({nonce})"), (warm, q.question)):
            t0 = time.perf_counter()
            memory.retrieve(program.module.Query(text=text))
            times.append((time.perf_counter() - t0) * 1000)
    print(f"retrieve() {label}: {len(texts):,} units, {conversation.n_chars:,} chars "
          f"(indexed in {index_s:.1f} s from the cache), {len(questions)} questions")  # fmt: skip
    print(f"  stored memory {state_bytes / 1e6:.1f} MB: restored in {restore_s * 1000:.0f} ms = "
          f"{restore_s / index_s:.1%} of indexing from the embedding cache")  # fmt: skip
    for name, times in (("cold query embedding", cold), ("cached query embedding", warm)):
        p50, p95 = statistics.median(times), float(np.percentile(times, 95))
        print(f"  {name}: p50 {p50:.1f} ms, p95 {p95:.1f} ms (goal p50 <= 20 ms on BEAM-1M)")


def synthetic(data_dir: Path, tokens: int) -> tuple[Conversation, list[Question]]:
    """The BEAM-1M conversations on disk, session after session, up to ``tokens`` tokens; the
    questions of every conversation used (their evidence ids stay unique per conversation)."""
    sessions, questions, chars = [], [], 0
    for conv_id in list_conversations(data_dir, "1M"):
        conversation, qs = load_conversation(data_dir, "1M", conv_id)
        questions += qs
        for segment in conversation.sessions:
            sessions.append(segment)
            chars += sum(len(m.content) for m in segment.messages)
            if chars >= tokens * CHARS_PER_TOKEN:
                return Conversation("synthetic-10M", tuple(sessions), {}), questions
    return Conversation("synthetic-10M", tuple(sessions), {}), questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "prismem")
    parser.add_argument("--tokens", type=int, default=10_000_000, help="synthetic history size")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")  # fmt: skip
    data = args.data_dir
    indexing(load_conversation(data, "100K", "1")[0])
    shared = Embedder(cache_path=args.cache_dir / "embeddings.sqlite")
    for size, conv in (("100K", "1"), ("1M", "3")):
        conversation, questions = load_conversation(data, size, conv)
        latency(f"BEAM-{size} {conv}", conversation, questions, shared)
    conversation, questions = synthetic(data, args.tokens)
    latency(f"synthetic {args.tokens:,} tokens", conversation, questions, shared)


if __name__ == "__main__":
    main()
