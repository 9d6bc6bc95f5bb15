"""Distributed evaluation: Ray gives exactly the local results, however the executor reaches it.

Ray is in the test extra (``pip install -e '.[test]'``). Without it these tests skip and say so;
``PRISMEM_RAY=require`` (``.ci/run``) turns that skip into a failure.

Two instances, both on loopback, no dashboard: one started beforehand with ``ray start --head``
(the module's :func:`head` fixture, killed at the end of the module), which
``evolve eval --backend ray --ray-address`` joins from the CLI; and the private one the executor
starts itself without an address, which must not join the running instance even when
``RAY_ADDRESS`` points at it. Both tests shut their connection down, so each starts clean.
Token authentication is off for the module's instances (``RAY_AUTH_MODE=disabled``): they
accept connections from this machine only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Unavailable

from evolve.cli.main import main
from evolve.datasets.beam import load_taskset
from evolve.datasets.slices import write_slice
from evolve.evaluation.distributed import RayExecutor, make_backend
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
START_S = 180.0  # `ray start` on a loaded two-core machine


@pytest.fixture(scope="module")
def ray(unavailable: Unavailable) -> Iterator[Any]:
    try:
        import ray
    except ImportError:
        unavailable("PRISMEM_RAY", "Ray is not installed: pip install -e '.[test]'")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        yield ray


@pytest.fixture(scope="module")
def head(ray: Any) -> Iterator[str]:
    """The address of a local instance started with ``ray start --head`` (own process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="prismem-ray-")  # short: Ray's socket paths have a limit
    log = Path(temp) / "start.log"
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
               "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
               "--include-dashboard=false", "--disable-usage-stats",
               f"--temp-dir={temp}"]  # fmt: skip
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + START_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "ray start did not finish"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: ray start and every process it began
        proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def data(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_slice(data_dir, tmp_path_factory.mktemp("data"), messages=30, chars=600,
                       refs=[("100K", "1"), ("100K", "3"), ("100K", "4")])  # fmt: skip


def comparable(report: Any) -> list[dict[str, Any]]:
    keep = ("id", "retrieved", "scores", "error", "query")
    return [{k: getattr(t, k) for k in keep} for t in report.traces]


def test_executor_starts_a_private_instance_that_matches_local(
    ray: Any, head: str, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = load_taskset(data, "all")
    program = SEEDS / "hybrid.py"

    def run(backend: str) -> Any:
        cfg = EvalSetup(cache_dir=str(tmp_path / backend), task_model=None, embedder="hashing")
        return run_eval(program, tasks, cfg, backend=make_backend(backend, 2))

    tasks_sent: list[str] = []
    submit = RayExecutor.submit

    def counted(self: RayExecutor, fn: Any, /, *args: Any) -> Any:
        tasks_sent.append(args[1].id)  # run_conversation(program, conversation, ...)
        return submit(self, fn, *args)

    monkeypatch.setattr(RayExecutor, "submit", counted)
    monkeypatch.setenv("RAY_ADDRESS", head)  # a running instance the executor must not join
    assert not ray.is_initialized()
    local = run("local")
    try:
        distributed = run("ray")
        own = ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
    assert own.rsplit(":", 1)[1] != head.rsplit(":", 1)[1]
    assert sorted(tasks_sent) == sorted(c.id for c in tasks.conversations)  # one Ray task each
    assert comparable(distributed) == comparable(local)
    assert distributed.scores == local.scores
    assert distributed.steps == local.steps
    assert distributed.steps["index"]["computed"] == len(tasks.conversations)


def test_cli_eval_joins_a_running_instance_by_address(
    ray: Any, head: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(*extra: str) -> dict[str, Any]:
        argv = ["eval", "--program", str(SEEDS / "hybrid.py"), "--bench", "beam", "--split",
                "all", "--data-dir", str(data), "--embedder", "hashing", "--json",
                "--no-progress", "--runs-dir", str(tmp_path / "runs"), *extra]  # fmt: skip
        assert main(argv) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    local = cli("--cache-dir", str(tmp_path / "local"))
    assert not ray.is_initialized()
    try:
        joined = cli(
            "--cache-dir", str(tmp_path / "ray"), "--backend", "ray", "--ray-address", head
        )
        gcs = ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()  # disconnects; the instance it joined keeps running
    assert gcs.rsplit(":", 1)[1] == head.rsplit(":", 1)[1]
    assert joined["scores"] == local["scores"] and joined["stages"] == local["stages"]
    assert joined["stages"]["index"]["computed"] == 3
