"""Exporting a candidate as a standalone program file.

Owns the format of an exported program file and :class:`ExportError`; freezing a candidate (its
one look at the test split) is :mod:`.freeze`, which needs the evaluation engine that this
module does not load.

Invariants:

- **An export is the candidate plus comments.** The file is the candidate's source byte for byte
  with a block of ``#`` lines inserted after any shebang / encoding line, so its AST — hence its
  step-cache fingerprints and cached step outputs — equals the candidate's, and removing the
  header block (and the blank line after it) gives back the source whose sha256 it records.
  It must pass the sandbox check before anything is written; an existing file is replaced only
  when asked, atomically.
- **An export says how it was scored.** Its header records the run's mode (offline: one unit
  per message, the question as the query, the three instructions never run; or with a task
  model), the task model, the embedder, and the embedding precision and pipeline version
  (:func:`evolve.evaluation.identity.pipeline_version`) of the installation that exports it,
  which are those its scores came from when the run was scored there (the step cache keys
  every output on them). The record's lines and their reading are
  :class:`evolve.evaluation.identity.ScoredAs` and
  :func:`~evolve.evaluation.identity.read_scored_as`; the runtime compares it with what it
  runs (:mod:`evolve.runtime`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from contract.spec import CONTRACT_VERSION
from evolve.config import ConfigError, stored_config
from evolve.evaluation.identity import HEADER_MARK, ScoredAs, split_preamble
from evolve.evaluation.report import ScoreBlock
from evolve.evolution.candidate import TEST, TRAIN, VALID
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.summary import ancestry, figures, fitness_mode, transfer, transfer_lines
from evolve.files import write_atomic
from sandbox.check import check_program


class ExportError(Exception):
    """A candidate cannot be exported; the message is one line for the user."""


def scored_as(store: RunStore) -> ScoredAs:
    """How the run's candidates were scored: its config's task model and embedder, with this
    installation's precision and pipeline version."""
    config = stored_config(store.manifest, store.run_id)
    return ScoredAs.here(config.task_model.model if config.task_model else None, config.embedder)


# --- export -------------------------------------------------------------------------------


def header(store: RunStore, meta: CandidateMeta, when: datetime | None = None) -> list[str]:
    """The ``#`` lines an export starts with (after any shebang / encoding line)."""
    when = when or datetime.now(UTC)
    lines = [
        f"{HEADER_MARK} of a memory program (contract version {CONTRACT_VERSION})",
        f"# run: {store.run_id}",
        f"# candidate: {meta.id} ({meta.stage}, {meta.status})",
        f"# exported: {when.isoformat(timespec='seconds')}",
        f"# source sha256: {meta.source_sha256} (this file without this block and the blank "
        "line after it)",
        *scored_as(store).lines(),
        f"# scores (fitness: {fitness_mode(store.manifest).name}):",
    ]
    for split in (VALID, TRAIN, TEST):
        s = figures(meta.scores.get(split, ScoreBlock()).row(None))
        if s.fitness is None:
            text = "not frozen" if split == TEST else "not scored"
        else:
            text = f"fitness {s.fitness:.4f}, similarity {_num(s.similarity)}, "
            text += f"hit rate {_num(s.hit_rate)}"
        lines.append(f"#   {split}: {text}")
    lines += [f"# {line}" for line in transfer_lines(transfer(store.candidates(), of=meta))]
    lines.append("# lineage (back to the seed):")
    for node in ancestry(store, meta.id):
        parents = f" <- {', '.join(node.parents)}" if node.parents else ""
        lines.append(f"#   {node.id} [{node.stage}]{parents}: {node.message}")
    return lines


def export_text(store: RunStore, meta: CandidateMeta, when: datetime | None = None) -> str:
    """The exported file's text: preamble, header, then the rest of the source verbatim."""
    preamble, body = split_preamble(store.source(meta.id))
    return preamble + "\n".join(header(store, meta, when)) + "\n\n" + body


def export(store: RunStore, candidate_id: str, out: Path, *, force: bool = False) -> str:
    """Check and write ``out``; returns the text written. ExportError (nothing written) when the
    file exists without ``force``, the text fails the sandbox, or ``out`` cannot be written."""
    meta = store.get(candidate_id)
    if out.is_dir():
        raise ExportError(f"--out {out} is a directory")
    if out.exists() and not force:
        raise ExportError(f"{out} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        raise ExportError(f"cannot write {out}: folder {out.parent} does not exist")
    try:
        text = export_text(store, meta)
    except ConfigError as exc:
        raise ExportError(str(exc)) from None
    check_program(text, str(out)).require(
        lambda why: ExportError(f"{store.run_id}/{meta.id} does not pass the sandbox: {why}")
    )
    try:  # 0644: an exported program is meant to be shared
        write_atomic(out, text.encode("utf-8"), mode=0o644)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror}") from None
    return text


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
