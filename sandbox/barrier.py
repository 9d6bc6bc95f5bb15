"""The OS barrier around the sandbox host: what the kernel enforces, for root and for everyone.

Owns the steps :mod:`sandbox.host` takes, in this order, before any candidate code is read:

1. :func:`enter` — new namespaces. As an ordinary user: user, mount, network, PID and IPC
   namespaces (``unshare``; the user's own uid and gid are mapped, nothing else). As root:
   mount, network, PID and IPC namespaces, and later a throwaway uid. Then, whatever the kernel
   gave, the process forks: the parent stays outside as a *reaper* that runs no program code
   (it waits and passes on the child's exit status), and the child becomes the host — PID 1 of
   the new PID namespace, where there is one, so that its death kills everything in it. The
   host dies with the reaper (``PR_SET_PDEATHSIG``, set again after a change of uid, which
   clears it) and the reaper kills the host when the optimizer dies: its lifeline is a copy of
   the host's stdin, a pipe whose only write end the optimizer holds, so the pipe hangs up when
   the optimizer is gone, ``kill -9`` included, whichever thread started the host.
2. :func:`confine_files` — after the host has imported what programs may use: an empty tmpfs
   capped in bytes and files is mounted on the scratch directory and the host ``chroot``\\ s
   into it, so the rest of the file system, ``/proc`` and ``/dev/shm`` included, is gone. As
   root it then becomes a throwaway uid with no groups (:func:`throwaway_id`); as an ordinary
   user it drops every capability it holds in its namespace.
3. :func:`lock` — ``RLIMIT_NPROC`` = 1 (no new process or thread), Landlock (files only beneath
   the new root, no TCP, no signals or abstract sockets outside; :mod:`sandbox.landlock`), no
   longer dumpable, and a seccomp filter (:mod:`sandbox.seccomp`).

Throwaway ids: ``base + the reaper's PID``, unique among live hosts. The base is the first of
:data:`THROWAWAY_BASE` + k·2²² (PIDs stay below 2²²) whose block meets no subordinate range of
``/etc/subuid`` or ``/etc/subgid`` nor ``SUB_UID_MIN``–``SUB_UID_MAX`` / ``SUB_GID_MIN``–
``SUB_GID_MAX`` of ``login.defs`` (default 100000–600100000), and whose id no line of
``/etc/passwd`` or ``/etc/group`` holds, below systemd's foreign range (0x7FFE0000) and 2³¹.
Where none is left the report's ``ids`` entry names the overlap: a missing step.

What a program with the real builtins could share with another process or user, and what
closes it, is reviewed in :mod:`sandbox.seccomp`'s docstring.

Where the kernel refuses a step (no unprivileged user namespaces, no Landlock, no libseccomp),
the host carries on with what it got and reports it: :func:`describe` turns the report into one
line, and :func:`survey` measures, without running a host, what this machine would give, so the
CLI can say it at the start of ``check``, ``run`` and ``eval`` and ``--isolation strict`` can
refuse to run without the whole barrier.

:func:`shield_optimizer` makes the calling (optimizer) process non-dumpable, so a host that got
past everything still cannot read its memory or environment (``/proc/<pid>/mem``,
``/proc/<pid>/environ``: the API keys) or attach to it.

Invariants: every step is idempotent in its report (what was obtained, by name); none of them
needs root; a step that fails never leaves the host half-confined silently — the report names
what is missing; the reaper exists in every mode and never runs program code.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sandbox import landlock, seccomp

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC = 0x08000000
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 1, 4, 38

# 0x78000000: above login.defs' SUB_UID_MAX default (600100000), systemd's container ranges
# (524288-1879048191) and SSSD's default ID-mapping range (200000-2000200000).
THROWAWAY_BASE = 0x7800_0000
THROWAWAY_SPAN = 1 << 22  # PID_MAX_LIMIT on 64-bit: base + PID never leaves the block
_THROWAWAY_END = 0x7FFE_0000  # systemd's foreign range begins here; 2**31 above it
ISOLATION_ENV = "PRISMEM_ISOLATION"  # "strict": no host starts without the whole barrier
FULL = ("namespaces", "filesystem", "processes", "seccomp")  # what a whole barrier reports
_IF_REPORTED = ("ids",)  # steps that are missing when reported (see throwaway_id)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _fail(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# -- step 1: namespaces and the reaper ---------------------------------------------------------


def enter() -> dict[str, Any]:
    """Enter new namespaces where the kernel allows and fork; returns in the child (the host)
    only, with the report (``reaper``: the reaper's PID)."""
    libc = _libc()
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
    got: dict[str, Any] = {}
    if libc.unshare(flags | (0 if root else CLONE_NEWUSER)) == 0:
        if not root:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        got["namespaces"] = ("" if root else "user, ") + "mount, network, PID, IPC"
    else:
        reason = os.strerror(ctypes.get_errno())
        threads = len(os.listdir("/proc/self/task"))
        if threads > 1:
            reason += f": the process already runs {threads} threads"
        # Some may still be possible alone (root in a container without CLONE_NEWPID).
        got["network"] = "namespace" if libc.unshare(CLONE_NEWNET) == 0 else "not isolated"
        got["ipc"] = "namespace" if libc.unshare(CLONE_NEWIPC) == 0 else "not isolated"
        got["missing"] = f"namespaces refused by the kernel ({reason})"
    reaper = os.getpid()
    child = os.fork()
    if child:
        _reap(child)  # never returns
    got["reaper"] = reaper
    _die_with_parent(reaper)
    return got


def _die_with_parent(reaper: int) -> None:
    """SIGKILL this process when its parent (the reaper) dies. The kernel clears this on every
    change of uid or gid, so :func:`_become_throwaway` sets it again. A parent outside the PID
    namespace reads as 0; any other parent than the reaper means it is already gone."""
    if _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0):
        os._exit(1)
    if os.getppid() not in (0, reaper):
        os._exit(1)


