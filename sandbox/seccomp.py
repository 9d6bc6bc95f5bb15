"""The seccomp filter of the sandbox host: the system calls a confined program may not make.

Owns :func:`restrict`, which :func:`sandbox.barrier.lock` calls last, and the review below.
The filter holds in every mode — with the namespaces of :mod:`sandbox.barrier` and where the
kernel refused them — so it closes on its own what a namespace would otherwise close.

What a program with the real builtins could share with another process or user, and what closes
it (the namespaces where the kernel gives them; seccomp, the chroot or Landlock in every mode):

- System V shared memory, message queues, semaphores and POSIX message queues, named per IPC
  namespace and kept after their creator exits: a private IPC namespace, freed with the host,
  and seccomp denies every call (``shm*``, ``msg*``, ``sem*``, ``ipc``, ``mq_*``).
- POSIX shared memory (``/dev/shm``) and every other file, lock or FIFO outside the scratch
  directory: the chroot, else Landlock. Landlock does not govern a file's metadata, so seccomp
  denies every ``chmod``, ``chown``, ``utime`` and ``setxattr``/``removexattr`` form (the host
  needs none: it only reads its libraries and writes new files in its scratch).
- Sockets: the network namespace (TCP, UDP, abstract UNIX names), Landlock's scope (abstract
  names, ABI 6) and seccomp, which denies ``socket``, ``socketpair``, ``bind``, ``connect``,
  ``listen`` and ``accept`` outright: the host talks over the pipes it was started with, and
  the libraries it loads (bm25s brings ``socket`` and ``multiprocessing``) open none.
- Other processes: the PID namespace hides them; seccomp allows signals (``kill``, ``tkill``,
  ``tgkill``, ``rt_*sigqueueinfo``) only to the host itself, scheduling, I/O priority, limits
  and robust-list reads (``*priority``, ``ioprio_*``, ``sched_*``, ``prlimit64``,
  ``get_robust_list``) only with pid 0, and denies ``ptrace``, ``process_vm_*``, ``kcmp``,
  ``pidfd_*``, ``process_madvise``, ``process_mrelease``, ``migrate_pages`` and
  ``move_pages``. Hosts and reapers are non-dumpable: no process of their uid may open their
  ``/proc`` memory or attach to them.
- Signals sent by the kernel on the host's behalf: ``fcntl`` ``F_SETOWN``/``F_SETOWN_EX`` (with
  ``F_SETSIG``, any signal, SIGKILL included, to the owner when a descriptor becomes ready —
  Landlock below ABI 6 does not scope it) and the lease and directory notices (``F_SETLEASE``,
  ``F_NOTIFY``) are denied.
- Memory the address-space limit does not count: ``memfd_create``/``memfd_secret`` and
  ``F_SETPIPE_SZ`` are denied (a program's files live in its capped tmpfs).
- Keyrings (a uid's user and session keyrings are shared by all its processes): seccomp denies
  ``keyctl``, ``add_key`` and ``request_key``.
- Watching files (``inotify``, ``fanotify``), the kernel log (``syslog``), typing into a
  terminal (``ioctl`` ``TIOCSTI``/``TIOCLINUX``), BPF, perf, io_uring, userfaultfd, modules:
  denied. Calls newer than this review (numbers 470–511 where every architecture shares them)
  answer ``ENOSYS``, as an older kernel does; another architecture's calls kill the host.
- Hostname, clock, devices, quotas need capabilities the host no longer holds.
- The scratch directory: a tmpfs of the host's own uid, mode 0700; without a mount namespace
  the host makes its directory 0700, so another user can neither list nor stat what it writes.

What remains between hosts is timing (CPU, caches, memory pressure), which no step here
removes. Without namespaces (a kernel that refuses them) there is no chroot for an ordinary
user, the network and IPC are the machine's, and other processes of the uid are visible:
seccomp and Landlock then hold alone, and ``stat`` of paths outside the scratch directory
still works (Landlock does not govern it).

Invariants: every call is denied with ``EPERM`` (``ENOSYS`` for calls newer than the review), so
a program sees an ordinary error and the host's own code keeps running; the filter is loaded
after ``PR_SET_NO_NEW_PRIVS`` and cannot be lifted; calls are named through libseccomp, and a
call this architecture lacks is skipped.
"""

from __future__ import annotations

import errno
import platform
from typing import Any

try:  # bound at import: after the chroot nothing can be imported
    import pyseccomp as _sc
