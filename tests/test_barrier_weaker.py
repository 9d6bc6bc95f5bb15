"""The OS barrier without namespaces (:mod:`sandbox.barrier`): an ordinary user on a kernel
that refuses them, where seccomp and Landlock hold alone.

What is simulated, and how: the confined child loads a seccomp filter that answers
``unshare`` with ``EPERM`` — what such a kernel answers — before it confines itself exactly as
the sandbox host does (:func:`sandbox.host.confine_process`); run as root, it first becomes an
unused, unprivileged uid that owns its scratch directory, as an ordinary user's host does.
Everything after that is the real code path of that mode: no chroot, the machine's network,
IPC and PIDs, the user's own uid. Attack code then runs with the real builtins. The cases
check what no namespace covers: metadata changes to the user's own files outside the scratch
directory, UNIX sockets, System V IPC, and scheduling, limits and signals of another process
of the same uid (the reaper, which a host can see in this mode).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Unavailable
from test_barrier import attack, sysv_objects

from sandbox import barrier

WEAKER = """
import errno, os
import pyseccomp as sc
from sandbox import host as _host
_host.warm_up()  # while root can read the checkout, wherever it is (the host's own order differs)
if os.geteuid() == 0:  # an ordinary user: the owner of the scratch directory
    owner = os.stat(".").st_uid
    os.setgroups([])
    os.setresgid(owner, owner, owner)
    os.setresuid(owner, owner, owner)
refuse = sc.SyscallFilter(sc.ALLOW)
refuse.add_rule(sc.ERRNO(errno.EPERM), "unshare")  # as a kernel without user namespaces
refuse.load()
"""


def _user() -> int:
    """The uid the simulated host runs as: ours, or as root an uid no account holds."""
    if os.geteuid() != 0:
        return os.geteuid()
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    return next(uid for uid in range(47_000, 48_000) if uid not in taken)


class Place:
    """A folder the simulated user owns and can reach by path: its scratch directory and,
    beside it, files of the same user that the host must not touch."""

    def __init__(self) -> None:
        self.uid = _user()
        self.root = Path(tempfile.mkdtemp(prefix="prismem-weaker-"))
        self.root.chmod(0o755)
        self.scratch = self.root / "scratch"
        self.outside = self.root / "outside"
        for folder in (self.scratch, self.outside):
            folder.mkdir()
        self.scratch.chmod(0o1777)  # as sandbox.isolate.Host makes it
        self.mine = self.outside / "mine.txt"
        self.mine.write_text("the user's own file")
        self.mine.chmod(0o600)
        for path in (self.root, self.scratch, self.outside, self.mine):
            os.chown(path, self.uid, self.uid)

    def run(self, code: str) -> dict[str, str]:
        return attack(code, self.root, prelude=WEAKER, scratch=self.scratch)


@pytest.fixture
def place(unavailable: Unavailable) -> Iterator[Place]:
    if barrier.survey().get("seccomp", "unavailable").startswith("unavailable"):
        unavailable("PRISMEM_BARRIER", "no seccomp: the weaker mode has nothing to hold")
    here = Place()
    yield here
    shutil.rmtree(here.root, ignore_errors=True)


def test_the_simulation_is_the_weaker_mode(place: Place) -> None:
    got = place.run("""
        attempt("missing", lambda: isolation["missing"])
        attempt("filesystem", lambda: isolation["filesystem"])
        attempt("seccomp", lambda: isolation["seccomp"])
        attempt("uid", os.getuid)
        """)  # fmt: skip
    assert "namespaces refused" in got["missing"] and "KeyError" in got["filesystem"], got
    assert got["seccomp"].startswith("ALLOWED: 'no sockets"), got
    assert got["uid"] == f"ALLOWED: {place.uid}", got
    assert place.scratch.stat().st_mode & 0o777 == 0o700  # no other user lists or stats it


def test_no_metadata_change_outside_the_scratch(place: Place) -> None:
    before = place.mine.stat()
    got = place.run(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def raw(*args):
            if libc.syscall(*args) == -1:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        path = "{place.mine}"
        attempt("chmod", lambda: os.chmod(path, 0o777))
        attempt("chmod at", lambda: os.chmod("mine.txt", 0o777, dir_fd=os.open(
            "{place.outside}", os.O_PATH)))
        attempt("fchmodat2", lambda: raw(452, -100, path.encode(), 0o777, 0))
        attempt("chown", lambda: os.chown(path, os.getuid(), os.getgid()))
        attempt("lchown", lambda: os.lchown(path, os.getuid(), os.getgid()))
        attempt("utime", lambda: os.utime(path, (0, 0)))
        attempt("utimes", lambda: raw(235, path.encode(), None))
        attempt("setxattr", lambda: os.setxattr(path, "user.prismem", b"1"))
        attempt("removexattr", lambda: os.removexattr(path, "user.prismem"))
        attempt("in scratch", lambda: open("new", "w").write("x"))
        """)
    assert got.pop("in scratch").startswith("ALLOWED"), got
    assert all(v.startswith("denied: PermissionError") for v in got.values()), got
    after = place.mine.stat()
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (
        before.st_mode,
        before.st_uid,
        before.st_mtime_ns,
    )
    assert os.listxattr(place.mine) == []