def _reap(child: int) -> None:
    """The reaper: run no program code, wait for the child and die as it died. It closes the
    host's stdout (the optimizer reads its end when the host dies) and keeps one lifeline: fd
    0, the host's stdin, when it is a pipe. Polled for hang-up only (the requests in it never
    wake the reaper), it hangs up when every write end is closed — the optimizer died — and
    the reaper then kills the child."""
    os.close(1)
    _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    watch = select.poll()
    try:
        lifeline = stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:
        lifeline = False
    if lifeline:
        watch.register(0, select.POLLHUP)
    else:
        os.close(0)
    tick: int | None = None
    try:
        watch.register(os.pidfd_open(child), select.POLLIN)  # readable when the child exits
    except (AttributeError, OSError):  # a kernel before 5.3: look every 50 ms
        tick = 50
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            break
        for fd, _ in watch.poll(tick):
            if fd == 0:  # the optimizer is gone
                os.kill(child, signal.SIGKILL)
                watch.unregister(0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


# -- step 2: the file system and the uid --------------------------------------------------------


def confine_files(report: dict[str, Any], scratch_mb: int, scratch_files: int) -> None:
    """Chroot into a fresh, capped tmpfs on the working directory; then drop root or every
    capability. Without :func:`enter`'s mount namespace root chroots into the working directory
    itself (no size cap) and becomes a throwaway uid; an ordinary user makes it private (0700)."""
    root = os.geteuid() == 0
    uid = _throwaway(report) if root else -1  # before the chroot: it reads /etc
    if "namespaces" not in report:
        if root:
            os.chroot(".")
            os.chdir("/")
            report["filesystem"] = "chroot to the scratch directory (size not capped)"
            _become_throwaway(report, uid)
        else:
            os.chmod(".", 0o700)
        return
    libc = _libc()
    here = os.getcwd().encode()
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None):
        raise _fail("making mounts private")
    options = f"size={scratch_mb}m,nr_inodes={scratch_files},mode=0700"
    if root:
        options += f",uid={uid},gid={uid}"
    if libc.mount(b"prismem-scratch", here, b"tmpfs", 0, options.encode()):
        raise _fail("mounting the scratch tmpfs")
    os.chdir(here)
    os.chroot(".")
    os.chdir("/")
    report["filesystem"] = f"chroot to a {scratch_mb} MiB tmpfs of at most {scratch_files} files"
    if root:
        _become_throwaway(report, uid)
    else:
        _drop_capabilities()
        report["user"] = "own uid, no capabilities"


