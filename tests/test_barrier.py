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
    cwd=sys.argv[3], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
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


def attack(
    code: str,
    tmp_path: Path,
    limits: Limits | None = None,
    prelude: str = "",
    scratch: Path | None = None,
) -> dict[str, str]:
    """Run ``code`` (after ``prelude`` and ``HOST``) in a confined child of a stand-in
    optimizer, in ``scratch`` (default: a new one in ``tmp_path``); returns each ``attempt``'s
    outcome by name."""
    if scratch is None:
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        scratch.chmod(0o1777)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            OPTIMIZER,
            prelude + HOST + textwrap.dedent(code),
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
        attempt("unix", lambda: socket.socket(socket.AF_UNIX))
        attempt("socketpair", lambda: socket.socketpair())
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


# System V IPC and POSIX message queues through libc, as a program with ctypes reaches them.
IPC_ATTACK = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
def made(name, *args):
    got = getattr(libc, name)(*args)
    if got == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return got
attempt("shmget", lambda: made("shmget", IPC_PRIVATE, 512 << 20, IPC_CREAT | 0o666))
attempt("shmget by key", lambda: made("shmget", 0x50524953, 1 << 20, IPC_CREAT | 0o666))
attempt("shmctl", lambda: made("shmctl", 0, 2, None))  # IPC_STAT of the first segment
attempt("msgget", lambda: made("msgget", IPC_PRIVATE, IPC_CREAT | 0o666))
attempt("semget", lambda: made("semget", IPC_PRIVATE, 1, IPC_CREAT | 0o666))
attempt("mq_open", lambda: made("mq_open", b"/prismem", os.O_CREAT | os.O_RDWR, 0o600, None))
attempt("mq_unlink", lambda: made("mq_unlink", b"/prismem"))
"""


def sysv_objects() -> set[tuple[str, str]]:
    """Every System V object of this IPC namespace: (kind, id)."""
    found = set()
    for kind in ("shm", "msg", "sem"):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            found.add((kind, line.split()[1]))
    return found


def test_no_system_v_or_posix_ipc(whole_barrier: None, tmp_path: Path) -> None:
    """Denied by seccomp; and what a host might make lives in an IPC namespace of its own."""
    before = sysv_objects()
    got = attack(IPC_ATTACK, tmp_path)
    assert sysv_objects() - before == set()
    assert all(v.startswith("denied: PermissionError") for v in got.values()), got


def test_the_host_has_an_ipc_namespace_of_its_own(whole_barrier: None) -> None:
    code = (
        "import os; from sandbox import barrier; r = barrier.enter(); "
        "print(os.readlink('/proc/self/ns/ipc'), r['namespaces'], sep='|')"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    ipc, namespaces = done.stdout.strip().split("|")
    assert ipc != os.readlink("/proc/self/ns/ipc") and "IPC" in namespaces, done.stdout


def subordinate_ranges() -> list[tuple[int, int]]:
    """Every id range /etc/subuid, /etc/subgid and login.defs give to ordinary users."""
    ranges = []
    for name in ("subuid", "subgid"):
        path = Path("/etc") / name
        for line in path.read_text().splitlines() if path.exists() else []:
            _, first, count = line.split(":")
            ranges.append((int(first), int(first) + int(count) - 1))
    defs = Path("/etc/login.defs")
    words = [line.split() for line in defs.read_text().splitlines()] if defs.exists() else []
    sub = {w[0]: int(w[1]) for w in words if len(w) == 2 and w[0].startswith("SUB_")}
    for kind in ("UID", "GID"):
        ranges.append((sub.get(f"SUB_{kind}_MIN", 100000), sub.get(f"SUB_{kind}_MAX", 600100000)))
    return ranges


def test_throwaway_uids_belong_to_no_subordinate_range(whole_barrier: None) -> None:
    uid, problem = barrier.throwaway_id(os.getpid())
    assert problem is None and uid < 2**31
    if os.geteuid() == 0:  # the uid a real host becomes
        with Host(Limits()) as host:
            uid = int(host.isolation["user"].split()[2].rstrip(","))
    assert not any(first <= uid <= last for first, last in subordinate_ranges()), uid


def test_throwaway_uids_move_past_configured_ranges_or_say_so(tmp_path: Path) -> None:
    base, span, key = barrier.THROWAWAY_BASE, barrier.THROWAWAY_SPAN, 4242
    (tmp_path / "subuid").write_text(f"alice:100000:65536\nbob:{base + 10}:65536\n")
    (tmp_path / "subgid").write_text("alice:100000:65536\n")
    (tmp_path / "passwd").write_text(f"carol:x:{base + span + key}:1::/:/bin/sh\n")
    (tmp_path / "login.defs").write_text("SUB_UID_MAX\t\t700000000\n")
    assert barrier.throwaway_id(key, tmp_path) == (base + 2 * span + key, None)
    (tmp_path / "subgid").write_text(f"dave:{base}:{2**31 - base}\n")
    uid, problem = barrier.throwaway_id(key, tmp_path)
    assert uid == base + key and problem and "dave" in problem
    report = {"namespaces": "x", "filesystem": "x", "processes": "x", "seccomp": "x"}
    assert barrier.complete(report)
    report["ids"] = f"unavailable (throwaway uid {uid}: {problem})"
    assert not barrier.complete(report) and "dave" in barrier.describe(report)


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
