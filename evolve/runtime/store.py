"""The memory store, the folder a user owns: which programs ran over it, each scope's log,
snapshots and caches.

Owns the folder's layout, :class:`Deployment` (what a memory is built with) and
:class:`MemoryStore`::

    <store>/manifest.json                  programs by sha256, the active one, earlier ones
    <store>/programs/<sha256>.py           each program's source, to roll back to
    <store>/scopes/<scope key>/log         the scope's session log (:mod:`.log`)
    <store>/scopes/<scope key>/<build>.<n>.state   a memory snapshot after n sessions
    <store>/scopes/<scope key>/embeddings.sqlite   the scope's embedding cache (MiniLM)
    <store>/scopes/<scope key>/llm-cache.sqlite    the scope's task-model replies
    <store>/scopes/<scope key>/log.damaged-<time>  a damaged log ``evolve store repair`` set aside
    <store>/cache/llm-calls.sqlite         the task model's call log (every scope's calls)
    <store>/lock                           held by the process that has the store open

Invariants:

- **A user's text is in their scope's folder only.** The log, the snapshots and both caches
  hold the user's text or what was computed from it; ``<store>/cache/`` holds no text (the
  call log has one row per call: its purpose, tokens, time, the sha256 of the request, and an
  error's message), and ``manifest.json`` and ``programs/`` none of any user. Forgetting a
  session or a scope (:mod:`.upkeep`) so works on that folder alone. Caches are per scope so that no
  program can learn another user's text from a cache hit (:mod:`.scopes`).
- **Earlier shared caches are left alone.** A store made when one embedding cache and one
  reply cache served every scope still has them as ``<store>/cache/embeddings.sqlite`` and
  ``llm-cache.sqlite``: they are never read or written again (:attr:`MemoryStore.shared_caches`
  names them, so the runtime can say they hold every user's text).

- **The log is the truth, a snapshot a shortcut.** A snapshot is the bytes the program's host
  dumped (:mod:`contract.state`; never unpickled here), named by the deployment's build key
  (:meth:`Deployment.key`: program sha256, contract and pipeline versions, task model,
  embedder, precision) and by the log position it holds. A memory is the newest snapshot of
  its build at or before the log's end, plus the log's sessions after it, each added once: no
  acknowledged session is lost and none is added twice. A snapshot is written to a temporary
  file, fsync'd and renamed, so it is whole or absent; older snapshots of the build are
  removed after a new one is in place.
- **Switching programs rebuilds, rollback is a switch back.** Opening with a program the
  manifest does not hold as active makes it active and keeps the previous one listed (its
  source under ``programs/``, its snapshots in place): its memory is built from the log; the
  earlier program's snapshots still serve it when it is made active again.
- **Scopes are folders named by the sha256 of the scope id**, so no scope id can name a path
  outside its folder or another scope's. The id itself is stored nowhere: a scope found on
  disk (:func:`scope_logs`) is known by its folder's name only.
- **One process per store.** An open :class:`MemoryStore` holds an exclusive ``flock`` on
  ``<store>/lock`` until :meth:`MemoryStore.close` or the process's death (the kernel releases it,
  kill -9 included); a second open is refused in one line naming the holder's PID. So the
  temporary files a killed writer left (``.tmp-*``, and the ``.tmp-forget-*`` folder of a
  scope being forgotten) are removed on open (:func:`remove_leftovers`). The store's upkeep
  (:mod:`.upkeep`: forget, repair) takes the same lock (:func:`hold`) when the store is not
  open in this process.
- The manifest is replaced atomically (:func:`evolve.files.write_atomic`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evolve.files import write_atomic
from evolve.runtime.log import SessionLog

FORMAT = 1
CACHES = ("embeddings.sqlite", "llm-cache.sqlite")  # a scope's (<store>/cache/: earlier versions')
_SNAPSHOT = re.compile(r"^(?P<build>[0-9a-f]{24})\.(?P<n>\d+)\.state$")
LOG = "log"  # a scope's session log, in its folder


class MemoryStoreError(Exception):
    """A store folder that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Deployment:
    """What a memory is built with: the program and everything that shapes its outputs."""

    program_sha256: str
    contract_version: str
    pipeline_version: str  # stored and hashed under its older name, evaluator_version
    task_model: str | None  # a litellm id; None: the offline stand-ins
    embedder: str
    precision: str

    def as_stored(self) -> dict[str, Any]:
        """The fields as the manifest stores them and :meth:`key` hashes them: the pipeline
        version under ``evaluator_version``, the name stores were written with, so existing
        stores keep their build keys and snapshots."""
        record = asdict(self)
        record["evaluator_version"] = record.pop("pipeline_version")
        return record

    def key(self) -> str:
        """The build key snapshots are filed under (24 hex digits)."""
        text = json.dumps(self.as_stored(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def scope_key(scope: str) -> str:
    if not isinstance(scope, str) or not scope:
        raise MemoryStoreError("a user (scope) id is a non-empty string")
    return hashlib.sha256(scope.encode("utf-8")).hexdigest()[:32]


def scope_logs(root: Path) -> list[tuple[str, Path]]:
    """Each scope folder's name and the path of its log (which may be absent), by name, found
    without opening the store: no lock taken, nothing created, so a reader may look while a
    runtime holds the store open."""
    scopes = root / "scopes"
    if not scopes.is_dir():
        raise MemoryStoreError(f"{root} is not a memory store (it has no scopes/ folder)")
    return sorted((d.name, d / LOG) for d in scopes.iterdir() if d.is_dir())


class MemoryStore:
    """A store folder, opened for one deployment (see the module's invariants)."""

    def __init__(self, root: Path, deployment: Deployment, source: str) -> None:
        self.root = root
        self.deployment = deployment
        self.build = deployment.key()
        self.switched_from: str | None = None  # the program active before this open, if other
        # caches an earlier runtime shared between scopes (never used now; see the invariants)
        self.shared_caches = [root / "cache" / name for name in CACHES
                              if (root / "cache" / name).exists()]  # fmt: skip
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / "scopes").mkdir(exist_ok=True)
            (root / "programs").mkdir(exist_ok=True)
        except OSError as exc:
            raise MemoryStoreError(f"cannot use store {root}: {exc.strerror or exc}") from None
        self._lock_fd: int | None = lock(root)
        try:
            self._open(source)
        except BaseException:
            self.close()
            raise

    def _open(self, source: str) -> None:
        root, deployment = self.root, self.deployment
        remove_leftovers(root)
        manifest = self._read_manifest()
        programs: dict[str, Any] = manifest.setdefault("programs", {})
        sha = deployment.program_sha256
        program_file = root / "programs" / f"{sha}.py"
        if not program_file.exists():
            write_atomic(program_file, source.encode("utf-8"), mode=0o600)
        active = manifest.get("active")
        if active != sha:
            if active is not None:
                self.switched_from = str(active)
                history = [h for h in manifest.get("previous", []) if h != active]
                manifest["previous"] = [active, *history]
            manifest["active"] = sha
        now = datetime.now(UTC).isoformat(timespec="seconds")
        entry = programs.setdefault(sha, {"first_used": now})
        entry.update({k: v for k, v in deployment.as_stored().items() if k != "program_sha256"})
        entry["last_used"] = now
        self.manifest = manifest
        write_atomic(root / "manifest.json", json.dumps(manifest, indent=1).encode(), mode=0o600)

    def close(self) -> None:
        """Release the store's lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _read_manifest(self) -> dict[str, Any]:
        path = self.root / "manifest.json"
        if not path.exists():
            if any((self.root / "scopes").iterdir()):
                raise MemoryStoreError(f"store {self.root} has scopes but no manifest.json")
            return {"format": FORMAT}
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise MemoryStoreError(
                f"store {self.root}: manifest.json is unreadable ({exc})"
            ) from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise MemoryStoreError(
                f"store {self.root}: manifest.json is not a format-{FORMAT} manifest"
            )
        return manifest

    def previous_program(self) -> Path | None:
        """The source file of the program active before the current one (to roll back to)."""
        previous = self.manifest.get("previous") or []
        return self.root / "programs" / f"{previous[0]}.py" if previous else None

    def scope_dir(self, scope: str) -> Path:
        return self.root / "scopes" / scope_key(scope)

    def cache_dir(self, scope: str) -> Path:
        """The scope's folder, created if need be: its embedding and reply caches go in it."""
        folder = self.scope_dir(scope)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def open_log(self, scope: str) -> SessionLog:
        log, _ = SessionLog.open(self.scope_dir(scope) / LOG)
        return log

    def snapshot(self, scope: str, upto: int) -> tuple[int, bytes] | None:
        """The newest snapshot of this build holding at most ``upto`` sessions:
        ``(sessions it holds, its bytes)``; None when there is none."""
        folder = self.scope_dir(scope)
        best = None
        for path in folder.glob(f"{self.build}.*.state"):
            match = _SNAPSHOT.match(path.name)
            if match and int(match["n"]) <= upto and (best is None or int(match["n"]) > best[0]):
                best = (int(match["n"]), path)
        if best is None:
            return None
        try:
            return best[0], best[1].read_bytes()
        except OSError:
            return None

    def put_snapshot(self, scope: str, sessions: int, state: bytes) -> None:
        """Write the build's snapshot after ``sessions`` sessions, whole or not at all, then
        remove the build's older snapshots."""
        folder = self.scope_dir(scope)
        target = folder / f"{self.build}.{sessions}.state"
        write_atomic(target, state, mode=0o600)
        for path in folder.glob(f"{self.build}.*.state"):
            match = _SNAPSHOT.match(path.name)
            if match and int(match["n"]) < sessions:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def snapshot_files(folder: Path) -> list[tuple[int, Path]]:
    """Every snapshot in a scope's folder, of any build: the sessions it holds, its path."""
    found = ((_SNAPSHOT.match(p.name), p) for p in folder.glob("*.state"))
    return sorted((int(m["n"]), p) for m, p in found if m)


def remove_leftovers(root: Path) -> None:
    """Remove what a killed writer left under ``root`` (``.tmp-*`` files and folders); the
    caller holds the store's lock, so no writer is using them."""
    for stale in sorted(root.glob("**/.tmp-*"), key=lambda p: len(p.parts)):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


@contextmanager
def hold(root: Path) -> Iterator[None]:
    """The store's lock, for a command that changes a store no runtime has open
    (:class:`MemoryStoreError` naming the holder otherwise)."""
    if not (root / "scopes").is_dir():
        raise MemoryStoreError(f"{root} is not a memory store (it has no scopes/ folder)")
    fd = lock(root)
    try:
        remove_leftovers(root)
        yield
    finally:
        os.close(fd)


def lock(root: Path) -> int:
    """The store's exclusive lock (a descriptor), or MemoryStoreError naming the holder."""
    fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise MemoryStoreError(f"store {root} is open in another process (PID {holder})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
