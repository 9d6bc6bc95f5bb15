"""One user's reads run together, writes alone (:mod:`evolve.runtime.scopes`,
:mod:`evolve.runtime.rwlock`): reads overlap in their task-model steps with one host and in
the program's own steps with ``read_hosts`` > 1; an ``add`` never overlaps a read of its user,
and a read sees whole sessions only; a writer is not starved by a stream of readers; the
hosts of one user hold the same memory; the pool's bound counts hosts."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import evolve
from evolve.evaluation.pipeline import Pipeline
from evolve.runtime.rwlock import ReadWriteLock
from sandbox.isolate import Host

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = (ROOT / "seeds" / "simple.py").read_text()

# Every unit's content in index order; its retrieve spins for a while in the host (the
# program's own step, which one host serves one at a time); "boom" makes retrieve raise.
SLOW = SIMPLE.replace(
    'text = "\\n\\n".join(render(u) for u in self.units)',
    "spin = sum(range(2_000_000))\n"
    '        if "boom" in str(query):\n'
    '            raise ValueError("boom")\n'
    '        text = " ".join(u.content for u in self.units) if spin else ""',
)


def opened(tmp_path: Path, **kw: object):
    prog = tmp_path / "slow.py"
    prog.write_text(SLOW)
    return evolve.open_memory(prog, tmp_path / "store", embedder="hashing",
                              notice=lambda _: None, **kw)  # type: ignore[arg-type]  # fmt: skip


def spans_of(monkeypatch: pytest.MonkeyPatch, name: str, pause: float = 0.0):
    """Record the (start, end) of every call of ``Pipeline.<name>``; ``pause`` seconds are
    spent on the optimizer's side before the call (standing for a task-model call)."""
    spans: list[tuple[float, float]] = []
    real = getattr(Pipeline, name)

    def timed(self: Pipeline, *a: object, **kw: object) -> object:
        began = time.perf_counter()
        time.sleep(pause)
        out = real(self, *a, **kw)
        spans.append((began, time.perf_counter()))
        return out

    monkeypatch.setattr(Pipeline, name, timed)
    return spans


def host_spans(monkeypatch: pytest.MonkeyPatch, op: str) -> list[tuple[int, float, float]]:
    """Record ``(host, start, end)`` of every ``op`` request a host serves."""
    spans: list[tuple[int, float, float]] = []
    real = Host.call

    def timed(self: Host, what: str, *a: object, **kw: object) -> object:
        began = time.perf_counter()
        out = real(self, what, *a, **kw)  # type: ignore[arg-type]
        if what == op:
            spans.append((id(self), began, time.perf_counter()))
        return out

    monkeypatch.setattr(Host, "call", timed)
    return spans


def same_host_overlap(spans: list[tuple[int, float, float]]) -> bool:
    return any(a[0] == b[0] and a[1] < b[2] and b[1] < a[2] for a in spans for b in spans
               if a is not b)  # fmt: skip


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    return any(x[0] < y[1] and y[0] < x[1] for x in a for y in b if x is not y)


