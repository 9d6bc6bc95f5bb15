"""Process lifetime: everything `evolve` starts dies with it, even when it is killed with
SIGKILL and has no chance to clean up (the worker pool, its progress queue's manager, the
resource trackers, the sandbox hosts and their reapers, with and without namespaces). Linux
only: descendants are found through /proc."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Unavailable

from sandbox import barrier

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
    cmd = [sys.executable, "-m", "evolve", "eval", "--program", dense, "--split", "valid",
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
        hosts = {p for p in seen if b"sandbox.host" in _cmdline(p)}
        deadline = time.monotonic() + 2  # hosts and reapers: within 2 s (issue 40)
        while alive(hosts) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(hosts), f"{len(alive(hosts))} sandbox hosts outlived it by 2 s"
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


# A stand-in optimizer: it starts a real sandbox host from a worker thread that then ends (a
# parent-death signal on the host's first process would fire there), has it run a busy loop
# in the middle of a request, and waits. With "refuse", a seccomp filter answers unshare with
# EPERM first, as a kernel that refuses namespaces does: its hosts take the weaker mode.
OPTIMIZER = """
import errno, json, sys
from concurrent.futures import ThreadPoolExecutor
from sandbox.isolate import Host, Limits
if sys.argv[2] == "refuse":
    import pyseccomp as sc
    refuse = sc.SyscallFilter(sc.ALLOW)
    refuse.add_rule(sc.ERRNO(errno.EPERM), "unshare")
    refuse.load()
with ThreadPoolExecutor(1) as pool:
    host = pool.submit(Host, Limits(**json.loads(sys.argv[1]))).result()
print(json.dumps(host.isolation), flush=True)
host.call("load", {"source": "while True:\\n    pass\\n", "path": "busy.py"})
"""


def marked(marker: bytes) -> set[int]:
    """Live processes whose command line holds ``marker``."""
    return {
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and marker in _cmdline(int(entry)) and int(entry) != os.getpid()
        and (stat := _stat(int(entry))) is not None and stat[0] != "Z"
    }  # fmt: skip


@pytest.mark.parametrize("mode", ["namespaces", "refuse"])
def test_a_host_dies_with_its_killed_optimizer(mode: str, unavailable: Unavailable) -> None:
    """kill -9 of the optimizer mid-request: within 2 s no host and no reaper is left."""
    if mode == "namespaces" and not barrier.complete(barrier.survey()):
        unavailable("PRISMEM_BARRIER", barrier.describe(barrier.survey()))
    stderr_bytes = random.randrange(1 << 20, 1 << 30)  # it marks the host's command line
    marker = f'"stderr_bytes": {stderr_bytes}'.encode()
    limits = json.dumps({"stderr_bytes": stderr_bytes, "call_seconds": 60.0})
    optimizer = subprocess.Popen(
        [sys.executable, "-c", OPTIMIZER, limits, mode],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert optimizer.stdout is not None
        isolation = json.loads(optimizer.stdout.readline() or "null")
        assert isolation, optimizer.stderr.read().decode()[-2000:] if optimizer.stderr else ""
        assert ("missing" in isolation) == (mode == "refuse"), isolation
        host = marked(marker) - {optimizer.pid}
        assert len(host) == 2, host  # the reaper and the host proper
        deadline = time.monotonic() + 10  # the request is under way: the host computes
        while time.monotonic() < deadline and not any(_running(p) for p in host):
            time.sleep(0.05)
        assert any(_running(p) for p in host), "the host never ran the request"
        optimizer.kill()
        optimizer.wait()
        deadline = time.monotonic() + 2
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not marked(marker), "a host or its reaper outlived the optimizer"
    finally:
        optimizer.kill()
        optimizer.wait()
        for pid in marked(marker):  # only processes this test started
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    return (stat := _stat(pid)) is not None and stat[0] == "R"
