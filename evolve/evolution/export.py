"""Exporting a candidate as a standalone program file.

Owns the format of an exported program file and :class:`ExportError`; freezing a candidate (its
one look at the test split) is :mod:`.freeze`, which needs the evaluation engine that this
module does not load.

Invariants:

- **An export is the candidate plus comments.** The file is the candidate's source byte for byte
  with a block of ``#`` lines inserted after any shebang / encoding line, so its AST — hence its
  stage-cache fingerprints and cached stage outputs — equals the candidate's, and removing the
  header block (and the blank line after it) gives back the source whose sha256 it records.
  It must pass the sandbox check before anything is written; an existing file is replaced only
  when asked, atomically.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from contract.spec import CONTRACT_VERSION
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.summary import ancestry, fitness_mode, scores, transfer, transfer_lines
from evolve.files import write_atomic
from sandbox.check import check_program

TEST_SPLIT = "test"
HEADER_MARK = "# PrisMem export"
_CODING = re.compile(r"[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")  # a PEP 263 encoding line


class ExportError(Exception):
    """A candidate cannot be exported; the message is one line for the user."""


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
    text = export_text(store, meta)
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