def throwaway_id(key: int, etc: Path = Path("/etc")) -> tuple[int, str | None]:
    """The throwaway uid and gid for ``key`` (a live PID, below 2**22), and why it may belong
    to someone (None: it belongs to no configured range and no local user or group)."""
    taken = _reserved(etc)
    ids = {
        int(f[2]) for name in ("passwd", "group") for f in _fields(etc / name)
        if len(f) > 2 and f[2].isdigit()
    }  # fmt: skip
    base = THROWAWAY_BASE
    while base + THROWAWAY_SPAN <= _THROWAWAY_END:
        clash = [f for lo, hi, f in taken if lo < base + THROWAWAY_SPAN and base <= hi]
        if not clash and base + key not in ids:
            return base + key, None
        base += THROWAWAY_SPAN
    clash = [f for lo, hi, f in taken if lo <= THROWAWAY_BASE + key <= hi]
    why = ", ".join(clash) or f"an id of {etc / 'passwd'} or {etc / 'group'}"
    return THROWAWAY_BASE + key, f"no free block of throwaway ids below 2**31; it lies in {why}"


def _fields(path: Path) -> list[list[str]]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line.split(":") for line in lines if line.strip() and not line.startswith("#")]


def _reserved(etc: Path) -> list[tuple[int, int, str]]:
    """Every configured subordinate id range: (first, last, where it is configured)."""
    found = []
    for name in ("subuid", "subgid"):
        for f in _fields(etc / name):
            if len(f) == 3 and f[1].isdigit() and f[2].isdigit() and int(f[2]) > 0:
                first = int(f[1])
                found.append((first, first + int(f[2]) - 1, f"{etc / name} ({':'.join(f)})"))
    defs = dict.fromkeys(("SUB_UID_MIN", "SUB_GID_MIN"), 100_000)
    defs.update(dict.fromkeys(("SUB_UID_MAX", "SUB_GID_MAX"), 600_100_000))
    try:
        for line in (etc / "login.defs").read_text(errors="replace").splitlines():
            words = line.split()
            if len(words) == 2 and words[0] in defs and words[1].isdigit():
                defs[words[0]] = int(words[1])
    except OSError:
        pass  # useradd's built-in defaults, as above
    for kind in ("UID", "GID"):
        first, last = defs[f"SUB_{kind}_MIN"], defs[f"SUB_{kind}_MAX"]
        found.append((first, last, f"login.defs SUB_{kind}_MIN-SUB_{kind}_MAX ({first}-{last})"))
    return found


def _throwaway(report: dict[str, Any]) -> int:
    uid, problem = throwaway_id(report["reaper"])
    if problem:
        report["ids"] = f"unavailable (throwaway uid {uid}: {problem})"
    return uid


