"""A store's upkeep: forgetting a session or a whole scope, and finding and repairing damage.

Owns :func:`forget_session`, :func:`forget_scope` (what :meth:`.api.AgentMemory.forget` and
``evolve store forget`` do to a scope's files), :func:`examine` (``evolve store verify``) and
:func:`repair` (``evolve store repair``). The caller holds what keeps other writers out: the
scope's write lock in a runtime (:mod:`.scopes`), the store's lock otherwise
(:func:`.store.hold`); :func:`examine` reads only, beside a runtime too.

Invariants:

- **Forgotten means gone from every file.** Forgetting a session removes, from the scope's
  folder, everything that can hold its text or what was computed from it: the snapshots that
  hold it (those of any build after its log position), the caches (:data:`.store.CACHES` with
  their ``-wal``, ``-shm`` and ``-journal`` files and any damaged copy set aside; SQLite keeps
  deleted rows in free pages and journals, so the files go, not rows), temporary files and
  damaged logs set aside by :func:`repair`; then the log is rewritten without it
  (:func:`.log.rewrite`). Forgetting a scope removes its folder. The store-wide call log holds
  no text (:mod:`.store`). Other scopes' folders are not touched.
- **A crash leaves the old state or the new one.** What is removed first is only ever a
  shortcut or a cache (the log is the truth), and the folder is fsync'd before the log is
  replaced in one rename: a crash before the rename leaves every session, one after it every
  session but the forgotten one; never a snapshot holding the forgotten session beside a log
  without it. A scope is first renamed out of ``scopes/`` in one step (``<store>/.tmp-forget-*``,
  removed then, or by the next open of the store if the process died): it is whole or gone.
- **Repair salvages every whole record.** :func:`repair` keeps every session of a damaged log
  that :func:`.log.salvage` reads (before and after the damage), moves the damaged file aside
  as ``log.damaged-<time>`` (a hard link made before the repaired log replaces it, so a crash
  leaves the damaged log in place or the repaired one), removes every snapshot of the scope
  first (they count sessions by log position; the memory is rebuilt from the log) and reports
  each lost byte range. A scope whose log is whole keeps its log; snapshots that fail the
  check of :func:`examine` are removed.
- **A snapshot is checked without being loaded**: its pickle opcodes must parse to the ``STOP``
  at its last byte (:mod:`pickletools`; nothing is unpickled outside a confined host). A
  changed byte inside a value passes this check; the runtime rebuilds a memory from the log
  when the program cannot restore its snapshot.
"""

from __future__ import annotations

import os
import pickletools
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from evolve.files import fsync_dir
from evolve.models import close_connections
from evolve.runtime.log import Lost, Salvaged, SessionLog, rewrite, salvage
from evolve.runtime.store import CACHES, LOG, scope_logs, snapshot_files

DAMAGED = "log.damaged-"  # a damaged log repair moved aside: log.damaged-<time>


@dataclass(frozen=True)
class ScopeReport:
    """One scope as :func:`examine` found it: its folder's name, what its log holds (None: no
    log), the snapshots that fail the check (name, why) and the damaged logs set aside."""

    key: str
    log: Salvaged | None
    bad_snapshots: list[tuple[str, str]] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)
    unreadable: str | None = None

    @property
    def damaged(self) -> bool:
        return bool(
            self.unreadable or self.bad_snapshots or (self.log is not None and self.log.damaged)
        )


@dataclass(frozen=True)
class Repaired:
    """What :func:`repair` did to one damaged scope."""

    key: str
    kept: int  # sessions in the repaired log
    lost: list[Lost]  # byte ranges of the damaged log that held no whole record
    moved_to: str | None  # the damaged log's new name, when the log was repaired
    snapshots_removed: list[str]