except (ImportError, OSError, RuntimeError) as _exc:  # no libseccomp on this machine
    _sc, _SECCOMP_MISSING = None, f"libseccomp not loadable: {_exc}"

SUMMARY = (
    "no sockets, System V or POSIX IPC, exec, fork, ptrace, namespaces, metadata changes, "
    "or signals, scheduling and limits of other processes"
)


_DENIED_CALLS = (
    "execve", "execveat", "fork", "vfork", "clone3", "ptrace", "process_vm_readv",
    "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "setsid",
    "setpgid", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "bpf",
    "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "quotactl_fd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "open_by_handle_at", "name_to_handle_at", "personality", "setuid",
    "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "capset",
    "landlock_create_ruleset", "uselib", "syslog",
    # System V IPC and POSIX message queues
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget",
    "semop", "semtimedop", "semctl", "ipc", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr",
    # sockets of every family
    "socket", "socketpair", "socketcall", "bind", "connect", "listen", "accept", "accept4",
    # file metadata, which Landlock does not govern
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "utime", "utimes", "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr",
    "removexattr", "lremovexattr", "fremovexattr",
    # watching files; other processes' memory
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
    "migrate_pages", "move_pages", "process_madvise", "process_mrelease",
    # memory outside RLIMIT_AS
    "memfd_create", "memfd_secret",
)  # fmt: skip
# Calls older libseccomp does not name; their numbers are the same on the architectures below.
_UNNAMED_CALLS = {"setxattrat": 463, "removexattrat": 466, "file_setattr": 469}
_UNIFIED = {"x86_64", "aarch64", "riscv64", "s390x", "ppc64le", "loongarch64"}
_UNREVIEWED = range(470, 512)  # newer than this review: ENOSYS, as an older kernel answers
# Calls that may act on (or read) the calling process only: (call, argument holding the pid).
_SELF_ONLY = (
    ("prlimit64", 0), ("sched_setaffinity", 0), ("sched_getaffinity", 0),
    ("sched_setscheduler", 0), ("sched_getscheduler", 0), ("sched_setparam", 0),
    ("sched_getparam", 0), ("sched_setattr", 0), ("sched_getattr", 0),
    ("sched_rr_get_interval", 0), ("get_robust_list", 0), ("setpriority", 1),
    ("getpriority", 1), ("ioprio_set", 1), ("ioprio_get", 1),
)  # fmt: skip
_WHO = (("setpriority", 0), ("getpriority", 0), ("ioprio_set", 1), ("ioprio_get", 1))  # a process
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
# fcntl commands that signal another process (SIGIO to an owner: F_SETOWN, F_SETOWN_EX, with
# F_SETSIG any signal), watch a directory (F_NOTIFY) or file (F_SETLEASE), or grow a pipe's
# buffer outside RLIMIT_AS (F_SETPIPE_SZ)
_FCNTL_DENIED = (8, 15, 10, 1026, 1024, 1031)


def restrict(pid: int) -> None:
    """Load the filter into this process (``pid``: its own, the one signals may reach)."""
    sc = _sc
    if sc is None:
        raise RuntimeError(_SECCOMP_MISSING)
    rules = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)

    def add(action: int, call: str | int, *args: Any) -> None:
        number = sc.resolve_syscall(sc.Arch.NATIVE, call) if isinstance(call, str) else call
        if number == -1 and call in _UNNAMED_CALLS and platform.machine() in _UNIFIED:
            number = _UNNAMED_CALLS[str(call)]
        if number != -1:  # -1: a call this architecture lacks
            rules.add_rule(action, number, *args)

    for name in (*_DENIED_CALLS, *_UNNAMED_CALLS):
        add(deny, name)
    if platform.machine() in _UNIFIED:
        for number in _UNREVIEWED:
            add(sc.ERRNO(errno.ENOSYS), number)
    add(deny, "clone")  # threads too: the host runs one
    for name in ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        add(deny, name, sc.Arg(0, sc.NE, pid))
    for name, arg in _SELF_ONLY:
        add(deny, name, sc.Arg(arg, sc.NE, 0))
    for name, who in _WHO:
        add(deny, name, sc.Arg(0, sc.NE, who))
    for request in (_TIOCSTI, _TIOCLINUX):  # the kernel reads the low 32 bits only
        add(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFF_FFFF, request))
    for command in _FCNTL_DENIED:
        for name in ("fcntl", "fcntl64"):
            add(deny, name, sc.Arg(1, sc.MASKED_EQ, 0xFFFF_FFFF, command))
    rules.load()
