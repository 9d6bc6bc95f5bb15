"""The OS barrier around the sandbox host: what the kernel enforces, for root and for everyone.

Owns the steps :mod:`sandbox.host` takes, in this order, before any candidate code is read:

1. :func:`enter` — new namespaces. As an ordinary user: user, mount, network and PID namespaces
   (``unshare``; the user's own uid and gid are mapped, nothing else). As root: mount, network
   and PID namespaces, and later a throwaway uid. The process then forks: the parent stays
   outside as a *reaper* that runs no program code (it waits and passes on the child's exit
   status), and the child — PID 1 of the new PID namespace — becomes the host. When PID 1
   exits, the kernel kills everything else in its namespace, so nothing a program starts can
   outlive the host; the child also dies with the reaper (``PR_SET_PDEATHSIG``, set again
   after a change of uid, which clears it).
2. :func:`confine_files` — after the host has imported what programs may use: an empty tmpfs
   capped in bytes and files is mounted on the scratch directory and the host ``chroot``\\ s
   into it, so the rest of the file system, ``/proc`` included, is gone. As root it then
   becomes a throwaway uid (100000 + the reaper's PID, so two live hosts never share one) with
   no groups; as an ordinary user it drops every capability it holds in its namespace.
3. :func:`lock` — ``RLIMIT_NPROC`` = 1 (no new process or thread), Landlock (files only beneath
   the new root, no TCP, no signals outside; :mod:`sandbox.landlock`) and a seccomp filter:
   no socket but ``AF_UNIX``, no ``execve``, no ``fork``/``clone``, no ``ptrace`` or
   ``process_vm_*``, no ``kill`` of another process, no ``setsid``, no namespace, mount or
   ``chroot`` calls, no kernel-extension calls (bpf, perf, io_uring, keys, modules).

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
what is missing.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from sandbox import landlock

try:  # bound at import: after the chroot nothing can be imported
    import pyseccomp as _sc
except (ImportError, OSError, RuntimeError) as _exc:  # no libseccomp on this machine
    _sc, _SECCOMP_MISSING = None, f"libseccomp not loadable: {_exc}"

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 1, 4, 38
_AF_UNIX = 1

THROWAWAY_UID_BASE = 100_000
ISOLATION_ENV = "PRISMEM_ISOLATION"  # "strict": no host starts without the whole barrier
FULL = ("namespaces", "filesystem", "processes", "seccomp")  # what a whole barrier reports


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
    """Enter new namespaces and fork; returns in the child (the host) only, with the report."""
    libc = _libc()
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | (0 if root else CLONE_NEWUSER)
    got: dict[str, Any] = {}
    if libc.unshare(flags) == 0:
        if not root:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        got["namespaces"] = "mount, network, PID" if root else "user, mount, network, PID"
    else:
        reason = os.strerror(ctypes.get_errno())
        threads = len(os.listdir("/proc/self/task"))
        if threads > 1:
            reason += f": the process already runs {threads} threads"
        # The network alone may still be possible (root in a container without CLONE_NEWPID).
        got["network"] = "namespace" if libc.unshare(CLONE_NEWNET) == 0 else "not isolated"
        got["missing"] = f"namespaces refused by the kernel ({reason})"
        return got
    reaper = os.getpid()
    child = os.fork()
    if child:
        _reap(child)  # never returns
    got["reaper"] = reaper
    _die_with_parent()
    return got


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the reaper) dies. The kernel clears this on every
    change of uid or gid, so :func:`_become_throwaway` sets it again."""
    if _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0):
        os._exit(1)


def _reap(child: int) -> None:
    """The reaper: hold no pipe, run no program code, wait, and die as the child died."""
    for fd in (0, 1):
        os.close(fd)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


# -- step 2: the file system and the uid --------------------------------------------------------


