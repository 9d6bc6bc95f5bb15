"""A readers-writer lock with writer preference: many readers at once, or one writer.

Owns :class:`ReadWriteLock`. The standard library has none, and the runtime needs only this.

Invariants:

- While a writer holds the lock, nobody else does; while readers hold it, no writer does.
- **Writers are not starved.** Once a writer waits, readers that arrive after it wait too, so a
  steady stream of reads cannot keep an ``add`` out for ever.
- :meth:`ReadWriteLock.try_write` never blocks (the pool's eviction uses it to pass over a
  scope in use).
- Not reentrant: a thread holding the lock must not acquire it again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ReadWriteLock:
    """See the module's invariants."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
                self._cond.notify_all()  # readers held back by this writer look again
            self._writing = True
        try:
            yield
        finally:
            self.release_write()

    def try_write(self) -> bool:
        """Take the lock for writing if nobody holds it; never waits. Release with
        :meth:`release_write`."""
        with self._cond:
            if self._writing or self._readers:
                return False
            self._writing = True
            return True

    def release_write(self) -> None:
        with self._cond:
            self._writing = False
            self._cond.notify_all()
