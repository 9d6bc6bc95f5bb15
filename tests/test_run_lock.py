"""One process per run: two ``evolve run --resume`` of the same run at once, as real processes;
the second says which process holds the run and exits 2, the first finishes alone; a holder
killed with SIGKILL leaves no stale lock."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_config

from evolve.evolution.store import RunLocked, RunStore

RUN = "locked"


@pytest.fixture
def runs(data_dir: Path, tmp_path: Path) -> Path:
    """A created run that has not started: a resume evolves it from its seed."""
    cfg = run_config(data_dir, tmp_path / "cache", children=1, cascade=False,
                     rounds={"cold_start": 1, "refinement": 0, "integration": 0})  # fmt: skip
    manifest = {"config": cfg.as_json(), "fitness": cfg.fitness().describe()}
    RunStore.create(tmp_path / "runs", manifest, run_id=RUN)
    return tmp_path / "runs"


def resume(runs: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evolve",
            "run",
            "--resume",
            RUN,
            "--runs-dir",
            str(runs),
            "--no-progress",
            "--guard",
            "none",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def evaluated(runs: Path) -> list[str]:
    """The candidate of every ``evaluated`` event, in order."""
    with sqlite3.connect(runs / RUN / "index.sqlite") as conn:
        rows = conn.execute("select data from events where kind = 'evaluated'").fetchall()
    return [json.loads(data)["candidate"] for (data,) in rows]


def test_two_resumes_at_once_one_runs_the_other_says_who(runs: Path) -> None:
    first = resume(runs)
    deadline = time.monotonic() + 60
    while not (runs / RUN / "run.lock").exists() or not (runs / RUN / "run.lock").read_text():
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.1)
    second = resume(runs)
    out2, err2 = second.communicate(timeout=120)
    out1, err1 = first.communicate(timeout=600)
    assert first.returncode == 0, err1[-2000:]
    assert second.returncode == 2, err2[-2000:]
    errors = [line for line in err2.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"process {first.pid}" in errors[0], err2
    assert "Traceback" not in err2
    done = evaluated(runs)
    assert done and len(done) == len(set(done)), done  # each evaluated once, by the first


def test_a_killed_holder_leaves_no_stale_lock(runs: Path) -> None:
    first = resume(runs)
    deadline = time.monotonic() + 60
    while not (runs / RUN / "run.lock").exists() or not (runs / RUN / "run.lock").read_text():
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.1)
    with pytest.raises(RunLocked, match=f"process {first.pid}"):
        RunStore.open(runs, RUN).lock()
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    RunStore.open(runs, RUN).lock()  # the kernel released it with the process


def test_resume_refuses_another_cache_dir_in_one_line(runs: Path, tmp_path: Path, capsys) -> None:
    from evolve.cli.main import main

    code = main(["run", "--resume", RUN, "--runs-dir", str(runs), "--cache-dir",
                 str(tmp_path / "elsewhere"), "--guard", "none"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1, err
    assert str(tmp_path / "cache") in err and "cannot move it" in err
    assert not (tmp_path / "elsewhere").exists()
