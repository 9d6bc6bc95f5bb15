r"""Red team corpus for the walls (issue 40): attacks by code that holds the real builtins.

Every case assumes what the design rule assumes: the program reached the interpreter's real
builtins (through ``print.__self__``, which tier 1 refuses but a host does not) and can time
anything it touches; only the OS barrier (:mod:`sandbox.barrier`) and the optimizer's own
checks must hold. Each case asserts containment. Eight of them got through when the red team
wrote them (SIGIO by ``fcntl`` on a kernel whose Landlock does not scope signals, a folder the
host made unreadable left behind, memory held in ``memfd``\ s past ``RLIMIT_AS``, forged
``units`` answers used unchecked, host text in a state's reason); each is closed now and
its case guards the fix.

Cases run as root and as an ordinary user (``.ci/run``); those that need the barrier skip
where the kernel refuses it, and fail with ``PRISMEM_BARRIER=require``. The weaker mode (no
namespaces) is simulated as :mod:`test_barrier_weaker` does, and "an older kernel" by making
:func:`sandbox.landlock.abi_version` answer a lower ABI before the host confines itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MINIMAL, Unavailable, unchecked
from test_barrier import attack
from test_barrier_weaker import WEAKER, Place

from contract.types import Message, Segment
from evolve.evaluation.pipeline import Pipeline
from evolve.models.embed import HashingEmbedder
from sandbox import barrier
from sandbox.isolate import HostFailure, Limits, ProgramFailure, remove_tree

REPO = Path(__file__).resolve().parent.parent
F_SETSIG, F_SETOWN_EX = 10, 15


@pytest.fixture
def whole_barrier(unavailable: Unavailable) -> None:
    report = barrier.survey()
    if not barrier.complete(report):
        unavailable("PRISMEM_BARRIER", barrier.describe(report))


@pytest.fixture
def place(unavailable: Unavailable) -> Iterator[Place]:
    """The weaker mode's folders (:mod:`test_barrier_weaker`); removed afterwards whatever
    the host made unreadable in them (this process is not confined)."""
    if barrier.survey().get("seccomp", "unavailable").startswith("unavailable"):
        unavailable("PRISMEM_BARRIER", "no seccomp: the weaker mode has nothing to hold")
    here = Place()
    yield here
    for folder, dirs, _ in os.walk(here.root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o700)
    hidden = here.scratch / "hidden"
    if hidden.exists():
        hidden.chmod(0o700)
    shutil.rmtree(here.root, ignore_errors=True)


# -- signals through SIGIO (fcntl F_SETOWN / F_SETSIG), which seccomp does not filter -----------

SIGIO_ATTACK = """
import fcntl, signal, struct
def sigio(target, how):
    r, w = os.pipe()
    if how == "owner":
        fcntl.fcntl(r, fcntl.F_SETOWN, target)
    elif how == "group":
        fcntl.fcntl(r, fcntl.F_SETOWN, -target)
    else:  # F_SETOWN_EX, F_OWNER_PID
        fcntl.fcntl(r, 15, struct.pack("ii", 1, target))
    fcntl.fcntl(r, 10, signal.SIGKILL)  # F_SETSIG: the signal SIGIO is sent as
    fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
    os.write(w, b"x")  # the kernel now signals the owner of r
    return "written"
for how in ("owner", "group", "ex"):
    attempt(how, lambda: sigio(TARGET, how))
"""


@pytest.fixture
def sleeper_factory() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _sleeper(started: list[subprocess.Popen[bytes]], uid: int | None = None) -> int:
    """A process of ``uid`` (default ours) in a process group of its own; its PID."""
    kwargs = {} if uid is None or uid == os.geteuid() else {"user": uid, "group": uid}
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True, **kwargs)  # type: ignore[call-overload]
    started.append(proc)
    return int(proc.pid)


def test_sigio_signals_nothing_outside_the_host(
    whole_barrier: None, tmp_path: Path, sleeper_factory: list[subprocess.Popen[bytes]]
) -> None:
    """The PID namespace hides every other process: no owner outside can be named."""
    target = _sleeper(sleeper_factory)
    got = attack(f"TARGET = {target}\n" + SIGIO_ATTACK, tmp_path)
    time.sleep(0.2)
    assert sleeper_factory[0].poll() is None, got


def test_weaker_mode_sigio_is_held_by_landlock_scopes(
    place: Place, sleeper_factory: list[subprocess.Popen[bytes]]
) -> None:
    """Without namespaces the host sees the user's processes; Landlock ABI 6 scopes signals."""
    target = _sleeper(sleeper_factory, place.uid)
    got = place.run(f"TARGET = {target}\n" + SIGIO_ATTACK)
    time.sleep(0.2)
    assert sleeper_factory[0].poll() is None, got


