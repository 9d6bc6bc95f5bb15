"""Process lifetime: everything `evolve` starts dies with it, even when it is killed with
SIGKILL and has no chance to clean up (the worker pool, its progress queue's manager, the
resource trackers, the sandbox hosts). Linux only: descendants are found through /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def descendants(root: int) -> set[int]:
    """Every live process under ``root``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if (stat := _stat(p)) is not None and stat[0] != "Z"}


def test_workers_die_with_a_killed_evaluation(data_dir: Path, tmp_path: Path):
    dense = str(ROOT / "seeds" / "dense.py")
    cmd = [sys.executable, "-m", "evolve.cli", "eval", "--program", dense, "--split", "valid",
           "--data-dir", str(data_dir), "--jobs", "2", "--embedder", "hashing",
           "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"),
           "--no-progress"]  # fmt: skip
    main = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and main.poll() is None:
            seen |= descendants(main.pid)
            if _evaluating(alive(seen)):
                break
            time.sleep(0.2)
        assert main.poll() is None, "the evaluation ended before its workers were seen"
        seen |= descendants(main.pid)
        os.kill(main.pid, signal.SIGKILL)
        main.wait()
        deadline = time.monotonic() + 20
        while alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {p: _cmdline(p)[:100] for p in alive(seen)}
        assert not left, f"{len(left)} of {len(seen)} processes outlived the evaluation: {left}"
    finally:
        main.kill()
        main.wait()
        for pid in alive(seen):  # only processes this test started
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _evaluating(pids: set[int]) -> bool:
    """Both loky workers are up, and at least one evaluates in a sandbox host."""
    cmdlines = [_cmdline(p) for p in pids]
    return sum(b"loky" in c for c in cmdlines) >= 2 and any(b"sandbox.host" in c for c in cmdlines)
