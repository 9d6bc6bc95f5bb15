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
  (:func:`evolve.evaluation.conversation.pipeline_version`) of the installation that exports it,
  which are
  those its scores came from when the run was scored there (the step cache keys every output
  on them). :func:`read_scored_as` parses that block back (:class:`ScoredAs`), reading the
  ``evaluator version`` line older exports wrote as the pipeline version; the runtime compares
  it with what it runs (:mod:`evolve.runtime`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from contract.spec import CONTRACT_VERSION
from evolve.config import ConfigError, stored_config
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.summary import ancestry, fitness_mode, scores, transfer, transfer_lines
from evolve.files import write_atomic
from evolve.models.embed import precision
from sandbox.check import check_program

TEST_SPLIT = "test"
HEADER_MARK = "# PrisMem export"
_CODING = re.compile(r"[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")  # a PEP 263 encoding line


OFFLINE = "offline"
ONLINE = "task model"
OFFLINE_MEANS = "one unit per message, the question as the query, the instructions never run"
SCORED_AS = "# scored as: "
_SCORED_FIELDS = {"task model": "task_model", "embedder": "embedder", "precision": "precision",
                  "pipeline version": "pipeline_version"}  # fmt: skip
_OLD_NAMES = {"evaluator version": "pipeline version"}  # what exports before the rename wrote


class ExportError(Exception):
    """A candidate cannot be exported; the message is one line for the user."""


@dataclass(frozen=True)
class ScoredAs:
    """How a program was scored: what a deployment must match to behave as scored."""

    mode: str  # OFFLINE or ONLINE
    task_model: str | None  # the litellm id; None offline
    embedder: str  # "minilm" or "hashing"
    precision: str  # the embedding precision (evolve.models.embed.precision)
    pipeline_version: str

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


def scored_as(store: RunStore) -> ScoredAs:
    """How the run's candidates were scored: its config's task model and embedder, with this
    installation's precision and pipeline version."""
    from evolve.evaluation.conversation import (
        pipeline_version,  # the engine: loaded only when exporting
    )

    config = stored_config(store.manifest, store.run_id)
    model = config.task_model.model if config.task_model else None
    return ScoredAs(OFFLINE if model is None else ONLINE, model, config.embedder, precision(),
                    pipeline_version())  # fmt: skip


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


# --- export -------------------------------------------------------------------------------


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
        f"# scores (fitness: {fitness_mode(store.manifest)['name']}):",
    ]
    for split in ("valid", "train", TEST_SPLIT):
        s = scores(meta.scores.get(split, {}).get("overall"))
        if s["fitness"] is None:
            text = "not frozen" if split == TEST_SPLIT else "not scored"
        else:
            text = f"fitness {s['fitness']:.4f}, similarity {_num(s['similarity'])}, "
            text += f"hit rate {_num(s['hit_rate'])}"
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
    report = check_program(text, str(out))
    if not report.passed:
        raise ExportError(f"{store.run_id}/{meta.id} does not pass the sandbox: "
                        f"{report.repair_text()}")  # fmt: skip
    try:  # 0644: an exported program is meant to be shared
        write_atomic(out, text.encode("utf-8"), mode=0o644)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror}") from None
    return text


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
