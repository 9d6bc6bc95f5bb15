"""The run store: one folder per evolution run holding every candidate program and its story.

Owns the on-disk layout of a run, ``<runs_dir>/<run-id>/``::

    manifest.json          what the run started with (scrubbed) plus ``run_id`` and ``created``
    state.json             the loop's cursor (stage, round, best ids, specialists, spend)
    candidates/<id>.py     a candidate's source, verbatim (ids look like ``c0007-1a2b3c4d``)
    candidates/<id>.json   its :class:`CandidateMeta`
    candidates/<id>.<split>.jsonl.gz   its per-question traces on a split (train), for diagnosis
    claims/c<NNNN>         empty; created with O_EXCL to reserve candidate number NNNN
    run.lock               held (flock) by the one process evolving the run; holds its PID
    index.sqlite           the event log (:mod:`evolve.evolution.eventlog`)

Invariants:

- Only this module knows the layout: other code asks for :meth:`RunStore.source_path` and
  :meth:`RunStore.traces_path`.
- Every file write is atomic and durable (:func:`evolve.files.write_atomic`: a temporary
  ``.tmp-*`` file in the same folder, fsync, ``os.replace``, fsync of the folder). Readers see
  the old file or the new one, never a torn one. A crash may leave a ``.tmp-*`` file or a
  ``.py`` without its ``.json``; neither is ever read as a candidate.
- A candidate exists iff its ``.json`` exists. :meth:`RunStore.add_candidate` writes the ``.py``,
  then the ``.json``, both before it returns.
- The files are the truth and every read of a candidate goes to them. Events live only in
  the event log, and a resume reads them (a round's own children are found by their
  ``proposed`` events): losing ``index.sqlite`` loses the event log, never a candidate or the
  state, but a resume then cannot tell an interrupted round's children from earlier
  candidates. A damaged index is set aside when the run is opened, before any work on it.
- Damaged files never take a run down: each is reported, never fatal. A candidate is read only
  if its ``.json`` validates and names itself, and its ``.py`` is there with the recorded sha256
  (the rules of :mod:`evolve.evolution.candidate`: a record's fields match its checksum);
  a damaged record whose ``.py`` is intact is rebuilt by the process holding the run's lock,
  as a ``proposed`` candidate marked ``recovered`` that the loop scores again; otherwise
  :meth:`RunStore.candidates` skips it, reporting the file in one line
  (:func:`evolve.models.damaged`), and :meth:`RunStore.get` / :meth:`RunStore.source` raise
  :class:`DamagedFile` naming it. Adding the source of a candidate
  whose ``.py`` was lost restores the file. A damaged ``state.json`` is reported and its round
  counters are rebuilt from the event log (:meth:`RunStore.finished_rounds`), said in one line;
  a ``state.json`` whose fields have the wrong types is damaged too (:mod:`.runstate`). A
  damaged manifest keeps the run from opening, with the file named.
- Candidate ids never repeat. The number starts at the count of ``.json`` files and is reserved
  by exclusively creating its claim file, so two writers cannot take the same number; a crash
  after the claim leaves a gap in the numbering, never a reused number.
- One process evolves a run at a time: :meth:`RunStore.lock` takes an exclusive ``flock`` on
  ``run.lock`` for the process's life (the kernel releases it when the process dies, ``kill
  -9`` included, so it is never left stuck) or raises :class:`RunLocked` naming the holder.
  Readers (status, report, export) take no lock.
- Adding a source already in the run (same sha256) returns the existing candidate; two
  writers adding the same new source at the same moment may both succeed.
- No secrets on disk: the manifest, every metadata write (its records as plain JSON) and
  every event go through :func:`scrub_secrets`. Sources are stored verbatim; ``state.json``
  is written as given (JSON).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from evolve.evolution.candidate import STATUSES as STATUSES  # re-exported
from evolve.evolution.candidate import (
    CandidateMeta,
    DamagedFile,
    read_meta,
    sealed,
    source_problem,
)
from evolve.evolution.eventlog import EventLog
from evolve.evolution.runstate import finished_rounds, state_problem
from evolve.files import write_atomic
from evolve.models import damaged, why
from evolve.scrub import REDACTED as REDACTED  # re-exported
from evolve.scrub import scrub_secrets
from evolve.trace import QuestionTrace, read_trace

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_META_FILE = re.compile(r"c(\d{4,})-[0-9a-f]{8}\.json")
_CREATE_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY
_IMMUTABLE = frozenset({"id", "number", "source_sha256"})


class RunNotFound(Exception):
    """No run with that id (or its folder has no readable manifest)."""


class RunLocked(Exception):
    """Another live process holds the run's lock; the message names it."""


