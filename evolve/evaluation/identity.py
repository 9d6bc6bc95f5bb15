"""How a program runs and was scored: the pipeline version, the mode, and their record.

Owns :func:`pipeline_version` (a digest of what the pipeline contributes to step outputs),
the one vocabulary of modes (:data:`OFFLINE`, :data:`ONLINE` and how each is written),
:class:`ScoredAs` (what a deployment must match to behave as scored) and its record in an
exported program's header (:meth:`ScoredAs.lines`, read back by :func:`read_scored_as`).
Evaluation keys every step output on the pipeline version (:mod:`.stepcache`); an export
writes the record (:mod:`evolve.evolution.export`); the runtime compares it with what it runs
(:mod:`evolve.runtime.api`). Neither needs the evaluation engine for it: this module loads
only the prompts and the embedder's module (no executor, conversation, pipeline or step cache).

Invariants:

- Every input of :func:`pipeline_version` that can change a step's output for the same
  program and data is in its digest: :data:`PIPELINE_VERSION` (bumped whenever a change in the
  pipeline, the host or the offline stand-ins changes an output), the contract version, the
  prompt texts and extraction window (:func:`evolve.evaluation.prompts.texts`), the
  truncation rule and budget, the embedding model, its precision and the installed versions
  of :data:`OUTPUT_LIBRARIES`.
- A mode is :data:`OFFLINE` (no task model: the stand-ins of :mod:`contract.program`, which
  :data:`OFFLINE_MEANS` describes) or :data:`ONLINE`; an evaluation report writes them as
  :data:`OFFLINE_MODE` and :data:`ONLINE_MODE`. Each string is defined here only.
- The record round-trips: ``read_scored_as(header with s.lines()) == s``. A file without the
  record (not an export, or an export without it) reads as None, never as a guess; the
  ``evaluator version`` line of older exports reads as the pipeline version.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from contract.spec import CONTRACT_VERSION, OUT_CHAR_BUDGET
from evolve.evaluation import prompts
from evolve.models.embed import EMBEDDING_LIBRARIES, Embedder, library_versions, precision

# What the pipeline contributes to step outputs beyond the program, folded into every step key by
# pipeline_version(): bump PIPELINE_VERSION whenever a change in the conversation, the pipeline,
# the host or the offline stand-ins changes what a step outputs for the same program and data.
PIPELINE_VERSION = "3"
TRUNCATION = "prefix"  # retrieved text keeps its first OUT_CHAR_BUDGET characters
# Installed distributions whose versions can change a step's output (numerics, tokenising,
# the embedding model's weights and code).
OUTPUT_LIBRARIES = ("prismem", "bm25s", "PyStemmer", *EMBEDDING_LIBRARIES)

OFFLINE = "offline"  # no task model
ONLINE = "task model"  # a task model runs the program's instructions
OFFLINE_MEANS = "one unit per message, the question as the query, the instructions never run"
OFFLINE_MODE = f"{OFFLINE}: retrieval-only"  # an evaluation report's mode, offline
ONLINE_MODE = "online"  # an evaluation report's mode with a task model

HEADER_MARK = "# PrisMem export"  # an exported program's header block starts with this line
SCORED_AS = "# scored as: "
_SCORED_FIELDS = {"task model": "task_model", "embedder": "embedder", "precision": "precision",
                  "pipeline version": "pipeline_version"}  # fmt: skip
_OLD_NAMES = {"evaluator version": "pipeline version"}  # the field's name in older exports
_CODING = re.compile(r"[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")  # a PEP 263 encoding line


def pipeline_version() -> str:
    """A digest of what the pipeline contributes to step outputs: PIPELINE_VERSION, the
    contract version, the prompt texts and extraction window
    (:func:`evolve.evaluation.prompts.texts`),
    the truncation rule and budget, the embedding model, its precision and the installed
    versions of OUTPUT_LIBRARIES."""
    versions = library_versions(OUTPUT_LIBRARIES)
    parts = [PIPELINE_VERSION, CONTRACT_VERSION, *prompts.texts(), TRUNCATION, OUT_CHAR_BUDGET,
             Embedder.name, Embedder.dim, versions, precision()]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def mode(task_model: str | None) -> str:
    """:data:`OFFLINE` without a task model, else :data:`ONLINE`."""
    return OFFLINE if task_model is None else ONLINE


@dataclass(frozen=True)
class ScoredAs:
    """How a program was scored: what a deployment must match to behave as scored."""

    mode: str  # OFFLINE or ONLINE
    task_model: str | None  # the litellm id; None offline
    embedder: str  # "minilm" or "hashing"
    precision: str  # the embedding precision (evolve.models.embed.precision)
    pipeline_version: str

    @classmethod
    def here(cls, task_model: str | None, embedder: str) -> ScoredAs:
        """How this installation runs a program with ``task_model`` and ``embedder``: with its
        embedding precision and pipeline version."""
        return cls(mode(task_model), task_model, embedder, precision(), pipeline_version())

    def lines(self) -> list[str]:
        """The header lines that record it (read back by :func:`read_scored_as`)."""
        mode = f"{OFFLINE} ({OFFLINE_MEANS})" if self.mode == OFFLINE else ONLINE
        return [f"{SCORED_AS}{mode}", f"#   task model: {self.task_model or 'none'}",
                f"#   embedder: {self.embedder}", f"#   precision: {self.precision}",
                f"#   pipeline version: {self.pipeline_version}"]  # fmt: skip

    def differences(self, other: ScoredAs) -> list[str]:
        """``field: ours -> theirs`` for each field where ``other`` differs."""
        pairs = [("mode", self.mode, other.mode),
                 ("task model", self.task_model, other.task_model),
                 ("embedder", self.embedder, other.embedder),
                 ("precision", self.precision, other.precision),
                 ("pipeline version", self.pipeline_version[:12],
                  other.pipeline_version[:12])]  # fmt: skip
        return [f"{name} {a or 'none'} -> {b or 'none'}" for name, a, b in pairs if a != b]


def read_scored_as(text: str) -> ScoredAs | None:
    """The :class:`ScoredAs` an exported file's header records; None when the file has no such
    header (not an export, or one from before the header recorded it)."""
    _, body = split_preamble(text)
    lines = body.splitlines()
    if not lines or not lines[0].startswith(HEADER_MARK):
        return None
    fields: dict[str, str | None] = {}
    header = lines[1:]
    for k, line in enumerate(header):
        if not line.startswith("#"):
            return None  # the header block ended without the record
        if line.startswith(SCORED_AS):
            fields["mode"] = OFFLINE if line[len(SCORED_AS) :].startswith(OFFLINE) else ONLINE
            for item in header[k + 1 : k + 1 + len(_SCORED_FIELDS)]:
                name, _, value = item.removeprefix("#   ").partition(": ")
                name = _OLD_NAMES.get(name, name)
                if name in _SCORED_FIELDS:
                    fields[_SCORED_FIELDS[name]] = None if value == "none" else value.strip()
            break
    if set(fields) != {"mode", *_SCORED_FIELDS.values()}:
        return None
    if (fields["mode"] == OFFLINE) != (fields["task_model"] is None):
        return None
    return ScoredAs(**fields)  # type: ignore[arg-type]


def split_preamble(source: str) -> tuple[str, str]:
    """``(shebang / encoding lines, rest)``: the lines Python reads only at the top of a file.
    An encoding line counts on line 2 only after a shebang, a comment or a blank line."""
    lines = source.splitlines(keepends=True)
    first = lines[0] if lines else ""
    n = 1 if first.startswith("#!") or _CODING.match(first) else 0
    after_comment = n or not first.strip() or first.lstrip().startswith("#")
    if len(lines) > 1 and _CODING.match(lines[1]) and after_comment:
        n = 2
    return "".join(lines[:n]), "".join(lines[n:])
