"""The served process: kill -9 at 10 random points while 4 clients stream adds loses no
acknowledged session and doubles none; SIGTERM finishes the admitted add, refuses new verbs
with 503 and exits 0.

The server runs in a subprocess as ``evolve serve`` runs it (:func:`evolve.cli.serve.cmd_serve`,
offline, the hashing embedder, the minimal program), over one store kept across restarts; it
says its port on stderr (``serving ... on http://127.0.0.1:PORT``)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx
from conftest import MINIMAL

from evolve.server.auth import digest

ROOT = Path(__file__).resolve().parents[1]
KILLS = 10
CLIENTS = 4
TOKEN = "tok-kill"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
PROGRAM = MINIMAL.replace('"\\n".join', '" ".join')  # the memory: every unit, in order

SERVE = """
import argparse, sys
from evolve.cli.common import Parser
from evolve.cli.serve import add_command, cmd_serve
parser = Parser(prog="evolve")
add_command(parser.add_subparsers(dest="command", required=True))
sys.exit(cmd_serve(parser.parse_args(sys.argv[1:])))
"""

HELD = """
import sys, time
from pathlib import Path
import evolve
from evolve.cli.serve import serve_http
from evolve.server.auth import TokenFile
from evolve.server.limits import ServerBounds
from evolve.server.service import MemoryService

program, store, tokens, gate = sys.argv[1:5]
memory = evolve.open_memory(program, store, embedder="hashing", notice=lambda line: None)
real = memory.add

def add(messages, **kw):  # an add of "slow" waits for the gate file (the test holds it)
    if any("slow" in m["content"] for m in messages):
        Path(gate + ".started").touch()
        while not Path(gate).exists():
            time.sleep(0.01)
    return real(messages, **kw)

memory.add = add
service = MemoryService(memory, Path(program))
try:
    code = serve_http(service, TokenFile(Path(tokens)), "127.0.0.1", 0, ServerBounds(),
                      label=program)
finally:
    service.close()
print("exited cleanly", flush=True)
sys.exit(code)
"""


def setup_files(tmp_path: Path) -> tuple[Path, Path]:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "kill", "sha256": digest(TOKEN), "scopes": ["u", "v"], "expires": None}
                ]
            }
        )
    )
    tokens.chmod(0o600)
    return program, tokens


def start(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)  # fmt: skip
    assert proc.stderr is not None
    url = _port_line(proc.stderr, proc)
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # drain what follows
    return proc, url


def _port_line(stream: IO[str], proc: subprocess.Popen[str]) -> str:
    seen = []
    for line in stream:
        seen.append(line)
        found = re.search(r"serving .* on (http://\S+)", line)
        if found:
            return found[1]
    raise AssertionError(f"the server did not start (status {proc.wait()}): {''.join(seen)}")


def test_kill_9_at_10_points_loses_no_acknowledged_session_and_doubles_none(tmp_path: Path):
    program, tokens = setup_files(tmp_path)
    store = tmp_path / "store"
    serve = ["-c", SERVE, "serve", str(program), "--store", str(store), "--tokens",
             str(tokens), "--port", "0", "--embedder", "hashing"]  # fmt: skip
    rng = random.Random(4343)
    acked: list[tuple[str, str]] = []  # (scope, session id) answered 200
    lock = threading.Lock()
    for kill in range(KILLS):
        proc, url = start(serve, tmp_path)
        stop = threading.Event()

        def client(c: int, url: str = url, kill: int = kill, stop: threading.Event = stop) -> None:
            scope = "uv"[c % 2]
            with httpx.Client(base_url=url, headers=HEADERS, timeout=10) as http:
                for i in range(1000):
                    if stop.is_set():
                        return
                    sid = f"k{kill}-c{c}-{i}"
                    try:
                        r = http.post(f"/v1/scopes/{scope}/sessions", json={
                            "session_id": sid, "messages": [{"content": sid}]})  # fmt: skip
                    except httpx.HTTPError:
                        return  # the server died under this request: not acknowledged
                    assert r.status_code == 200, r.text
                    assert r.json() == {"session_id": sid, "added": True}
                    with lock:
                        acked.append((scope, sid))

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        stop.set()
        for t in threads:
            t.join(30)
        assert proc.returncode == -signal.SIGKILL
    assert len(acked) >= KILLS  # the kills landed among acknowledged adds
    proc, url = start(serve, tmp_path)
    try:
        with httpx.Client(base_url=url, headers=HEADERS, timeout=30) as http:
            for scope in "uv":
                logged = [
                    s["session_id"]
                    for s in http.get(f"/v1/scopes/{scope}/sessions").json()["sessions"]
                ]
                assert len(logged) == len(set(logged)), f"a session of {scope} is there twice"
                mine = {sid for sc, sid in acked if sc == scope}
                assert mine <= set(logged), f"acknowledged sessions lost: {mine - set(logged)}"
                # the memory holds the log, each session once (unacknowledged ones included)
                units = (
                    http.post(f"/v1/scopes/{scope}/context", json={"question": "all"})
                    .json()["context"]
                    .split()
                )
                assert units == [w for sid in logged for w in ("user:", sid)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_sigterm_finishes_the_admitted_add_refuses_new_verbs_and_exits_0(tmp_path: Path):
    program, tokens = setup_files(tmp_path)
    store, gate = tmp_path / "store", tmp_path / "gate"
    proc, url = start(["-c", HELD, str(program), str(store), str(tokens), str(gate)], tmp_path)
    held: list[httpx.Response] = []
    with httpx.Client(base_url=url, headers=HEADERS, timeout=30) as http:
        try:
            slow = threading.Thread(target=lambda: held.append(http.post(
                "/v1/scopes/u/sessions", json={"session_id": "s-slow", "messages": [
                    {"content": "slow"}]})))  # fmt: skip
            slow.start()
            end = time.monotonic() + 20
            while not Path(f"{gate}.started").exists():
                assert time.monotonic() < end and slow.is_alive()
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            late = http.post(
                "/v1/scopes/v/sessions",
                json={"session_id": "s-late", "messages": [{"content": "late"}]},
            )
            assert late.status_code == 503 and "shutting down" in late.json()["error"]
            assert http.get("/health").json()["status"] == "draining"
            assert proc.poll() is None  # still serving while the admitted add runs
        finally:
            gate.touch()
        slow.join(30)
    assert [r.status_code for r in held] == [200] and held[0].json()["added"] is True
    assert proc.wait(30) == 0
    assert proc.stdout is not None and "exited cleanly" in proc.stdout.read()
    import evolve

    with evolve.open_memory(program, store, embedder="hashing", notice=lambda _: None) as memory:
        assert [s.session_id for s in memory.history("u")] == ["s-slow"]
        assert memory.history("v") == []
