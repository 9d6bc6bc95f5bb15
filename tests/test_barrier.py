"""The OS barrier alone (:mod:`sandbox.barrier`): what code that got past every Python-level
restriction can still do, for root and for an ordinary user.

Each case starts a stand-in optimizer (a process with a canary API key in its environment,
made non-dumpable as :class:`sandbox.isolate.Host` makes the real one) which starts a child
that confines itself exactly as the sandbox host does (:func:`sandbox.host.confine_process`) and
then runs attack code with the interpreter's real builtins — no static checker, no restricted
builtins, no disarmed functions. ``.ci/run`` runs this module as root and again as an ordinary
user made for the purpose; on a kernel that refuses the barrier the cases skip, and with
``PRISMEM_BARRIER=require`` that skip is a failure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import Unavailable

from sandbox import barrier
from sandbox.isolate import Host, Limits

CANARY = "sk-prismem-canary-0123456789"

OPTIMIZER = """
import json, os, subprocess, sys
from sandbox import barrier
barrier.shield_optimizer()
host = subprocess.run(
    [sys.executable, "-I", "-c", sys.argv[1], sys.argv[2], str(os.getpid())],
    cwd=sys.argv[3], capture_output=True, text=True, timeout=60,
    env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"},
)
print(host.stdout, end="")
print(host.stderr[-2000:], end="", file=sys.stderr)
"""

HOST = """
import json, os, sys
from sandbox.host import confine_process
isolation = confine_process(json.loads(sys.argv[1]))
OPTIMIZER_PID = int(sys.argv[2])
def attempt(name, action):
    try:
        outcome = "ALLOWED: " + repr(action())[:200]
    except BaseException as exc:
        outcome = "denied: " + type(exc).__name__ + ": " + str(exc)[:200]
    print(json.dumps({"name": name, "outcome": outcome}), flush=True)
"""


@pytest.fixture
def whole_barrier(unavailable: Unavailable) -> None:
    report = barrier.survey()
    if not barrier.complete(report):
        unavailable("PRISMEM_BARRIER", barrier.describe(report))


def attack(code: str, tmp_path: Path, limits: Limits | None = None) -> dict[str, str]:
    """Run ``code`` (after ``HOST``) in a confined child of a stand-in optimizer; returns each
    ``attempt``'s outcome by name."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            OPTIMIZER,
            HOST + textwrap.dedent(code),
            json.dumps(asdict(limits or Limits())),
            str(scratch),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENAI_API_KEY": CANARY},
    )
    outcomes = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        outcomes[record["name"]] = record["outcome"]
    assert outcomes, f"the confined child printed nothing: {done.stderr[-2000:]}"
    return outcomes


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.sock.close()


def test_the_optimizers_environment_and_memory_are_out_of_reach(
    whole_barrier: None, tmp_path: Path
) -> None:
    got = attack(
        """
        attempt("environ", lambda: open(f"/proc/{OPTIMIZER_PID}/environ", "rb").read())
        attempt("mem", lambda: open(f"/proc/{OPTIMIZER_PID}/mem", "rb").read(1))
        attempt("parent environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read())
        attempt("own environ", lambda: dict(os.environ))
        """,
        tmp_path,
    )
    assert all(v.startswith("denied") for k, v in got.items() if k != "own environ"), got
    assert CANARY not in json.dumps(got)


def test_no_network_not_even_loopback(
    whole_barrier: None, tmp_path: Path, listener: Listener
) -> None:
    got = attack(
        f"""
        import socket
        attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {listener.port}), 2))
        attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        attempt("ipv6", lambda: socket.socket(socket.AF_INET6))
        attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
        """,
        tmp_path,
    )
    assert all(v.startswith("denied") for v in got.values()), got
    assert listener.connections == 0


def test_no_new_process_thread_or_session(whole_barrier: None, tmp_path: Path) -> None:
    got = attack(
        """
        import threading, subprocess
        attempt("fork", os.fork)
        attempt("thread", lambda: threading.Thread(target=print).start())
        attempt("exec", lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"]))
        attempt("subprocess", lambda: subprocess.run(["/bin/true"]))
        attempt("setsid", os.setsid)
        attempt("kill the optimizer", lambda: os.kill(OPTIMIZER_PID, 0))
        attempt("kill the group", lambda: os.kill(0, 0))
        """,
        tmp_path,
    )
    assert all(v.startswith("denied") for v in got.values()), got


