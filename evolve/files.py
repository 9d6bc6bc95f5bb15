"""Durable file writes: :func:`write_atomic`, the one way PrisMem replaces a file it owns.

Invariants: a reader sees the old file or the new one, never a torn one, and a write that
returned survives a crash — the data goes to a temporary ``.tmp-*`` file in the same folder,
is fsynced, renamed over the target (``os.replace``), and the folder is fsynced so the rename
itself is durable. A failed write leaves no temporary file behind. The run store, the step
store and ``evolve export`` all write through it (1,000 step-store writes: see
docs/performance.md).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # makes the rename itself durable
    finally:
        os.close(dir_fd)
