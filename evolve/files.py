"""Durable file writes: :func:`write_atomic`, the one way PrisMem replaces a file it owns, and
:func:`fsync_dir`, the one way it makes a folder's names durable.

Invariants: a reader sees the old file or the new one, never a torn one, and a write that
returned survives a crash — the data goes to a temporary ``.tmp-*`` file in the same folder,
is fsynced, renamed over the target (``os.replace``), and the folder is fsynced so the rename
itself is durable. A failed write leaves no temporary file behind. The run store, the step
store and ``evolve export`` all write through it (1,000 step-store writes: see
docs/performance.md). A file is created 0600 unless a ``mode`` is given; the files of a
user's data folder take :func:`plain_mode`, the mode ``open()`` would give them, so every file
of the folder reads alike.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def plain_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less this process's umask, read from
    ``/proc/self/status`` (setting and restoring the umask to read it would race other
    threads); 0644 where the kernel does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def write_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically and durably; ``mode`` sets the file's
    permissions (``mkstemp`` creates 0600). Raises OSError; the folder must exist."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # makes the rename itself durable


def fsync_dir(path: Path) -> None:
    """fsync the folder ``path``: the names it holds (a file made, renamed or removed) are on
    disk when this returns."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