def test_weaker_mode_sigio_on_a_kernel_without_landlock_scopes(
    place: Place, sleeper_factory: list[subprocess.Popen[bytes]]
) -> None:
    target = _sleeper(sleeper_factory, place.uid)
    older = "import sandbox.landlock as _ll\n_ll.abi_version = lambda: 5\n"
    got = attack(
        f"TARGET = {target}\n" + SIGIO_ATTACK + 'attempt("abi", lambda: isolation["landlock"])',
        place.root,
        prelude=older + WEAKER,
        scratch=place.scratch,
    )
    assert "ABI 5" in got["abi"], got
    time.sleep(0.2)
    assert sleeper_factory[0].poll() is None, got


# -- leaving things behind --------------------------------------------------------------------


def test_weaker_mode_leaves_nothing_in_the_scratch(place: Place) -> None:
    got = place.run("""
        import posix
        def hide():
            posix.mkdir("hidden", 0o300)
            with open("hidden/left", "w") as f:
                f.write("x" * 100)
            return "made"
        attempt("hide", hide)
        """)  # fmt: skip
    assert got["hide"].startswith("ALLOWED") or "denied" in got["hide"], got
    remove_tree(str(place.scratch))  # what Host.kill does
    assert not place.scratch.exists(), got


def test_memfd_and_pipes_hold_no_memory_past_the_limits(
    whole_barrier: None, tmp_path: Path
) -> None:
    """Anonymous files and pipe buffers are not counted in RLIMIT_AS: the host may hold no
    more than its address space and its scratch allow (memory_mb + scratch_mb)."""
    got = attack(
        """
        import fcntl
        def hoard():
            held, fds = 0, []
            chunk = b"x" * (1 << 20)
            while held < (640 << 20):
                try:
                    fd = os.memfd_create("hoard")
                except OSError:
                    break
                fds.append(fd)
                try:
                    for _ in range(16):
                        os.write(fd, chunk)
                        held += len(chunk)
                except OSError:
                    break
            return held >> 20
        attempt("memfd MiB", hoard)
        """,
        tmp_path,
        Limits(memory_mb=256, scratch_mb=16),
    )
    outcome = got["memfd MiB"]
    held = int(outcome.split(": ")[1]) if outcome.startswith("ALLOWED") else 0
    assert held <= 256 + 16, got


# -- the process limits and the lifeline ------------------------------------------------------


def test_no_resource_limit_can_be_raised(whole_barrier: None, tmp_path: Path) -> None:
    got = attack(
        """
        import resource
        for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_FSIZE"):
            which = getattr(resource, name)
            soft, hard = resource.getrlimit(which)
            attempt(name, lambda: resource.setrlimit(which, (hard + 1 << 20, hard + 1 << 20)))
            attempt("prlimit " + name, lambda: resource.prlimit(0, which,
                                                                 (hard + 1 << 20,) * 2))
        """,
        tmp_path,
    )
    assert all(v.startswith("denied") for v in got.values()), got


OUTLIVE = """
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
from sandbox.isolate import Host, Limits
host = Host(Limits(cpu_seconds=60, call_seconds=60))
host.call("load", {"source": sys.argv[1], "path": "p.py"})
reaper = host.proc.pid
children = open(f"/proc/{reaper}/task/{reaper}/children").read().split()
print(json.dumps([host.scratch, reaper, *map(int, children)]), flush=True)
host.call("open", {"dim": 8, "max_complete_calls": 0}, timeout=60)
"""


