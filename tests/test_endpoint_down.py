"""A dead model endpoint stops the whole run in seconds, in one line, and the run resumes once
the endpoint is back (:mod:`evolve.models.breaker`): real processes — the fake model server,
killed mid-evaluation, and ``evolve eval`` with its worker processes."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolve.datasets.slices import write_slice
from evolve.models.breaker import FAILED_ATTEMPTS, FAILED_CALLS, Breaker, EndpointDown, refusal

ROOT = Path(__file__).resolve().parents[1]
DENSE = str(ROOT / "seeds" / "dense.py")


def start_server(port: int = 0, latency: float = 0.0) -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "evolve.models.fake_server", "--port", str(port),
         "--latency", str(latency)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    return server, server.stdout.readline().split()[4]


def requests_seen(url: str) -> int:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/stats")
    return int(json.loads(conn.getresponse().read())["requests"])


@pytest.fixture
def one_conv(data_dir: Path, tmp_path: Path) -> Path:
    """A cut of BEAM-100K conversation 1 (the breaker, not the data, is under test): its first
    60 messages, at most 2,000 characters each, some ten model calls to evaluate it."""
    return write_slice(data_dir, tmp_path / "data", messages=60, chars=2000, refs=[("100K", "1")])


def test_a_server_killed_mid_evaluation_ends_it_in_one_line_and_it_resumes(
    one_conv: Path, tmp_path: Path
) -> None:
    server, url = start_server(latency=0.3)
    port = url.rsplit(":", 1)[1].split("/")[0]
    command = [sys.executable, "-m", "evolve", "eval", "--program", DENSE, "--model",
               "openai/fake", "--api-base", url, "--bench", "beam", "--split", "all",
               "--data-dir", str(one_conv), "--embedder", "hashing", "--jobs", "1",
               "--cache-dir", str(tmp_path / "cache"), "--runs-dir", str(tmp_path / "runs"),
               "--no-progress"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    evaluation = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while requests_seen(url) < 6:  # mid-evaluation: its model calls have started
            assert evaluation.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        server.kill()
        server.wait()
        killed = time.monotonic()
        _, err = evaluation.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        server.kill()
        evaluation.kill()
    assert took < 60, took
    assert evaluation.returncode == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "model endpoint down" in errors[0] and url in errors[0]
    assert "connection refused" in errors[0]

    server, again = start_server(port=int(port))  # the endpoint is back: the same command ends
    try:
        assert again == url
        done = subprocess.run(command, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    finally:
        server.kill()
    assert done.returncode == 0, done.stderr


def test_calls_and_attempts_in_a_row_trip_it_for_every_process(tmp_path: Path) -> None:
    """Two breaker objects on one folder stand for two processes of a run: what one counts the
    other sees; a success resets the counts; once tripped, both refuse."""
    one, other = Breaker(tmp_path / "run"), Breaker(tmp_path / "run")
    boom = TimeoutError("read timed out")
    for _ in range(FAILED_CALLS - 1):
        one.call_failed("http://h/v1 (openai/m)", boom)
    other.succeeded()  # a success anywhere starts the count again
    for _ in range(FAILED_CALLS - 1):
        other.call_failed("http://h/v1 (openai/m)", boom)
    assert not one.tripped()
    one.call_failed("http://h/v1 (openai/m)", boom)
    assert other.tripped()
    with pytest.raises(EndpointDown, match=r"http://h/v1 \(openai/m\): 3 calls in a row failed"):
        other.check()
    one.reset()
    other.check()
    for i in range(FAILED_ATTEMPTS):
        assert not one.tripped()
        (one if i % 2 else other).attempt_failed("e", boom, transient=True)
        one.attempt_failed("e", ValueError("a bad request"), transient=False)  # not counted
    assert one.tripped()


def test_a_refused_connection_is_told_from_other_failures() -> None:
    try:
        raise OSError("wrapped") from ConnectionRefusedError(111, "Connection refused")
    except OSError as exc:
        assert refusal(exc) == "connection refused"
    assert refusal(TimeoutError("timed out")) is None
