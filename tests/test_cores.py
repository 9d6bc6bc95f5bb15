"""Cores shared among a pool's busy jobs: the board's count, a worker's share, the local pool."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evolve.evaluation.distributed import CountingExecutor, make_backend
from evolve.models import cores


@pytest.fixture()
def four_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "count", lambda: 4)


def test_the_share_is_the_cores_divided_among_the_busy_jobs(
    four_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = cores.BusyBoard(workers=2)
    try:
        monkeypatch.setenv(cores.ENV, board.path)
        assert cores.share() == 4  # nothing in flight: a job that starts now runs alone
        board.started()
        assert cores.share() == 4
        board.started()
        assert cores.share() == 2
        board.started()  # a third waits for a worker: still two busy
        assert (board.busy(), cores.share()) == (2, 2)
        board.finished()
        board.finished()
        assert cores.share() == 4  # the last job left takes every core
    finally:
        board.close()
    assert not Path(board.path).exists()


def test_outside_a_pool_the_thread_setting_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cores.ENV, raising=False)
    assert cores.share() is None
    monkeypatch.setenv(cores.ENV, "/nonexistent/prismem-busy/board")  # its parent is gone
    assert cores.share() is None


def test_use_share_sets_torch_threads(four_cores: None, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    board = cores.BusyBoard(workers=4)
    try:
        monkeypatch.setenv(cores.ENV, board.path)
        for _ in range(4):
            board.started()
        cores.use_share()
        assert torch.get_num_threads() == 1
        for _ in range(3):
            board.finished()
        cores.use_share()
        assert torch.get_num_threads() == 4
    finally:
        board.close()
        torch.set_num_threads(before)


def test_the_counting_executor_counts_jobs_until_they_finish() -> None:
    board = cores.BusyBoard(workers=8)
    try:
        with ThreadPoolExecutor(2) as pool:
            counted = CountingExecutor(pool, board)
            futures = [counted.submit(time.sleep, 0.3) for _ in range(3)]
            assert board.busy() == 3
            for future in futures:
                future.result()
            deadline = time.monotonic() + 5  # done callbacks run right after the result
            while board._in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
            assert board._in_flight == 0
            future = counted.submit(int, "x")  # a job that fails finishes too
            with pytest.raises(ValueError):
                future.result()
            time.sleep(0.05)
            assert board._in_flight == 0
        with pytest.raises(RuntimeError):  # refused at submit: never counted as in flight
            counted.submit(int, "1")
        assert board._in_flight == 0
    finally:
        board.close()


def _share_when(peers: int, folder: str) -> int | None:
    """In a pool worker: once ``peers`` jobs (this one included) are running, the share this
    worker reads; no job returns before every peer has read its own."""

    def meet(step: str) -> None:
        Path(folder, f"{step}-{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while sum(n.startswith(step) for n in os.listdir(folder)) < peers:
            assert time.monotonic() < deadline, f"{peers} peers never met at {step}"
            time.sleep(0.02)

    meet("running")
    share = cores.share()
    meet("read")
    return share


def test_a_local_pool_worker_reads_the_share_of_its_moment(tmp_path: Path) -> None:
    """Two jobs at once in a two-worker pool share the cores; one alone takes them all."""
    executor = make_backend("local", 2).executor
    together = tmp_path / "together"
    together.mkdir()
    both = [executor.submit(_share_when, 2, str(together)) for _ in range(2)]
    alone_dir = tmp_path / "alone"
    alone_dir.mkdir()
    shares = [f.result(timeout=120) for f in both]
    alone = executor.submit(_share_when, 1, str(alone_dir)).result(timeout=120)
    assert shares == [max(1, cores.count() // 2)] * 2
    assert alone == cores.count()
