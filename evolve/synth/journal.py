"""What a synth run has finished, kept as it goes so a killed run resumes where it was.

Owns :class:`Journal` (``DIR/synth/journal.jsonl``).

The request cache already makes a rerun free for every call that was answered; the journal
records what the cache cannot: a step whose model never gave usable JSON
(:class:`~evolve.models.llm.JSONReplyError`: its replies were dropped from the cache, so asking
again would be paid again) and which tasks finished, for the progress shown on a resume.

Invariants:

- The first line names the run's identity (the model, the settings and the history's digest);
  a journal of another identity is replaced by an empty one when opened, so a recorded failure
  is replayed only for the very same requests.
- Every record is one line, appended, flushed and fsynced before :meth:`Journal.failed` or
  :meth:`Journal.done` returns; a line torn by a kill is ignored on reading (and the next
  record starts on a line of its own: opening ends a torn line).
- Safe to use from many threads (one lock).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

VERSION = 1


class Journal:
    def __init__(self, path: Path, identity: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._failures: dict[str, str] = {}
        self.finished: set[str] = set()
        lines = self._read()
        head = lines[0] if lines else None
        if head != {"journal": VERSION, "identity": identity}:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({"journal": VERSION, "identity": identity}) + "\n")
            os.replace(tmp, path)
            return
        if not self._ends_cleanly():
            with path.open("ab") as sink:  # a torn last line: the next record starts anew
                sink.write(b"\n")
        for record in lines[1:]:
            step, failed, done = record.get("step"), record.get("failed"), record.get("done")
            if isinstance(step, str) and isinstance(failed, str):
                self._failures[step] = failed
            elif isinstance(done, str):
                self.finished.add(done)

    def _ends_cleanly(self) -> bool:
        with self.path.open("rb") as source:
            source.seek(0, os.SEEK_END)
            if source.tell() == 0:
                return True
            source.seek(-1, os.SEEK_END)
            return source.read(1) == b"\n"

    def _read(self) -> list[dict[str, object]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        records = []
        for line in raw.split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:  # a line torn by a kill, or an empty one
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def failure(self, step: str) -> str | None:
        """The error a step ended with in an earlier run of this identity, if it failed."""
        with self._lock:
            return self._failures.get(step)

    def failed(self, step: str, error: str) -> None:
        self._append({"step": step, "failed": error})
        with self._lock:
            self._failures[step] = error

    def done(self, task: str) -> None:
        """Record that ``task`` finished (once: a rerun's finished tasks add no line)."""
        with self._lock:
            if task in self.finished:
                return
            self.finished.add(task)
        self._append({"done": task})

    def _append(self, record: dict[str, str]) -> None:
        line = (json.dumps(record) + "\n").encode()
        with self._lock, self.path.open("ab") as sink:
            sink.write(line)
            sink.flush()
            os.fsync(sink.fileno())
