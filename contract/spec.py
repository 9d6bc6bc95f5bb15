"""The memory-program contract: what a program file must define, in one specification.

A memory program is one Python module (docs/design.md §1). It must define:

- ``EXTRACTION_INSTRUCTION``, ``PLANNING_INSTRUCTION``, ``ANSWER_INSTRUCTION`` — non-empty
  strings given to the task LLM for the Extraction, Planning and Answer components.
- ``@dataclass MemoryUnit`` and ``@dataclass Query`` — at least one field each; every field is
  one of ``str``, ``int``, ``float``, ``bool``, ``list[str]`` or ``Optional`` of those. The
  executor renders their JSON schema for the LLM (:func:`~contract.records.json_schema`) and
  validates what comes back (:func:`~contract.records.validate_record`): missing or extra
  fields, wrong types, non-finite numbers.
- ``class Memory`` with ``__init__(self, backend)``, ``index(self, units, segment) -> None``
  (called once per session, in history order, with that session's units) and
  ``retrieve(self, query) -> str``. All synchronous.

It may also define these component hooks (plain functions):

- ``postprocess_units(units: list[MemoryUnit], segment: Segment) -> list[MemoryUnit]`` — part
  of Extraction; runs on the validated units of each segment before they are stored.
- ``postprocess_query(query: Query, question: str) -> Query`` — part of Planning; runs on the
  validated query before retrieval.

What the program receives:

- ``segment``: a frozen :class:`~contract.types.Segment` (``session_id``, ``date`` —
  ISO ``YYYY-MM-DD`` when known —, ``messages`` each with ``id``, ``role``, ``content``).
- ``backend``: an object with ``embed(texts) -> numpy.ndarray`` (float32 rows, L2-normalised,
  ``backend.dim`` columns) and ``complete(prompt, max_tokens=256) -> str``, a counted call to the
  task LLM limited to ``backend.max_complete_calls`` per index/retrieve call (raises
  :class:`~contract.types.BackendError` when no LLM is configured or the budget is spent).

Invariants enforced by the executor, not by the program:

- The retrieved text handed to Answer is at most :data:`OUT_CHAR_BUDGET` characters; longer
  results are truncated and the trace records that the budget was exceeded.
- Offline (no task model): extraction yields one unit per message via
  :func:`~contract.records.build_record` (the content field gets ``"[date] role: text"``),
  planning uses the question as the query, answering is skipped.

This module is the one specification of those names: tier 1 (:mod:`sandbox.static`), the
load-time checks (:mod:`contract.program`), the component fingerprints
(:mod:`sandbox.fingerprint`) and the task prompts read the tables below.
"""

from __future__ import annotations

CONTRACT_VERSION = "2"  # bump when a program valid under the old contract may not be now
OUT_CHAR_BUDGET = 16_000

# The pipeline components, in pipeline order.
COMPONENTS = ("extract", "index", "plan", "retrieve", "answer")

# Required top-level names, each with the component it belongs to.
INSTRUCTIONS: dict[str, str] = {  # component -> a non-empty string
    "extract": "EXTRACTION_INSTRUCTION",
    "plan": "PLANNING_INSTRUCTION",
    "answer": "ANSWER_INSTRUCTION",
}
DATACLASSES: dict[str, str] = {"extract": "MemoryUnit", "plan": "Query"}  # component -> class
MEMORY = "Memory"  # the class; its methods belong to the components of MEMORY_METHODS

# Memory's methods: name -> (component, parameters after self).
MEMORY_METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "__init__": ("index", ("backend",)),
    "index": ("index", ("units", "segment")),
    "retrieve": ("retrieve", ("query",)),
}
# Optional component hooks: name -> (component, parameters).
HOOKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "postprocess_units": ("extract", ("units", "segment")),
    "postprocess_query": ("plan", ("query", "question")),
}

REQUIRED_NAMES = (*INSTRUCTIONS.values(), *DATACLASSES.values(), MEMORY)


def top_roots(component: str) -> tuple[str, ...]:
    """The top-level names a component starts from: its instruction, dataclass and hook."""
    names = [INSTRUCTIONS.get(component), DATACLASSES.get(component)]
    names += [hook for hook, (owner, _) in HOOKS.items() if owner == component]
    return tuple(n for n in names if n is not None)


def memory_roots(component: str) -> tuple[str, ...]:
    """The ``Memory`` methods a component starts from (index: ``__init__`` and ``index``)."""
    return tuple(m for m, (owner, _) in MEMORY_METHODS.items() if owner == component)
