"""Tiers 3 and 4 of the sandbox, run inside the confined host with a local stub backend.

- **Smoke** (:func:`smoke_tier`): construct ``Memory``, index a session of synthetic units,
  index an empty session, retrieve with a valid query; ``index`` must return None,
  ``retrieve`` a str within the 16,000-character budget, the backend must be left as it
  was given (class, methods, attributes), and ``retrieve`` must leave the memory's stored
  state (:func:`contract.state.dump_state`) byte for byte as it found it: retrievals are
  cached per index state and query, so one that depends on earlier retrieves would be scored
  on what a cached run never sees. This backs the static rule of :mod:`sandbox.readonly`,
  which cannot see every route; a memory whose state cannot be stored is not compared (the
  details say ``retrieve_state_checked: false``).
- **Complexity probe**, the program's side (:func:`probe_run`): index synthetic units over
  batches with a given backend and answer two queries. The optimizer serves the backend and
  measures the run from outside (:mod:`sandbox.probe`), so nothing the verdict rests on is
  computed here.

Results are checked by exact type (``type(x) is str``): a subclass could lie about its length.

No task LLM is reachable: the stub's ``complete`` raises BackendError, as offline mode does.
"""

from __future__ import annotations

import gc
import hashlib
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from contract.program import LoadedProgram, offline_units
from contract.records import build_record
from contract.spec import OUT_CHAR_BUDGET
from contract.state import dump_state
from contract.types import BackendError, Message, Segment

SMOKE_DIM = 384

_WORDS = (
    "project deadline sprint budget meeting python database schema query index retrieval "
    "march april may june monday friday coffee running marathon guitar recipe travel paris "
    "doctor appointment invoice client design review deploy server bug fix test release"
).split()


class TierError(Exception):
    """The program failed a tier's rule; the message says which rule."""


# Bound at import, before any program runs: patches to these modules cannot reach the stub.
_rng, _norm, _blake2b, _collect = np.random.default_rng, np.linalg.norm, hashlib.blake2b, gc.collect


class StubBackend:
    """Deterministic pseudo-embeddings (seeded by the text's hash) for the smoke tier; no LLM."""

    def __init__(self, dim: int, max_complete_calls: int = 0) -> None:
        self.dim = dim
        self.max_complete_calls = max_complete_calls

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = list(texts)
        if not all(type(t) is str for t in items):
            raise TypeError("backend.embed takes a list of strings")
        out = np.empty((len(items), self.dim), dtype=np.float32)
        for i, text in enumerate(items):
            seed = int.from_bytes(_blake2b(text.encode(), digest_size=8).digest(), "big")
            row = _rng(seed).standard_normal(self.dim).astype(np.float32)
            out[i] = row / _norm(row)
        return out

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        raise BackendError("backend.complete: no task LLM in the sandbox")


def synthetic_session(
    program: LoadedProgram, session: int, n_units: int, seed: int
) -> tuple[list[Any], Segment]:
    rng = random.Random(seed)
    date = f"2024-{1 + session // 28 % 12:02d}-{1 + session % 28:02d}"
    messages = tuple(
        Message(
            f"{session}-{i}",
            "user" if i % 2 == 0 else "assistant",
            " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 40))),
        )
        for i in range(n_units)
    )
    segment = Segment(str(session), date, messages)
    units = offline_units(program, segment)
    return units, segment


def _query(program: LoadedProgram, text: str) -> Any:
    return build_record(program.query, text, vars(program.module))


def _retrieve(memory: Any, query: Any) -> str:
    text = memory.retrieve(query)
    if type(text) is not str:
        raise TierError(f"Memory.retrieve must return str, got {type(text).__name__}")
    if len(text) > OUT_CHAR_BUDGET:
        raise TierError(
            f"Memory.retrieve returned {len(text)} characters; the budget is {OUT_CHAR_BUDGET}"
        )
    return text


def _index(memory: Any, units: list[Any], segment: Segment) -> None:
    if memory.index(units, segment) is not None:
        raise TierError("Memory.index must return None")


def _backend_state(backend: Any) -> tuple[Any, ...]:
    """What a program must leave alone: the backend's class, methods, attributes, settings."""
    cls = type(backend)
    return (cls, cls.embed, cls.complete, sorted(vars(backend).items()))  # fmt: skip


def _check_backend(backend: Any, before: tuple[Any, ...]) -> None:
    if _backend_state(backend) != before:
        raise TierError("Memory modified the backend it was given; treat it as read-only")


def _memory_state(program: LoadedProgram, memory: Any, backend: Any) -> bytes | None:
    """The memory's state as the step cache would store it, or None when it cannot be."""
    try:
        return dump_state(memory, program.module.__name__, backend)
    except Exception:  # unstorable (a lambda, a generator, ...): such a memory is rebuilt
        return None


def smoke_tier(program: LoadedProgram) -> dict[str, Any]:
    backend = StubBackend(SMOKE_DIM)
    before = _backend_state(backend)
    memory = program.get("Memory")(backend)
    units, segment = synthetic_session(program, 1, 12, seed=1)
    _index(memory, units, segment)
    _index(memory, [], Segment("2", "2024-01-03", ()))
    indexed = _memory_state(program, memory, backend)
    text = _retrieve(memory, _query(program, "When is the project deadline?"))
    _check_backend(backend, before)
    if indexed is not None and _memory_state(program, memory, backend) != indexed:
        raise TierError(
            "Memory.retrieve changed the memory's state; retrieve must leave the memory as it "
            "found it (retrievals are cached per index and query): compute it in index(), or "
            "keep it in a local variable of retrieve"
        )
    return {"retrieved_chars": len(text), "retrieve_state_checked": indexed is not None}


def probe_run(program: LoadedProgram, backend: Any, n_units: int, n_batches: int) -> None:
    """One run of the probe: a fresh memory indexes ``n_units`` synthetic units in
    ``n_batches`` sessions and answers two queries; its garbage is collected before the
    request ends, so each run pays for its own."""
    before = _backend_state(backend)
    memory = program.get("Memory")(backend)
    per_batch = n_units // n_batches
    for b in range(n_batches):
        units, segment = synthetic_session(program, b, per_batch, seed=b)
        _index(memory, units, segment)
    for text in ("What did I decide about the database schema?", "When is the marathon?"):
        _retrieve(memory, _query(program, text))
    _check_backend(backend, before)
    del memory
    _collect()