def test_a_host_that_clears_its_death_signal_dies_with_its_killed_optimizer(
    whole_barrier: None,
) -> None:
    """The host clears PR_SET_PDEATHSIG and ignores what it can; the optimizer is killed -9."""
    source = MINIMAL.replace(
        "        self.units = []\n",
        "        self.units = []\n"
        "        B = print.__self__\n"
        "        ctypes, signal = B.__import__('ctypes'), B.__import__('signal')\n"
        "        ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\n"
        "        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):\n"
        "            signal.signal(s, signal.SIG_IGN)\n"
        "        while True:\n"
        "            pass\n",
    )
    optimizer = subprocess.Popen(
        [sys.executable, "-c", OUTLIVE, source, str(REPO)], stdout=subprocess.PIPE, text=True
    )
    scratch = ""
    try:
        assert optimizer.stdout is not None
        scratch, *pids = json.loads(optimizer.stdout.readline())
        time.sleep(0.5)  # the host is in its loop
        optimizer.kill()
        optimizer.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), pids
    finally:
        optimizer.kill()
        optimizer.wait()
        if scratch:  # the killed optimizer could not remove it
            shutil.rmtree(scratch, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# -- answers the optimizer trusts ---------------------------------------------------------------

FORGE = """
B = print.__self__
serve = B.__import__("sandbox.serve").serve
@@PATCH@@
"""


def _pipeline(patch: str) -> Pipeline:
    source = MINIMAL.replace(
        "from dataclasses import dataclass\n",
        "from dataclasses import dataclass\n" + FORGE.replace("@@PATCH@@", textwrap.dedent(patch)),
    )
    return Pipeline(unchecked(source), llm=None, embedder=HashingEmbedder(), call_prefix="t",
                    max_complete_calls=0, call_timeout=20.0)  # fmt: skip


SEGMENT = Segment("s1", "2024-01-01", (Message("m1", "user", "hello there"),))


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param('"x" * 1000', id="str"),
        pytest.param("[1, 2, 3]", id="ints"),
        pytest.param('{"content": "a"}', id="dict"),
        pytest.param('[{"content": 5}]', id="wrong-type"),
        pytest.param('[{"nope": "a"}]', id="unknown-field"),
    ],
)
def test_a_forged_units_answer_fails_the_program_not_the_optimizer(forged: str) -> None:
    """A host answers ``units`` with anything; the optimizer must find it out at once (the
    units go to the step cache, reused by every program of the same extract fingerprint),
    as the program's failure, not as its own bug."""
    pipeline = _pipeline(f"serve.Server.op_units = lambda self, req, blobs: ({forged}, [])\n")
    try:
        with pytest.raises((ProgramFailure, HostFailure)):
            units = pipeline.units(SEGMENT, None)
            pipeline.open()
            pipeline.add(SEGMENT, units)
    finally:
        pipeline.close()


def test_a_dump_reason_reaches_the_optimizer_printable() -> None:
    pipeline = _pipeline("""
        def _refuse(*args, **kwargs):
            raise ValueError("\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mfake verdict: passed")
        serve.dump_state = _refuse
        """)
    try:
        pipeline.open()
        pipeline.add(SEGMENT, [{"content": "hello"}])
        dumped = pipeline.dump()
        assert dumped.state is None
        assert "\x1b" not in str(dumped.reason) and "\x07" not in str(dumped.reason)
    finally:
        pipeline.close()


def test_a_forged_retrieval_is_held_to_the_budget_by_the_optimizer() -> None:
    pipeline = _pipeline(
        "serve.Server.op_retrieve = lambda self, req, blobs: "
        '({"text": "y" * 900_000, "raw_chars": 1}, [])\n'
    )
    try:
        pipeline.open()
        pipeline.add(SEGMENT, [{"content": "hello"}])
        query = pipeline.query("what?", None, None)
        got = pipeline.retrieve(query)
        text = got if isinstance(got, str) else json.dumps(got, default=str)
        assert len(text) <= 17_000, len(text)
    finally:
        pipeline.close()


def test_signals_to_the_reaper_by_number_are_refused(whole_barrier: None, tmp_path: Path) -> None:
    """Every signal-sending call with any pid but the host's own, incl. -1 and the group."""
    got = attack(
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def raw(*args):
            if libc.syscall(*args) == -1:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        for pid in (-1, 0, 2, OPTIMIZER_PID, -OPTIMIZER_PID):
            attempt(f"kill {pid}", lambda: raw(62, pid, 0))
            attempt(f"tgkill {pid}", lambda: raw(234, pid, pid, 0))
            attempt(f"sigqueue {pid}", lambda: raw(129, pid, 0, None))
        attempt("pidfd", lambda: raw(434, OPTIMIZER_PID, 0))
        attempt("timer to another", lambda: raw(222, 1, None, None) and 1 / 0)
        """,
        tmp_path,
    )
    allowed = {k: v for k, v in got.items() if not v.startswith("denied")}
    # timer_create on this process's own clock with no sigevent is harmless (signals itself)
    allowed.pop("timer to another", None)
    assert not allowed, allowed