def confine_files(report: dict[str, Any], scratch_mb: int, scratch_files: int) -> None:
    """Chroot into a fresh, capped tmpfs on the working directory; then drop root or every
    capability. Without :func:`enter`'s mount namespace only root can do anything here: it
    chroots into the working directory itself (no size cap) and becomes a throwaway uid."""
    if "namespaces" not in report:
        if os.geteuid() == 0:
            os.chroot(".")
            os.chdir("/")
            report["filesystem"] = "chroot to the scratch directory (size not capped)"
            _become_throwaway(report, THROWAWAY_UID_BASE + os.getpid())
        return
    libc = _libc()
    here = os.getcwd().encode()
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None):
        raise _fail("making mounts private")
    root = os.geteuid() == 0
    options = f"size={scratch_mb}m,nr_inodes={scratch_files},mode=0700"
    if root:
        options += f",uid={THROWAWAY_UID_BASE + report['reaper']}"
        options += f",gid={THROWAWAY_UID_BASE + report['reaper']}"
    if libc.mount(b"prismem-scratch", here, b"tmpfs", 0, options.encode()):
        raise _fail("mounting the scratch tmpfs")
    os.chdir(here)
    os.chroot(".")
    os.chdir("/")
    report["filesystem"] = f"chroot to a {scratch_mb} MiB tmpfs of at most {scratch_files} files"
    if root:
        _become_throwaway(report, THROWAWAY_UID_BASE + report["reaper"])
    else:
        _drop_capabilities()
        report["user"] = "own uid, no capabilities"


def _become_throwaway(report: dict[str, Any], uid: int) -> None:
    """As root: become ``uid`` (a live process's PID above the base: unique while it lives)
    with no groups; every capability goes with root."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _die_with_parent()  # the kernel clears the parent-death signal when the uid changes
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
    """No new processes, Landlock, seccomp; records each in ``report``. Call last: afterwards
    the host can no longer mount, chroot, change uid or start anything."""
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    report["processes"] = "none (RLIMIT_NPROC=1, seccomp)"
    try:
        report.update(landlock.restrict([os.getcwd()]))
    except OSError as exc:
        report["landlock"] = f"unavailable ({exc.strerror or exc})"
    if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
        raise _fail("PR_SET_NO_NEW_PRIVS")
    try:
        _seccomp(os.getpid())
        report["seccomp"] = "no network sockets, exec, fork, ptrace, namespaces or signals out"
    except (ImportError, OSError, RuntimeError) as exc:
        report["seccomp"] = f"unavailable ({exc})"


_DENIED_CALLS = (
    "execve", "execveat", "fork", "vfork", "clone3", "ptrace", "process_vm_readv",
    "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "setsid",
    "setpgid", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "bpf",
    "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "personality", "setuid", "setgid", "setreuid",
    "setregid", "setresuid", "setresgid", "setgroups", "capset", "landlock_create_ruleset",
)  # fmt: skip


def _seccomp(pid: int) -> None:
    sc = _sc
    if sc is None:
        raise RuntimeError(_SECCOMP_MISSING)
    rules = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in _DENIED_CALLS:
        try:
            rules.add_rule(deny, name)
        except (OSError, RuntimeError, ValueError):  # a call this architecture lacks
            continue
    rules.add_rule(deny, "clone")  # threads too: the host runs one
    rules.add_rule(deny, "socket", sc.Arg(0, sc.NE, _AF_UNIX))
    rules.add_rule(deny, "socketpair", sc.Arg(0, sc.NE, _AF_UNIX))
    rules.add_rule(deny, "kill", sc.Arg(0, sc.NE, pid))
    rules.add_rule(deny, "tkill", sc.Arg(0, sc.NE, pid))
    rules.add_rule(deny, "tgkill", sc.Arg(0, sc.NE, pid))
    rules.load()


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


def complete(report: dict[str, Any]) -> bool:
    """Whether a host's report shows the whole barrier."""
    return all(_obtained(report, key) for key in FULL)


def describe(report: dict[str, Any]) -> str:
    """One line: the barrier a host got, or what it lacks."""
    if complete(report):
        who = "root" if str(report.get("user", "")).startswith("throwaway") else "an ordinary user"
        return (
            f"sandbox: OS barrier for {who} (namespaces {report['namespaces']}; "
            f"{report['filesystem']}; seccomp; {report.get('landlock', 'no Landlock')})"
        )

    missing = [key for key in FULL if not _obtained(report, key)]
    why = report.get("missing") or "; ".join(
        f"{key}: {report.get(key, 'not obtained')}" for key in missing
    )
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
                [sys.executable, "-I", "-c", code], cwd=scratch,
                capture_output=True, text=True, timeout=60,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            )  # fmt: skip
            _SURVEY = json.loads(done.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
            _SURVEY = {"missing": f"the barrier could not be surveyed ({type(exc).__name__})"}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return dict(_SURVEY)