def _become_throwaway(report: dict[str, Any], uid: int) -> None:
    """As root: become ``uid`` (and the gid of that number) with no groups; every capability
    goes with root."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _die_with_parent(report["reaper"])  # the kernel clears the parent-death signal here
    report["user"] = f"throwaway uid {uid}, no groups"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities() -> None:
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if _libc().capset(ctypes.byref(header), data):
        raise _fail("dropping capabilities")


# -- step 3: processes, Landlock, seccomp --------------------------------------------------------


def lock(report: dict[str, Any]) -> None:
    """No new processes, Landlock, no dumps, seccomp; records each in ``report``. Call last:
    afterwards the host can no longer mount, chroot, change uid or start anything."""
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    report["processes"] = "none (RLIMIT_NPROC=1, seccomp)"
    try:
        report.update(landlock.restrict(["."]))  # the working directory, by no path
    except OSError as exc:
        report["landlock"] = f"unavailable ({exc.strerror or exc})"
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0):
        raise _fail("PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE")
    try:
        seccomp.restrict(os.getpid())
        report["seccomp"] = seccomp.SUMMARY
    except (ImportError, OSError, RuntimeError) as exc:
        report["seccomp"] = f"unavailable ({exc})"


# -- the optimizer's side ------------------------------------------------------------------------


def shield_optimizer() -> None:
    """Make this process non-dumpable: no host of the same uid may read its memory or its
    environment through /proc, or attach to it. Idempotent; a no-op where prctl is missing."""
    try:
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def strict() -> bool:
    """Whether hosts must refuse to run without the whole barrier (``PRISMEM_ISOLATION``)."""
    return os.environ.get(ISOLATION_ENV) == "strict"


def _obtained(report: dict[str, Any], key: str) -> bool:
    return key in report and not str(report[key]).startswith("unavailable")


def _missing(report: dict[str, Any]) -> list[str]:
    wanted = FULL + tuple(key for key in _IF_REPORTED if key in report)
    return [key for key in wanted if not _obtained(report, key)]


def complete(report: dict[str, Any]) -> bool:
    """Whether a host's report shows the whole barrier."""
    return not _missing(report)


def describe(report: dict[str, Any]) -> str:
    """One line: the barrier a host got, or what it lacks."""
    if complete(report):
        who = "root" if str(report.get("user", "")).startswith("throwaway") else "an ordinary user"
        return (
            f"sandbox: OS barrier for {who} (namespaces {report['namespaces']}; "
            f"{report['filesystem']}; seccomp; {report.get('landlock', 'no Landlock')})"
        )

    missing = _missing(report)
    reasons = [report["missing"]] if "missing" in report else []
    reasons += [
        f"{key}: {report.get(key, 'not obtained')}"
        for key in missing
        if key in _IF_REPORTED or "missing" not in report
    ]
    why = "; ".join(reasons)
    held = [name for key, name in _HELD_BY if _obtained(report, key)]
    held += ["the static checker", "resource limits", "Python-level blocks"]
    return (
        f"sandbox: WEAKER ISOLATION on this machine: no {', '.join(missing)} ({why}); "
        f"candidate code is held only by {', '.join(held)}; --isolation strict refuses to run "
        "without the whole barrier"
    )


_HELD_BY = (("filesystem", "a chroot"), ("processes", "RLIMIT_NPROC"),
            ("landlock", "Landlock"), ("seccomp", "seccomp"))  # fmt: skip


_SURVEY: dict[str, Any] | None = None


def survey() -> dict[str, Any]:
    """What a host would get on this machine, measured once per process by starting a bare
    confinement (no program) in a child interpreter; cached."""
    global _SURVEY
    if _SURVEY is None:
        code = (
            "import json; from sandbox import barrier; "
            "r = barrier.enter(); barrier.confine_files(r, 1, 16); barrier.lock(r); "
            "r.pop('reaper', None); print(json.dumps(r))"
        )
        scratch = tempfile.mkdtemp(prefix="prismem-survey-")
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", code], cwd=scratch, stdin=subprocess.DEVNULL,
                capture_output=True, text=True, timeout=60,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            )  # fmt: skip
            _SURVEY = json.loads(done.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
            _SURVEY = {"missing": f"the barrier could not be surveyed ({type(exc).__name__})"}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return dict(_SURVEY)
