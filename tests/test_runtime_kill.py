"""kill -9 during ``add``: a real process adds sessions and prints each one after ``add`` returned
(acknowledged); it is SIGKILLed at 10 random points (one per start, a few milliseconds after a
random acknowledgement: inside the next add's log write, indexing or snapshot). After each kill
the store is reopened by the next process; at the end every acknowledged session is in the log
once and in the rebuilt memory once, and nothing else is."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import MINIMAL

import evolve

ROOT = Path(__file__).resolve().parents[1]
KILLS = 10

# One short unit per session, retrieval = every unit in index order: the memory, exactly.
PROGRAM = MINIMAL.replace('"\\n".join', '" ".join')

CHILD = """
import sys
import evolve

program, store, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
memory = evolve.open_memory(program, store, embedder="hashing", snapshot_every=3,
                            notice=lambda line: None)
print("ready", flush=True)
for i in range(start, start + 1000):
    memory.add([{"role": "user", "content": f"k{i}"}], user="u", session_id=f"s{i}")
    print(i, flush=True)
"""


def test_kill_9_during_add_loses_no_acknowledged_session_and_doubles_none(tmp_path: Path):
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    store = tmp_path / "store"
    rng = random.Random(20260)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    acknowledged: list[int] = []
    for kill in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, str(child), str(program), str(store), str(kill * 1000)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        wanted = rng.randint(0, 12)  # acknowledgements to wait for, then a few ms more
        for _ in range(wanted):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            acknowledged.append(int(line))
        time.sleep(rng.uniform(0, 0.02))
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=60)
        acknowledged += [int(x) for x in rest.split()]  # printed before the kill landed
        assert proc.returncode == -signal.SIGKILL
    with evolve.open_memory(program, store, embedder="hashing", notice=lambda _: None) as memory:
        logged = [s.session_id for s in memory.history("u")]
        units = memory.context("everything", user="u").split()
    assert len(logged) == len(set(logged)), "a session is in the log twice"
    assert {f"s{i}" for i in acknowledged} <= set(logged), "an acknowledged session is lost"
    # the memory holds the log, each session once (logged but unacknowledged ones included)
    assert units == [word for s in logged for word in ("user:", f"k{s[1:]}")]
    assert len(acknowledged) >= KILLS  # the kills did land after adds had returned