def test_files_only_in_a_capped_scratch(whole_barrier: None, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)  # world-writable: only the barrier keeps the host out
    repo_file = Path(__file__)
    got = attack(
        f"""
        attempt("write outside", lambda: open("{outside}/pwned", "w").write("x"))
        attempt("read the repository", lambda: open("{repo_file}").read(10))
        attempt("read /etc/passwd", lambda: open("/etc/passwd").read(10))
        attempt("write in scratch", lambda: open("ok", "w").write("x"))
        attempt("fill scratch", lambda: [open(f"big{{i}}", "wb").write(b"x" * (15 << 20))
                                          for i in range(6)])
        attempt("many files", lambda: [open(f"f{{i}}", "w").close() for i in range(400)])
        attempt("chroot out", lambda: os.chroot("/"))
        attempt("mount", lambda: __import__("ctypes").CDLL(None).mount(b"x", b"/", b"tmpfs",
                                                                          0, None) and 1/0)
        """,
        tmp_path,
        Limits(scratch_mb=64, scratch_files=256),
    )
    assert got["write in scratch"].startswith("ALLOWED"), got
    for name in ("write outside", "read the repository", "read /etc/passwd", "chroot out"):
        assert got[name].startswith("denied"), (name, got[name])
    assert "No space left" in got["fill scratch"], got["fill scratch"]
    assert "No space left" in got["many files"], got["many files"]
    assert got["mount"].startswith("denied"), got["mount"]
    assert list(outside.iterdir()) == []


def test_two_live_hosts_never_share_a_throwaway_uid(whole_barrier: None) -> None:
    with Host(Limits()) as one, Host(Limits()) as two:
        users = {one.isolation["user"], two.isolation["user"]}
    if os.geteuid() == 0:
        assert len(users) == 2 and all(u.startswith("throwaway uid") for u in users), users
    else:
        assert users == {"own uid, no capabilities"}


def test_the_host_dies_with_its_reaper(whole_barrier: None) -> None:
    """Killing the reaper alone kills the host too, as root (after its change of uid) and as
    an ordinary user: nothing of the sandbox outlives it."""
    host = Host(Limits())
    try:
        group = host.proc.pid  # the reaper leads the group the host runs in
        os.kill(group, signal.SIGKILL)
        host.proc.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the host outlived its reaper")
    finally:
        host.kill()


def test_the_cli_line_names_what_is_missing() -> None:
    line = barrier.describe({"network": "not isolated", "missing": "namespaces refused (EPERM)"})
    assert line.startswith("sandbox: WEAKER ISOLATION") and "EPERM" in line
    assert "namespaces" in line and "seccomp" in line
    assert barrier.describe(barrier.survey()).startswith("sandbox:")


REFUSE_NAMESPACES = """
import errno, os, sys
import pyseccomp as sc
rules = sc.SyscallFilter(sc.ALLOW)
rules.add_rule(sc.ERRNO(errno.EPERM), "unshare")  # as a kernel without user namespaces does
rules.load()
os.execv(sys.executable, [sys.executable, "-m", "evolve", *sys.argv[1:]])
"""


@pytest.mark.parametrize("strict", [False, True], ids=["auto", "strict"])
def test_a_kernel_that_refuses_namespaces_is_named_in_one_line(strict: bool) -> None:
    seed = Path(__file__).parent.parent / "seeds" / "dense.py"
    flags = ["--isolation", "strict"] if strict else []
    done = subprocess.run(
        [sys.executable, "-c", REFUSE_NAMESPACES, "check", *flags, str(seed)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if "WEAKER ISOLATION" in line]
    assert len(lines) == 1, done.stderr[-2000:]
    assert "namespaces" in lines[0] and "Operation not permitted" in lines[0]
    if strict:
        assert done.returncode == 2 and lines[0].startswith("error: sandbox:"), done.stderr
        assert "Traceback" not in done.stderr
    else:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "passed" in done.stdout
