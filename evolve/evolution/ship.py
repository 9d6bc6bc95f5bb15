"""Shipping a candidate: freezing it (its one look at the test split) and exporting it.

Owns the test split's only reader and the format of an exported program file.

Invariants:

- **Test is read here and nowhere else.** :func:`freeze` is the only code that loads the test
  split for a run; the loop selects on valid and never sees test. A candidate is scored on test
  at most once: its test block and ``frozen=True`` are written together in one metadata write
  (with a ``frozen`` event), and freezing a frozen candidate returns the stored block without
  evaluating anything. Only an ``evaluated`` candidate can be frozen. Freezing a second
  candidate of the same run is allowed, but :class:`Frozen` names the others so the caller can
  warn that comparing several test scores is selection on test.
- **A test score is complete or absent.** If any test question fails (a program error, or a
  host killed for time on an overloaded machine), nothing is recorded and the candidate is not
  frozen: a partial score would describe the machine, not the program. Traces are written to
  ``freeze-<id>/`` either way, and the stage cache keeps what was computed.
- **The test tasks match the run's.** Same restriction to the first ``conversations``
  conversations as the loop's (:func:`evolve.evolution.loop.task_set`), the run's embedder,
  cache and task model unless the caller overrides them; the block has the shape of train/valid
  (``overall``, ``by_capability``, ``errors``). The ``frozen`` event records the sha256 of every
  test data file read, as the manifest does for train and valid.
- **An export is the candidate plus comments.** The file is the candidate's source byte for byte
  with a block of ``#`` lines inserted after any shebang / encoding line, so its AST — hence its
  stage-cache fingerprints and cached stage outputs — equals the candidate's, and removing the
  header block (and the blank line after it) gives back the source whose sha256 it records.
  It must pass the sandbox check before anything is written; an existing file is replaced only
  when asked, atomically.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evolve.distributed import make_backend
from evolve.evolution.archive import fitness
from evolve.evolution.budget import calls_path
from evolve.evolution.loop import RunConfig, task_set
from evolve.evolution.manifest import data_hashes
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.summary import ancestry, scores
from evolve.executor import EvalError, evaluate, write_run
from evolve.models.llm import ModelConfig
from evolve.program import CONTRACT_VERSION
from evolve.trace import first_error
from evolve.worker import WorkerConfig
from sandbox.check import check_program

TEST_SPLIT = "test"
HEADER_MARK = "# PrisMem export"
_CODING = re.compile(r"[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")  # a PEP 263 encoding line


class ShipError(Exception):
    """A candidate cannot be frozen or exported; the message is one line for the user."""


def candidate_path(store: RunStore, meta: CandidateMeta) -> Path:
    """The candidate's source file in the run folder (the layout of :mod:`.store`)."""
    return store.root / "candidates" / f"{meta.id}.py"


# --- freeze -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frozen:
    """The outcome of :func:`freeze`: the candidate as stored now, whether this call scored it,
    and the run's other frozen candidates."""

    meta: CandidateMeta
    scored: bool
    others: list[str]

    @property
    def test(self) -> dict[str, Any]:
        return self.meta.scores[TEST_SPLIT]


Progress = Callable[[int], AbstractContextManager[Callable[[int], None]]]
"""Given the number of questions, a context manager yielding ``advance(n)`` (a progress bar)."""


def freeze(
    store: RunStore,
    candidate_id: str,
    *,
    data_dir: Path | None = None,
    cache_dir: str | None = None,
    embedder: str | None = None,
    jobs: int | None = None,
    progress: Progress | None = None,
) -> Frozen:
    """Mark a candidate final and score it once on test; see the module's invariants. Every
    keyword defaults to the run config's value."""
    meta = store.get(candidate_id)
    others = [c.id for c in store.candidates() if c.frozen and c.id != meta.id]
    if meta.frozen and TEST_SPLIT in meta.scores:
        return Frozen(meta, False, others)
    if meta.status != "evaluated":
        raise ShipError(
            f"only an evaluated candidate can be frozen; {store.run_id}/{meta.id} is {meta.status}"
        )
    try:
        config = RunConfig(**store.manifest["config"])
    except (KeyError, TypeError) as exc:
        raise ShipError(f"run {store.run_id} has no usable config in its manifest: {exc}") from None
    root = Path(data_dir or config.data_dir)
    if not root.is_dir():
        raise ShipError(f"data directory {root} does not exist; pass --data-dir")
    worker = WorkerConfig(
        cache_dir=cache_dir or config.cache_dir,
        task_model=ModelConfig(**config.task_model) if config.task_model else None,
        embedder=embedder or config.embedder,
        stage_label="freeze",
        calls_log=str(calls_path(store.root)),  # test-split LLM calls count in the run's spend
    )
    config = dataclasses.replace(config, data_dir=str(root))
    tasks = task_set(config, TEST_SPLIT)
    with progress(len(tasks.questions)) if progress else nullcontext(None) as advance:
        try:
            report = evaluate(
                candidate_path(store, meta),
                tasks,
                worker,
                on_progress=advance,
                backend=make_backend(config.backend, jobs or config.jobs, config.ray_address),
            )
        except EvalError as exc:
            raise ShipError(str(exc)) from None
    write_run(report, store.root / f"freeze-{meta.id}")  # traces, kept even when refused
    if report.meta["errors"]:
        first = first_error(report.traces)
        raise ShipError(
            f"{report.meta['errors']} of {report.meta['questions']} test questions failed "
            f"(first: {first[:200]}); no test score was recorded — stages computed so far are "
            f"cached, so freeze again (traces in {store.root / f'freeze-{meta.id}'})"
        )
    block = {
        "overall": report.scores["overall"],
        "by_capability": report.scores["by_capability"],
        "errors": report.meta["errors"],
    }
    meta = store.update(meta.id, frozen=True, scores={**meta.scores, TEST_SPLIT: block})
    store.log_event(
        "frozen",
        candidate=meta.id,
        test=fitness(block["overall"]),
        conversations=len(tasks.conversations),
        questions=len(tasks.questions),
        embedder=worker.embedder,
        data=data_hashes(config, TEST_SPLIT),
        others=others,
    )
    return Frozen(meta, True, others)


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
        "# scores (fitness = mean of evidence similarity and hit rate):",
    ]
    for split in ("valid", "train", TEST_SPLIT):
        s = scores(meta.scores.get(split, {}).get("overall"))
        if s["fitness"] is None:
            text = "not frozen" if split == TEST_SPLIT else "not scored"
        else:
            text = f"fitness {s['fitness']:.4f}, similarity {_num(s['similarity'])}, "
            text += f"hit rate {_num(s['hit_rate'])}"
        lines.append(f"#   {split}: {text}")
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
    """Check and write ``out``; returns the text written. ShipError (nothing written) when the
    file exists without ``force``, the text fails the sandbox, or ``out`` cannot be written."""
    meta = store.get(candidate_id)
    if out.is_dir():
        raise ShipError(f"--out {out} is a directory")
    if out.exists() and not force:
        raise ShipError(f"{out} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        raise ShipError(f"cannot write {out}: folder {out.parent} does not exist")
    text = export_text(store, meta)
    report = check_program(text, str(out))
    if not report.passed:
        raise ShipError(f"{store.run_id}/{meta.id} does not pass the sandbox: "
                        f"{report.repair_text()}")  # fmt: skip
    try:
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as exc:
        raise ShipError(f"cannot write {out}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; an exported program is meant to be shared
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ShipError(f"cannot write {out}: {exc.strerror}") from None
    return text


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