def together(calls: list) -> None:  # type: ignore[type-arg]
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_reads_of_one_user_overlap_in_their_model_steps(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """With one host, two reads of one user plan side by side (the model's step), and the
    program's retrieve steps take turns in the host."""
    with opened(tmp_path) as memory:
        memory.add([{"content": "alpha"}], user="ana")
        plans = spans_of(monkeypatch, "plan", pause=0.3)
        retrieves = host_spans(monkeypatch, "retrieve")
        got: list[str] = []
        together([lambda: got.append(memory.context("q", user="ana"))] * 3)
        assert got == ["user: alpha"] * 3
        assert overlap(plans, plans), "one user's reads took turns in their model step"
        assert len(retrieves) == 3 and len({h for h, _, _ in retrieves}) == 1
        assert not same_host_overlap(retrieves), "one host served two retrieves at once"
        assert memory.live_hosts() == 1


def test_read_hosts_run_one_users_retrieves_side_by_side(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """``read_hosts=2``: busy reads start a second host from the store, the program's own
    retrieve steps overlap, and both hosts answer the same; an add reaches both."""
    with opened(tmp_path, read_hosts=2) as memory:
        memory.add([{"content": "alpha"}], user="ana")
        retrieves = host_spans(monkeypatch, "retrieve")
        got: list[str] = []
        for _ in range(3):
            together([lambda: got.append(memory.context("q", user="ana"))] * 4)
        assert got == ["user: alpha"] * 12
        assert memory.live_hosts() == 2 and len({h for h, _, _ in retrieves}) == 2
        assert not same_host_overlap(retrieves)
        assert overlap([r[1:] for r in retrieves], [r[1:] for r in retrieves]), (
            "two hosts never retrieved at once"
        )
        memory.add([{"content": "beta"}], user="ana")
        got = []
        together([lambda: got.append(memory.context("q", user="ana"))] * 4)
        assert got == ["user: alpha user: beta"] * 4, "a host of the user missed the add"


@pytest.mark.parametrize("hosts", [1, 2])
def test_an_add_waits_for_reads_and_a_read_sees_whole_sessions(tmp_path, monkeypatch, hosts):  # type: ignore[no-untyped-def]
    """Readers and a writer on one user at once: no add overlaps a retrieve, and every read
    holds the first k sessions for some k, each once (with one host and with two)."""
    with opened(tmp_path, read_hosts=hosts) as memory:
        memory.add([{"content": "s0"}], user="ana")
        adds = spans_of(monkeypatch, "add", pause=0.02)
        retrieves = host_spans(monkeypatch, "retrieve")
        seen: list[str] = []
        done = threading.Event()

        def writer() -> None:
            for i in range(1, 7):
                memory.add([{"content": f"s{i}a"}, {"content": f"s{i}b"}], user="ana")
                time.sleep(0.05)  # outside the lock: reads get in between adds
            done.set()

        def reader() -> None:
            while not done.is_set():
                seen.append(memory.context("q", user="ana"))

        together([writer, reader, reader])
        monkeypatch.undo()
    assert retrieves and adds
    assert not overlap(adds, [r[1:] for r in retrieves]), "a read ran beside an add"
    for text in seen:
        words = text.replace("user: ", "").split()
        k = (len(words) - 1) // 2
        whole = ["s0"] + [f"s{i}{p}" for i in range(1, k + 1) for p in "ab"]
        assert words == whole, f"a read saw part of a session: {text!r}"
    assert len({len(t) for t in seen}) > 1, "the reads never saw an add land"


def test_a_read_the_program_fails_keeps_its_host_one_whose_host_died_does_not(tmp_path):  # type: ignore[no-untyped-def]
    with opened(tmp_path) as memory:
        memory.add([{"content": "alpha"}], user="ana")
        with pytest.raises(evolve.AgentMemoryError, match="the program failed.*boom"):
            memory.context("boom", user="ana")
        assert memory.live_hosts() == 1
        assert memory.context("q", user="ana") == "user: alpha"
        [live] = memory._scopes.scope("ana").lives
        assert live.pipeline._host is not None
        os.killpg(live.pipeline._host.proc.pid, signal.SIGKILL)  # the host dies
        live.pipeline._host.proc.wait(10)
        with pytest.raises(evolve.AgentMemoryError, match="the program failed"):
            memory.context("q", user="ana")
        assert memory.live_hosts() == 0
        assert memory.context("q", user="ana") == "user: alpha"  # started again from the store
        assert memory.live_hosts() == 1


def test_the_bound_counts_hosts(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """``max_live=2, read_hosts=2``: a user's two hosts fill the pool, and using another user
    evicts the first one's (both), keeping its memory."""
    with opened(tmp_path, max_live=2, read_hosts=2) as memory:
        memory.add([{"content": "alpha"}], user="ana")
        spans_of(monkeypatch, "retrieve", pause=0.05)
        together([lambda: memory.context("q", user="ana")] * 3)
        assert memory.live_hosts() == 2
        memory.add([{"content": "beta"}], user="bob")
        assert memory.live_hosts() == 1
        assert memory.context("q", user="ana") == "user: alpha"
    with pytest.raises(evolve.AgentMemoryError, match="read_hosts at most max_live"):
        opened(tmp_path, max_live=1, read_hosts=2)


def test_a_waiting_writer_holds_later_readers_back():
    """Readers hold the lock; a writer waits; a reader that comes after the writer waits
    behind it (so a stream of reads cannot starve an add); try_write never waits."""
    lock = ReadWriteLock()
    order: list[str] = []
    first_in, release = threading.Event(), threading.Event()

    def first_reader() -> None:
        with lock.reading():
            first_in.set()
            release.wait(5)
            order.append("reader 1 out")

    def writer() -> None:
        with lock.writing():
            order.append("writer")

    def late_reader() -> None:
        with lock.reading():
            order.append("reader 2")

    threads = [threading.Thread(target=first_reader)]
    threads[0].start()
    assert first_in.wait(5)
    assert not lock.try_write()
    threads.append(threading.Thread(target=writer))
    threads[1].start()
    while not lock._writers_waiting:  # the writer is queued
        time.sleep(0.005)
    threads.append(threading.Thread(target=late_reader))
    threads[2].start()
    time.sleep(0.1)
    assert order == [], "a reader got in past a waiting writer"
    release.set()
    for t in threads:
        t.join(5)
    assert order == ["reader 1 out", "writer", "reader 2"]
    assert lock.try_write()
    lock.release_write()