def test_no_unix_socket_outside(place: Place) -> None:
    path = place.outside / "sock"
    named = socket.socket(socket.AF_UNIX)
    named.bind(str(path))
    os.chmod(path, 0o777)
    named.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0prismem-test-{os.getpid()}")
    abstract.listen()
    try:
        got = place.run(f"""
            import socket
            def connect(address):
                s = socket.socket(socket.AF_UNIX)
                s.connect(address)
                return s.send(b"hello")
            attempt("named", lambda: connect("{path}"))
            attempt("abstract", lambda: connect("\\0prismem-test-{os.getpid()}"))
            attempt("socketpair", socket.socketpair)
            """)
        assert all(v.startswith("denied: PermissionError") for v in got.values()), got
        for listener in (named, abstract):
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        named.close()
        abstract.close()


def test_no_system_v_ipc_without_an_ipc_namespace(place: Place) -> None:
    from test_barrier import IPC_ATTACK

    before = sysv_objects()
    got = place.run(IPC_ATTACK)
    assert sysv_objects() - before == set()
    assert all(v.startswith("denied: PermissionError") for v in got.values()), got


def test_other_processes_of_the_uid_are_out_of_reach(place: Place) -> None:
    """The reaper runs as the host's uid and is visible here: the host may neither signal it
    nor change or read its scheduling, I/O priority or limits."""
    got = place.run("""
        import ctypes, resource, signal
        libc = ctypes.CDLL(None, use_errno=True)
        def raw(*args):
            if libc.syscall(*args) == -1:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        other = os.getppid()
        attempt("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, other, 19))
        attempt("setpriority user", lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19))
        attempt("setpriority group", lambda: os.setpriority(os.PRIO_PGRP, 0, 19))
        attempt("getpriority", lambda: os.getpriority(os.PRIO_PROCESS, other))
        attempt("ioprio_set", lambda: raw(251, 1, other, 7))
        attempt("sched_setaffinity", lambda: os.sched_setaffinity(other, {0}))
        attempt("sched_getaffinity", lambda: os.sched_getaffinity(other))
        attempt("sched_setscheduler", lambda: os.sched_setscheduler(
            other, os.SCHED_IDLE, os.sched_param(0)))
        attempt("prlimit", lambda: resource.prlimit(other, resource.RLIMIT_NOFILE, (8, 8)))
        attempt("read limits", lambda: resource.prlimit(other, resource.RLIMIT_NOFILE))
        attempt("kill", lambda: os.kill(other, 0))
        attempt("sigqueue", lambda: raw(129, other, 0, None))
        attempt("own priority", lambda: os.setpriority(os.PRIO_PROCESS, 0, 1))
        attempt("own limits", lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))
        """)
    for own in ("own priority", "own limits"):
        assert got.pop(own).startswith("ALLOWED"), own
    assert all(v.startswith("denied: PermissionError") for v in got.values()), got


def test_no_keyring_and_no_watching_files(place: Place) -> None:
    """A uid's keyrings are shared by all its processes; inotify would time the user's files."""
    got = place.run(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def raw(*args):
            if libc.syscall(*args) == -1:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        USER_KEYRING = -4
        attempt("keyctl", lambda: raw(250, 0, USER_KEYRING, 1))  # KEYCTL_GET_KEYRING_ID
        attempt("add_key", lambda: raw(248, b"user", b"prismem", b"x", 1, USER_KEYRING))
        attempt("inotify", lambda: raw(294, 0))
        attempt("inotify watch", lambda: raw(254, 0, b"{place.outside}", 0xFFF))
        attempt("fanotify", lambda: raw(300, 0, 0))
        """)
    assert all(v.startswith("denied: PermissionError") for v in got.values()), got
