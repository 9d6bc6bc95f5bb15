"""Landlock: the kernel's unprivileged access control, applied to the sandbox host.

Owns :func:`abi_version` and :func:`restrict`: after :func:`restrict` the calling process (and
anything it could start) may open, create, remove or execute files only beneath the given
directories, may neither bind nor connect TCP sockets (ABI 4 and later), and may neither signal
processes outside its own domain nor connect to abstract UNIX sockets made outside it (ABI 6
and later). Files opened before the call stay usable; that is how the host keeps its pipes.

Invariants:
- Every access right the running kernel's ABI knows is handled, so none is left open by
  omission; a right an older kernel does not know cannot be used on it either.
- Nothing here needs privileges: Landlock needs only ``PR_SET_NO_NEW_PRIVS``, which
  :func:`restrict` sets (it is irreversible, and exec can no longer raise privileges).
- Linux only. On a kernel without Landlock :func:`abi_version` is 0 and :func:`restrict`
  raises :class:`OSError`; the caller says so (see :mod:`sandbox.barrier`).

The ``landlock`` package on PyPI is a development release that handles neither the network
rights nor scoping; the three system calls are small enough to call directly.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# File-system rights by the ABI version that introduced them (bit positions of the uapi).
_FS_RIGHTS = {1: (1 << 13) - 1, 2: 1 << 13, 3: 1 << 14, 5: 1 << 15}
_NET_RIGHTS = 0b11  # ABI 4: bind and connect TCP
_SCOPES = 0b11  # ABI 6: abstract UNIX sockets and signals


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The running kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def _fs_rights(abi: int) -> int:
    return sum(bits for since, bits in _FS_RIGHTS.items() if abi >= since)


def restrict(writable: Iterable[str]) -> dict[str, str]:
    """Confine the calling process to ``writable`` (full access beneath each directory, none
    elsewhere); returns what was restricted, for the isolation report."""
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    attr = _RulesetAttr(_fs_rights(abi), _NET_RIGHTS if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path in writable:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(_fs_rights(abi), fd)
                if libc.syscall(_ADD_RULE, int(ruleset), _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if libc.syscall(_RESTRICT_SELF, int(ruleset), 0):
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(int(ruleset))
    return {
        "landlock": f"ABI {abi}: files only beneath the scratch directory"
        + (", no TCP" if abi >= 4 else "")
        + (", no signals or abstract sockets outside the host" if abi >= 6 else "")
    }