def _close_caches(folder: Path) -> None:
    """Close this process's idle connections to the scope's cache files, so none writes to a
    removed file or brings one back (the caller holds the scope's write lock: none is lent)."""
    for name in CACHES:
        for path in {folder / name, (folder / name).resolve()}:
            close_connections(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def forget_session(folder: Path, session_id: str) -> int:
    """Forget one session of the scope in ``folder`` (see the module's invariants); the
    sessions forgotten (0: the log has no such session, and nothing is changed)."""
    path = folder / LOG
    if not path.exists():
        return 0
    log, _ = SessionLog.open(path)
    position = log.position(session_id)
    if position is None:
        return 0
    _close_caches(folder)
    doomed = [p for n, p in snapshot_files(folder) if n > position]
    for name in CACHES:
        doomed += [folder / f"{name}{end}" for end in ("", "-wal", "-shm", "-journal")]
        doomed += folder.glob(f"{name}.corrupt-*")
    doomed += [*folder.glob(".tmp-*"), *folder.glob(f"{DAMAGED}*")]
    for stale in doomed:
        _remove(stale)
    fsync_dir(folder)  # every removal is on disk before the log changes
    rewrite(path, [s for s in log.sessions if s.session_id != session_id])
    return 1


def forget_scope(root: Path, folder: Path) -> int:
    """Forget the whole scope in ``folder`` (under ``root``'s ``scopes/``): its folder is
    removed; the sessions its log held (what can be read of a damaged one)."""
    if not folder.exists():
        return 0
    _close_caches(folder)
    try:
        held = len(salvage((folder / LOG).read_bytes()).sessions)
    except OSError:
        held = 0
    trash = root / f".tmp-forget-{folder.name}-{uuid.uuid4().hex[:8]}"
    os.rename(folder, trash)
    fsync_dir(folder.parent)
    fsync_dir(root)
    shutil.rmtree(trash)
    fsync_dir(root)
    return held


def _snapshot_problem(path: Path) -> str | None:
    """Why the snapshot at ``path`` fails the check of the module's invariants, or None."""
    try:
        data = path.read_bytes()
        last = None
        for op, _, pos in pickletools.genops(data):
            last = (op.name, pos)
    except Exception as exc:  # damaged bytes fail in any way the opcode walk can
        return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:200]
    if last is None or last != ("STOP", len(data) - 1):
        return "its pickle does not end at its last byte"
    return None


def examine(root: Path) -> list[ScopeReport]:
    """Each scope of the store at ``root``, by folder name, read only."""
    reports = []
    for key, path in scope_logs(root):
        folder = path.parent
        bad = [(p.name, why) for _, p in snapshot_files(folder)
               if (why := _snapshot_problem(p)) is not None]  # fmt: skip
        aside = sorted(p.name for p in folder.glob(f"{DAMAGED}*"))
        try:
            found = salvage(path.read_bytes()) if path.exists() else None
        except OSError as exc:
            reports.append(ScopeReport(key, None, bad, aside, exc.strerror or str(exc)))
            continue
        reports.append(ScopeReport(key, found, bad, aside))
    return reports


def repair(root: Path, report: ScopeReport) -> Repaired:
    """Repair the scope ``report`` found damaged (see the module's invariants); the caller
    holds the store's lock."""
    folder = root / "scopes" / report.key
    found = report.log
    if found is None or not found.damaged:  # the log is whole: only bad snapshots go
        names = [name for name, _ in report.bad_snapshots]
        for name in names:
            (folder / name).unlink(missing_ok=True)
        return Repaired(report.key, len(found.sessions) if found else 0, [], None, names)
    path = folder / LOG
    found = salvage(path.read_bytes())  # as it is now, under the lock
    removed = [p.name for _, p in snapshot_files(folder)]
    for name in removed:
        (folder / name).unlink(missing_ok=True)
    fsync_dir(folder)  # no snapshot counts positions of the damaged log past this point
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = folder / f"{DAMAGED}{stamp}", 1
    while aside.exists():
        n += 1
        aside = folder / f"{DAMAGED}{stamp}-{n}"
    os.link(path, aside)
    kept, seen = [], set()
    for session in found.sessions:  # a session id once, as the log holds it
        if session.session_id not in seen:
            seen.add(session.session_id)
            kept.append(session)
    rewrite(path, kept)
    return Repaired(report.key, len(kept), found.lost, aside.name, removed)
