"""The machine's cores, shared among the jobs a process's worker pool is running.

Owns :class:`BusyBoard` (the parent's count of the pool's jobs in flight, published in a
private file), :func:`board` (this process's one board), :func:`share` (the threads a worker
may use now) and :func:`use_share` (applies it to torch). A worker applies its share before
each batch it encodes, so a conversation left to run alone, a guard's long history or the
last of a split, gets every core instead of the share it started with, and two busy workers
on two cores keep one thread each.

Invariants:

- ``share()`` is ``max(1, cores // busy)``, with ``busy`` the jobs in flight capped at the
  pool's workers and at least 1, and ``cores`` :func:`count`; outside a pool (no board named
  in the environment, or its file gone with its parent) it is None and the process keeps its
  thread setting.
- The thread count changes no vector: MiniLM's rows are bit-identical with one thread and with
  two (``tests/test_embed.py``), so what a run scores never depends on when a job ran alone.
- The board is a 4-byte file (mode 0600) in a private temporary folder, written with
  ``pwrite`` and read with ``pread``: nothing to leak when a process is killed (the folder is
  removed at a normal exit), and no shared-memory segment that a worker's resource tracker
  could unlink under its parent.
"""

from __future__ import annotations

import atexit
import os
import shutil
import struct
import tempfile
import threading
from pathlib import Path

ENV = "PRISMEM_BUSY_BOARD"  # the board's path, set in a pool worker's environment
_FORMAT = "<I"
_BOARD: list[BusyBoard] = []
_BOARD_LOCK = threading.Lock()
_READER: dict[str, int] = {}  # path -> open descriptor, in a worker


def count() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it); the one
    count of the machine's CPUs (the CLI's ``--jobs`` bound reads it too)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class BusyBoard:
    """How many of a pool's ``workers`` are busy: jobs submitted and not finished, capped."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._dir = tempfile.mkdtemp(prefix="prismem-busy-")
        self.path = str(Path(self._dir) / "board")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._publish()
        atexit.register(self.close)

    def started(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._publish()

    def finished(self) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._publish()

    def busy(self) -> int:
        with self._lock:
            return self._busy()

    def _busy(self) -> int:
        return max(1, min(self._in_flight, self.workers))

    def _publish(self) -> None:
        os.pwrite(self._fd, struct.pack(_FORMAT, self._busy()), 0)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
        shutil.rmtree(self._dir, ignore_errors=True)


def board(workers: int) -> BusyBoard:
    """This process's board (one per process, as loky keeps one reusable pool per process);
    a call with another worker count sets it."""
    with _BOARD_LOCK:
        if not _BOARD:
            _BOARD.append(BusyBoard(workers))
        _BOARD[0].workers = max(1, workers)
        return _BOARD[0]


def share() -> int | None:
    """The threads this worker may use now, or None outside a pool with a board."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        fd = _READER.get(path)
        if fd is None:
            fd = _READER[path] = os.open(path, os.O_RDONLY)
        raw = os.pread(fd, struct.calcsize(_FORMAT), 0)
    except OSError:
        return None
    if len(raw) != struct.calcsize(_FORMAT):
        return None
    (busy,) = struct.unpack(_FORMAT, raw)
    return max(1, count() // max(1, busy))


def use_share() -> None:
    """Set torch's intra-op threads to :func:`share` where it names one and differs."""
    threads = share()
    if threads is None:
        return
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