class CandidateNotFound(LookupError):
    """No candidate matches an id or prefix, or a prefix matches several."""


# --- files --------------------------------------------------------------------------------


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8")


class RunStore:
    """One run's folder. Create with :meth:`create`, reopen with :meth:`open`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.run_id = self.root.name
        self._candidates = self.root / "candidates"
        self._claims = self.root / "claims"
        self._log = EventLog(self.root / "index.sqlite")
        self._lock_fd: int | None = None  # the run's lock, while this process holds it

    # --- runs ---

    @classmethod
    def create(
        cls, runs_dir: Path, manifest: dict[str, Any], run_id: str | None = None
    ) -> RunStore:
        """A new, empty run. Default id: ``YYYYmmdd-HHMMSS-<4 hex>``; an existing folder is
        refused (FileExistsError). The manifest is written last, so a run without one is
        incomplete and ignored."""
        run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
        if not _RUN_ID.fullmatch(run_id):
            raise ValueError(f"invalid run id {run_id!r}: use letters, digits, '.', '_', '-'")
        root = Path(runs_dir) / run_id
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir()
        except FileExistsError:
            raise FileExistsError(f"run {run_id!r} already exists in {runs_dir}") from None
        store = cls(root)
        store._candidates.mkdir()
        store._claims.mkdir()
        store._log.transact(lambda _conn: None)
        body = {**scrub_secrets(manifest), "run_id": run_id, "created": time.time()}
        write_atomic(root / "manifest.json", _dump(body))
        return store

    def lock(self) -> None:
        """Hold the run's lock until :meth:`unlock` or the end of this process, or raise
        :class:`RunLocked` naming the process that holds it. Idempotent."""
        if self._lock_fd is not None:
            return
        path = self.root / "run.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunLocked(
                f"run {self.run_id} is being evolved by process {holder} (its run.lock is held);"
                " wait for it to finish or stop it, then resume"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release the run's lock (a process that evolves several runs in turn); idempotent."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file releases the flock

    @classmethod
    def open(cls, runs_dir: Path, run_id: str) -> RunStore:
        """An existing run; a damaged index is set aside here, before any work on the run."""
        root = Path(runs_dir) / run_id
        if not _RUN_ID.fullmatch(run_id) or not root.is_dir():
            raise RunNotFound(f"run {run_id!r} not found in {runs_dir}")
        store = cls(root)
        path = root / "manifest.json"
        if not path.exists() and (root / "report.json").exists():
            raise RunNotFound(f"{run_id} in {runs_dir} is an evaluation folder (evolve eval), "
                              "not an evolution run")  # fmt: skip
        try:
            if not isinstance(store.manifest, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            raise RunNotFound(f"run {run_id!r} in {runs_dir} has no manifest.json") from None
        except (OSError, ValueError) as exc:
            raise RunNotFound(f"run {run_id!r}: manifest {path} is damaged ({why(exc)})") from None
        store._log.transact(lambda _conn: None)  # a damaged index is set aside now
        return store

    @staticmethod
    def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
        """Every run under ``runs_dir``, newest first: ``id``, ``created``, ``candidates`` (count)
        and ``best`` (the state's ``"best"``). Files (``programs/README.md``) and folders
        without a manifest (an ``evolve eval`` folder, say) are skipped; a run whose manifest is
        damaged is skipped and reported."""
        runs: list[dict[str, Any]] = []
        for root in sorted(Path(runs_dir).iterdir()) if Path(runs_dir).is_dir() else []:
            if not root.is_dir():
                continue
            store = RunStore(root)
            try:
                created = store.manifest.get("created")
                count = len(store._meta_paths())
                best = store.load_state().get("best")
            except FileNotFoundError:
                continue
            except (OSError, ValueError, AttributeError) as exc:
                damaged(f"run folder {root} is damaged ({why(exc)}): not listed")
                continue
            runs.append({"id": root.name, "created": created, "candidates": count, "best": best})
        return sorted(runs, key=lambda r: float(r["created"] or 0), reverse=True)

    @property
    def manifest(self) -> dict[str, Any]:
        manifest: dict[str, Any] = json.loads((self.root / "manifest.json").read_bytes())
        return manifest

    # --- candidates ---

    def add_candidate(
        self, source: str, *, parents: list[str], stage: str, capability: str | None, message: str
    ) -> CandidateMeta:
        """Store a new candidate (status ``proposed``) and return its metadata; its files are
        written before it returns. If the run already holds this exact source
        (same sha256), the existing candidate's metadata is returned and nothing is written.
        Parents may be given by unique prefix; they are stored as full ids."""
        data = source.encode("utf-8")
        sha = hashlib.sha256(data).hexdigest()
        for path in self._candidates.glob(f"c*-{sha[:8]}.json"):
            try:
                existing = read_meta(path)
            except DamagedFile:
                continue  # its record is lost: this source becomes a new candidate
            if existing.source_sha256 == sha:
                problem = source_problem(path.with_suffix(".py"), existing)
                if problem:
                    write_atomic(path.with_suffix(".py"), data)
                    damaged(f"{problem}: restored from the identical source")
                return existing
        fields = dict(stage=stage, capability=capability, message=message, source_sha256=sha)
        draft = CandidateMeta.model_validate(  # validated before a number is taken
            scrub_secrets(fields)
            | dict(id="", number=-1, parents=[self._resolve(p) for p in parents])
            | dict(status="proposed", sandbox=None, scores={}, usage={}, seconds=0.0)
            | dict(created=time.time())
        )
        number = self._claim_number()
        meta = draft.model_copy(update={"id": f"c{number:04d}-{sha[:8]}", "number": number})
        write_atomic(self._candidates / f"{meta.id}.py", data)
        return self._write_meta(meta)

    def update(self, candidate_id: str, **fields: Any) -> CandidateMeta:
        """Change some fields (validated; ``id``, ``number`` and ``source_sha256`` are fixed);
        a field may be given as records (score blocks) or as their JSON."""
        fixed = _IMMUTABLE & fields.keys()
        if fixed:
            raise ValueError(f"cannot change {', '.join(sorted(fixed))} of a candidate")
        old = self.get(candidate_id)
        changed = to_jsonable_python(fields)
        meta = CandidateMeta.model_validate(scrub_secrets({**old.model_dump(), **changed}))
        return self._write_meta(meta)

    def get(self, candidate_id: str) -> CandidateMeta:
        """A candidate by id or unique prefix (``"c0007"``); CandidateNotFound otherwise,
        DamagedFile if its ``.json`` does not load."""
        return read_meta(self._meta_path(candidate_id))

    def source(self, candidate_id: str) -> str:
        """The candidate's source, byte for byte as added; DamagedFile if the ``.py`` is
        missing or not the recorded source."""
        meta = self.get(candidate_id)
        problem = source_problem(self._candidates / f"{meta.id}.py", meta)
        if problem:
            raise DamagedFile(problem)
        return self.source_path(meta.id).read_bytes().decode()

    def source_path(self, candidate_id: str) -> Path:
        """The file holding a candidate's source (by id or unique prefix)."""
        return self._meta_path(candidate_id).with_suffix(".py")

    def traces_path(self, candidate_id: str, split: str) -> Path:
        """The file holding a candidate's traces on ``split`` (by id or unique prefix)."""
        return self._meta_path(candidate_id).with_suffix(f".{split}.jsonl.gz")

    def write_traces(self, candidate_id: str, split: str, traces: list[QuestionTrace]) -> None:
        """Store a candidate's per-question traces on ``split`` (gzipped JSON lines)."""
        lines = "".join(t.to_json() + "\n" for t in traces)
        path = self.traces_path(candidate_id, split)
        write_atomic(path, gzip.compress(lines.encode("utf-8"), mtime=0))

    def traces(self, candidate_id: str, split: str) -> list[QuestionTrace]:
        """The traces stored by :meth:`write_traces`; ``[]`` when there are none."""
        path = self.traces_path(candidate_id, split)
        try:
            text = gzip.decompress(path.read_bytes()).decode("utf-8")
        except FileNotFoundError:
            return []
        return [read_trace(line) for line in text.splitlines()]

    def candidates(self) -> list[CandidateMeta]:
        """Every readable candidate, in creation order; a damaged one is skipped and reported."""
        kept, problems = self._scan()
        for problem in problems:
            damaged(f"{problem}: candidate skipped")
        return kept

    def damage(self) -> list[str]:
        """One line per damaged file of the run (candidates and state); [] when it is sound."""
        problems = self._scan()[1]
        state = self._read_state()[1]
        return problems + ([f"run state {self.root / 'state.json'} is damaged ({state})"]
                           if state else [])  # fmt: skip

    # --- events and state ---

    def log_event(self, kind: str, **data: Any) -> None:
        """Append an event to the run's log (:meth:`EventLog.log`)."""
        self._log.log(kind, **data)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The run's events in logging order, optionally of one kind (:meth:`EventLog.events`)."""
        return self._log.events(kind)

    def load_state(self, children: int | None = None) -> dict[str, Any]:
        """The loop's saved cursor, ``{}`` before the first :meth:`save_state`. A damaged one
        (unreadable, or a field of the wrong type: :func:`state_problem`) is reported in one
        line saying what was rebuilt: the rounds finished, per stage, from the event log
        (:meth:`finished_rounds`; ``children``: the run's children per round, else read off the
        log), no round costs, best unknown; without an event log no round counts as finished,
        so every round is replayed (judged children are not evaluated again)."""
        state, problem = self._read_state()
        if problem is None:
            return state
        rounds = self.finished_rounds(children)
        what = ", ".join(f"{stage} {n}" for stage, n in rounds.items()) or "none finished"
        source = "the event log" if self.events("proposed") or self.events("proposal_failed") \
            else "nothing (no event log: every round is run again)"  # fmt: skip
        damaged(f"run state {self.root / 'state.json'} is damaged ({problem}): round counters "
                f"rebuilt from {source}: {what}; round costs and best recomputed")  # fmt: skip
        return {"rounds": rounds, "best": None, "round_costs": []}

    def finished_rounds(self, children: int | None = None) -> dict[str, int]:
        """Rounds finished per stage, read off the event log (:func:`finished_rounds`)."""
        events = self.events("proposed") + self.events("proposal_failed")
        status = {c.id: c.status for c in self.candidates()}
        return finished_rounds(events, status, children)

    def save_state(self, state: dict[str, Any]) -> None:
        """Replace ``state.json`` atomically; TypeError if ``state`` is not JSON."""
        write_atomic(self.root / "state.json", _dump(state))

    # --- internals ---

    def _meta_paths(self) -> list[Path]:
        """The candidates' ``.json`` files in number order (temporary files never match)."""
        found = [(_META_FILE.fullmatch(p.name), p) for p in self._candidates.iterdir()]
        return [p for m, p in sorted((int(m[1]), p) for m, p in found if m)]

    def _resolve(self, candidate_id: str) -> str:
        path = self._candidates / f"{candidate_id}.json"
        if _META_FILE.fullmatch(path.name) and path.is_file():
            return candidate_id
        ids = [p.name[:-5] for p in self._meta_paths()]
        matches = [i for i in ids if candidate_id and i.startswith(candidate_id)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise CandidateNotFound(f"no candidate {candidate_id!r} in run {self.run_id}")
        more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
        shown = ", ".join(matches[:5]) + more
        raise CandidateNotFound(
            f"candidate {candidate_id!r} is ambiguous in run {self.run_id}: {shown}"
        )

    def _meta_path(self, candidate_id: str) -> Path:
        return self._candidates / f"{self._resolve(candidate_id)}.json"

    def _claim_number(self) -> int:
        number = len(self._meta_paths())
        self._claims.mkdir(exist_ok=True)
        while True:
            try:
                os.close(os.open(self._claims / f"c{number:04d}", _CREATE_NEW))
                if not any(self._candidates.glob(f"c{number:04d}-*.json")):  # claims/ was lost
                    return number
            except FileExistsError:
                pass  # taken by another writer, or by one that crashed: a gap, never a reuse
            number += 1

    def _write_meta(self, meta: CandidateMeta) -> CandidateMeta:
        """Write ``meta`` with its checksum; returns it as written."""
        meta = sealed(meta)
        write_atomic(self._candidates / f"{meta.id}.json", meta.model_dump_json(indent=2).encode())
        return meta

    def _scan(self) -> tuple[list[CandidateMeta], list[str]]:
        """The readable candidates and one line per damaged one."""
        kept: list[CandidateMeta] = []
        problems: list[str] = []
        for path in self._meta_paths():
            try:
                meta = read_meta(path)
            except DamagedFile as exc:
                recovered = self._recover(path, str(exc))
                if recovered is None:
                    problems.append(str(exc))
                else:
                    kept.append(recovered)
                continue
            problem = source_problem(self._candidates / f"{meta.id}.py", meta)
            if problem:
                problems.append(problem)
            else:
                kept.append(meta)
        return kept, problems

    def _recover(self, path: Path, problem: str) -> CandidateMeta | None:
        """A candidate whose record is damaged but whose ``.py`` is intact (its sha256 starts
        with the id's 8 hex), rebuilt as ``proposed`` and ``recovered`` — so the loop scores it
        again — with the stage its ``proposed`` event names; only by the process that holds the
        run's lock (readers write nothing). None when it cannot be rebuilt."""
        match = _META_FILE.fullmatch(path.name)
        source = path.with_suffix(".py")
        if self._lock_fd is None or match is None:
            return None
        try:
            data = source.read_bytes()
        except OSError:
            return None
        sha = hashlib.sha256(data).hexdigest()
        if not path.stem.endswith(f"-{sha[:8]}"):
            return None
        stage = "seed" if int(match[1]) == 0 else "cold_start"
        for event in self.events("proposed"):
            if event["data"].get("candidate") == path.stem and event["data"].get("stage"):
                stage = str(event["data"]["stage"])
                break
        try:
            meta = CandidateMeta.model_validate(
                dict(id=path.stem, number=int(match[1]), parents=[], stage=stage,
                     capability=None, message=f"recovered from {source.name}",
                     source_sha256=sha, status="proposed", sandbox=None, scores={}, usage={},
                     seconds=0.0, created=source.stat().st_mtime, recovered=True)
            )  # fmt: skip
        except ValueError:
            return None
        meta = self._write_meta(meta)
        damaged(f"{problem}: rebuilt from its intact source {source.name}, to be scored again")
        return meta

    def _read_state(self) -> tuple[dict[str, Any], str | None]:
        """``state.json`` (``{}`` when absent) and None, or ``{}`` and why it does not load."""
        try:
            state = json.loads((self.root / "state.json").read_bytes())
        except FileNotFoundError:
            return {}, None
        except (OSError, ValueError) as exc:
            return {}, why(exc)
        problem = state_problem(state)
        return (state, None) if problem is None else ({}, problem)
