"""Isolation: every execution of candidate code happens in a confined host process.

:class:`Host` starts ``python -I -m sandbox.host`` in a new OS session (its own process group)
with a throwaway working directory, a minimal environment (no API keys, one BLAS thread) and
the :class:`Limits` serialised on its command line. The host confines itself before it reads
any candidate code (see :mod:`sandbox.host`): a new network namespace, resource limits (CPU
seconds, address space, file size, open files, no new processes) and, when started as root, an
unprivileged throwaway uid. The optimizer talks to it in frames (:mod:`sandbox.wire`) and
answers its backend requests (embeddings, LLM completions) through the ``serve`` callback, so
secrets, models and caches stay on the optimizer's side.

Invariants:
- Every request has a wall-clock deadline; reading, writing and waiting all honour it, whatever
  the descriptors' numbers (``poll``, never ``select``). The optimizer's end of the host's
  input is non-blocking: a write never waits for room, it writes what fits and polls again, so
  a host that stops reading (or reads a page at a time) holds no request, and no ``close``,
  past its deadline; a request ends at most about :data:`GRACE_SECONDS` after its deadline
  whatever the host does. When the deadline passes, or the host breaks the protocol, the whole
  process group is killed (SIGKILL) and :class:`HostFailure` says why (:class:`HostTimeout`
  for the deadline). The optimizer never blocks forever and never unpickles.
- The deadline measures the program, not the optimizer: time spent answering the host's
  backend requests (embedding, LLM calls, which slow down on a busy machine) moves the
  deadline back by as much, up to :data:`BACKEND_EXTENSION` times the request's own timeout,
  so a program cannot stretch a request without bound by calling the backend. Embedding the
  request's own data is not held to that cap: the caller names how many characters of
  embedding the request may ask for (``embed_chars``, e.g. a few times the text of the session
  it indexes), and the time of embed requests within that volume moves the deadline in full,
  however slow the machine (each call counted as at least :data:`EMBED_CALL_CHARS`, so many
  tiny calls use the volume up); beyond it, the cap applies. The work a program can make the
  optimizer do stays bounded by the data it was given.
- Every frame the host sends is bounded by its kind, which the frame declares in its length
  prefix (:mod:`sandbox.wire`), checked before any of it is read: an answer (``result``) by
  what its request can legitimately return (:data:`FRAME_BYTES`; 1 MiB for most requests, a
  unit list 33 MiB, a memory-state chunk :data:`~sandbox.wire.STATE_CHUNK_BYTES` plus 1 MiB),
  an ``error`` by 1 MiB, a backend request by :data:`BACKEND_FRAME_BYTES`; a header whose
  ``kind`` is not the declared one is refused. Frames are read into buffers that grow only as
  bytes arrive, and their JSON is decoded only when its items and nesting fit the bound
  (:func:`sandbox.wire.json_cost`): a forged frame cannot make the optimizer allocate more than
  a few times its kind's bound. A frame over its bounds is a protocol breach
  (:class:`HostFailure` naming the bound).
- Every backend request is held to the request's :class:`~sandbox.budget.BackendBudget`
  before the ``serve`` callback sees it (texts and characters to embed per call and in all,
  prompt characters per completion and in all), and the answer to the host to
  ``reply_bytes``. By default (:meth:`~sandbox.budget.BackendBudget.for_request`) the budget
  grows with ``embed_chars``, the request's own data volume; a caller may pass its own. A
  request over it gets an error answer, which the program sees as a
  :class:`~contract.types.BackendError` naming the budget; the host lives on.
- Host text that enters the optimizer (an error frame's message and exception class, the
  stderr tail, the content of a malformed ``ready`` frame) passes through
  :func:`sandbox.printable.printable`: no message of this module carries a terminal control
  character the program wrote.
- :meth:`Host.cpu_seconds` is the kernel's CPU accounting of the host's processes, read from
  ``/proc`` on the optimizer's side: nothing the program does inside can change it.
- The host's stderr is kept up to :attr:`Limits.stderr_bytes`; the rest is discarded.
- The scratch directory is removed when the host is closed.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sandbox import barrier
from sandbox.budget import OVER_BUDGET, BackendBudget
from sandbox.printable import printable
from sandbox.surface import LOADED_ON_DEMAND
from sandbox.wire import STATE_CHUNK_BYTES, WireError, encode_frame, read_frame

Serve = Callable[[dict[str, Any], list[bytes]], tuple[dict[str, Any], list[bytes]]]


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 300  # CPU time of the host process (RLIMIT_CPU)
    memory_mb: int = 4096  # address space (RLIMIT_AS)
    file_size_mb: int = 16  # largest file it may write (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE
    call_seconds: float = 600.0  # wall clock per request, including backend requests served
    start_seconds: float = 60.0  # wall clock to start and confine itself
    stderr_bytes: int = 64 << 10
    scratch_mb: int = 64  # the scratch tmpfs in all (with namespaces; see sandbox.barrier)
    scratch_files: int = 256  # files and directories in the scratch tmpfs


class HostFailure(Exception):
    """The host died, hung, or broke the protocol; the message says which, in one line."""


class HostTimeout(HostFailure):
    """The host ran past a request's wall-clock deadline and was killed."""


class ProgramFailure(Exception):
    """Candidate code raised inside the host; the message is the host's one-line description,
    ``kind`` the exception's class name, ``line`` the program line it came from (None when
    unknown) and ``rule`` the host's verdict (see :mod:`sandbox.host`)."""

    def __init__(
        self, message: str, kind: str = "error", line: int | None = None, rule: str = "exception"
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.line = line
        self.rule = rule

    @classmethod
    def from_frame(cls, header: dict[str, Any]) -> ProgramFailure:
        """From an ``error`` frame; fields of the wrong type (a hostile host) are dropped."""
        line, rule = header.get("line"), header.get("rule")
        return cls(
            printable(header.get("error")),
            printable(header.get("type"), 100),
            line if isinstance(line, int) and not isinstance(line, bool) else None,
            rule if rule in PROGRAM_RULES else "exception",
        )


PROGRAM_RULES = ("contract", "exception")  # the rules an error frame may name (sandbox.serve)


BACKEND_EXTENSION = 4.0  # backend time may extend a request's deadline by this × its timeout
# An embed call counts as at least this many characters of the request's own data: a call's
# overhead is not volume, so many tiny calls cannot keep moving the deadline in full.
EMBED_CALL_CHARS = 512
GRACE_SECONDS = 2.0  # the most a request may outlast its deadline (killing, reaping the host)

_MIB = 1 << 20
# The most a host's answer to each request may carry (JSON and blobs together); others: 1 MiB.
# A memory's state crosses in chunks (sandbox.wire.STATE_CHUNK_BYTES), one per answer.
FRAME_BYTES = {"units": 33 * _MIB, "state_chunk": STATE_CHUNK_BYTES + _MIB}
SMALL_FRAME_BYTES = _MIB
BACKEND_FRAME_BYTES = 16 * _MIB  # a backend request: texts to embed (BackendBudget), a prompt
_WRITE_BYTES = _MIB  # the most one write to the host's pipe offers


_SIGNALS = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
    signal.SIGKILL: "killed",
    signal.SIGSEGV: "segmentation fault",
}


_TICKS = os.sysconf("SC_CLK_TCK")


def remove_tree(root: str) -> None:
    """Remove a dead host's scratch directory, folders it made unreadable or unwritable for
    its own uid (``mkdir(name, 0o300)``) included: each is given mode 0700 and removed again.
    Nothing outside ``root`` is ever touched, its parent included; a missing ``root`` is left
    alone."""
    if not os.path.isdir(root) or os.path.islink(root):
        return
    inside = root.rstrip(os.sep) + os.sep

    def ours(path: str) -> bool:
        return path.startswith(inside) and os.path.isdir(path) and not os.path.islink(path)

    def unlock(_function: Any, failed: str, _exc: Any) -> None:
        for folder in (os.path.dirname(failed), failed):
            if folder == root or ours(folder):
                try:
                    os.chmod(folder, 0o700)
                except OSError:
                    pass
        if ours(failed):
            remove_tree(failed)
        elif failed.startswith(inside):
            try:
                os.unlink(failed)
            except OSError:
                pass

    try:
        os.chmod(root, 0o700)
        shutil.rmtree(root, onerror=unlock)
    except (OSError, RecursionError):
        shutil.rmtree(root, ignore_errors=True)


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of one live process, 0.0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


class Host:
    """A confined process that loads one program and runs its code on request."""

    def __init__(
        self,
        limits: Limits | None = None,
        serve: Serve | None = None,
        imports: Iterable[str] | None = None,
    ) -> None:
        """``imports``: the modules the program to be loaded imports
        (:func:`sandbox.static.imported_modules`); the host loads the allowed ones it loads
        only on demand (:data:`sandbox.surface.LOADED_ON_DEMAND`) when they are among them.
        None: it loads every one."""
        self.limits = limits or Limits()
        self.serve = serve
        barrier.shield_optimizer()  # no host of this uid may read our memory or environment
        self.scratch = tempfile.mkdtemp(prefix="prismem-host-")
        os.chmod(self.scratch, 0o1777)  # the host may run as a throwaway uid
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.scratch,
            "TMPDIR": self.scratch,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            **{v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
        }
        wanted = sorted(LOADED_ON_DEMAND if imports is None else set(imports))
        cmd = [sys.executable, "-I", "-m", "sandbox.host", json.dumps(asdict(self.limits)),
               json.dumps(wanted)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.scratch,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        if self.proc.stdin is not None:  # writes take what fits and never wait (_send)
            os.set_blocking(self.proc.stdin.fileno(), False)
        self._stderr = bytearray()
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()
        self.isolation: dict[str, Any] = {}
        header, _ = self._receive(time.monotonic() + self.limits.start_seconds)
        if header.get("kind") != "ready":
            self.kill()
            raise HostFailure(f"host did not start: {printable(header.get('error', header), 300)}")
        self.isolation = dict(header.get("isolation") or {})
        if barrier.strict() and not barrier.complete(self.isolation):
            self.kill()
            raise HostFailure(f"{barrier.describe(self.isolation)} (strict isolation)")

    # -- requests ----------------------------------------------------------------------

    def call(
        self,
        op: str,
        payload: dict[str, Any] | None = None,
        blobs: list[bytes] | None = None,
        *,
        timeout: float | None = None,
        embed_chars: int = 0,
        budget: BackendBudget | None = None,
    ) -> tuple[Any, list[bytes]]:
        """Send one request; serve the host's backend requests until its answer arrives
        (``embed_chars``: the volume of embedding whose time moves the deadline in full;
        ``budget``: what its backend requests may ask, by default
        :meth:`~sandbox.budget.BackendBudget.for_request` of ``embed_chars``)."""
        allowed = timeout or self.limits.call_seconds
        budget = budget or BackendBudget.for_request(embed_chars)
        try:
            return self._call(op, payload, blobs, allowed, embed_chars, budget)
        except HostTimeout:  # say which request, and what it was allowed
            raise HostTimeout(f"{op} timed out after {allowed:.3g} s of the program's time "
                              "(wall clock); the host was killed") from None  # fmt: skip

    def _call(
        self,
        op: str,
        payload: dict[str, Any] | None,
        blobs: list[bytes] | None,
        allowed: float,
        embed_chars: int,
        budget: BackendBudget,
    ) -> tuple[Any, list[bytes]]:
        deadline = time.monotonic() + allowed
        extension = allowed * BACKEND_EXTENSION  # backend time the deadline may still absorb
        self._send(encode_frame({"op": op, **(payload or {})}, blobs), deadline)
        bounds = {"result": FRAME_BYTES.get(op, SMALL_FRAME_BYTES), "error": SMALL_FRAME_BYTES,
                  "backend": BACKEND_FRAME_BYTES}  # fmt: skip
        spent = {"texts": 0, "chars": 0, "prompts": 0}  # by this request's backend requests
        while True:
            header, got = self._receive(deadline, bounds)
            kind = header.get("kind")
            if kind == "result":
                return header.get("result"), got
            if kind == "error":
                raise ProgramFailure.from_frame(header)
            if kind == "backend" and self.serve is not None:
                began, chars = time.monotonic(), spent["chars"]
                refused = budget.refusal(header, spent)
                chars = spent["chars"] - chars  # what this one embeds, when within the budget
                answer_blobs: list[bytes] = []
                if refused:
                    answer = {"error": refused}
                else:
                    answer, answer_blobs = self._serve(header, got, budget.reply_bytes)
                took = time.monotonic() - began
                charged = max(chars, EMBED_CALL_CHARS) if chars > 0 else 0
                if 0 < charged <= embed_chars:  # the request's own data: its time in full
                    embed_chars -= charged
                else:
                    took = min(took, extension)
                    extension -= took
                deadline += took
                self._send(encode_frame(answer, answer_blobs), deadline)
                del header, got, answer, answer_blobs  # not held while the next frame is read
                continue
            self.kill()
            raise HostFailure(f"host broke the protocol (unexpected frame {printable(kind, 40)})")

    def _serve(
        self, header: dict[str, Any], blobs: list[bytes], most: int
    ) -> tuple[dict[str, Any], list[bytes]]:
        """The ``serve`` callback's answer to a backend request within the budget, or an error
        answer: when the callback failed, or its answer would carry over ``most`` bytes."""
        assert self.serve is not None
        try:
            answer, answer_blobs = self.serve(header, blobs)
        except Exception as exc:  # the optimizer's side failed: tell the program
            return {"error": printable(f"{type(exc).__name__}: {exc}")}, []
        size = sum(len(b) for b in answer_blobs)
        if size > most:
            return {
                "error": f"backend {OVER_BUDGET}: an answer of {size:,} bytes; at most {most:,}"
            }, []
        return answer, answer_blobs

    def _send(self, data: bytes, deadline: float) -> None:
        """Write ``data`` to the host by the deadline: poll for room, write what fits (the
        descriptor is non-blocking), again until all is written."""
        fd = self.proc.stdin.fileno() if self.proc.stdin else -1
        view = memoryview(data)
        while view:
            self._ready(fd, select.POLLOUT, deadline)
            try:
                view = view[os.write(fd, view[:_WRITE_BYTES]) :]
            except BlockingIOError:  # no room after all: poll again
                continue
            except OSError:  # EPIPE: the host is gone
                raise self._died() from None

    def _receive(
        self, deadline: float, bounds: dict[str, int] | None = None
    ) -> tuple[dict[str, Any], list[bytes]]:
        """One frame from the host, bounded by the kind it declares (``bounds``: kind ->
        bytes; by default only a small ``ready`` frame is expected)."""
        fd = self.proc.stdout.fileno() if self.proc.stdout else -1

        def recv(n: int) -> bytes:
            buf = bytearray()
            while len(buf) < n:
                self._ready(fd, select.POLLIN, deadline)
                chunk = os.read(fd, min(n - len(buf), 1 << 20))
                if not chunk:
                    raise self._died()
                buf += chunk
            return bytes(buf)

        try:
            return read_frame(recv, bounds=bounds or {"ready": SMALL_FRAME_BYTES})
        except WireError as exc:
            self.kill()
            raise HostFailure(f"host broke the protocol: {printable(str(exc), 300)}") from None

    def _ready(self, fd: int, event: int, deadline: float) -> None:
        """Wait until ``fd`` is ready for ``event`` (or its peer hung up, which the read or
        write then reports) or the deadline passes. ``poll``, not ``select``: select cannot
        watch a descriptor numbered 1024 or more, which a busy process reaches."""
        poller = select.poll()
        poller.register(fd, event)
        if not poller.poll(max(1, int(self._left(deadline) * 1000 + 0.999))):
            self._timeout()

    def _left(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            self._timeout()
        return left

    def _timeout(self) -> None:
        self.kill()
        raise HostTimeout("timed out (wall clock); the host was killed")

    def _died(self) -> HostFailure:
        """The host closed its end of a pipe: why (it exited, or was killed by a signal, and
        the last line it wrote to stderr), waiting at most :data:`GRACE_SECONDS` for it."""
        try:
            code: int | None = self.proc.wait(timeout=GRACE_SECONDS / 2)
        except subprocess.TimeoutExpired:  # it closed its pipes and lives on
            code = None
        self.kill()
        self._stderr_thread.join(timeout=GRACE_SECONDS / 4)  # the last of its stderr
        tail = self.stderr_tail()
        if code is None:
            reason = "closed its pipe to the optimizer"
        elif code < 0:
            reason = _SIGNALS.get(signal.Signals(-code), f"killed by signal {-code}")
        else:
            reason = f"exited with status {code}"
        return HostFailure(reason + (f": {tail}" if tail else ""))

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the host's processes have used so far, by the kernel's
        accounting: the process started here and its children (the host proper, when a reaper
        started it)."""
        pids = [self.proc.pid]
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
        return sum(_cpu_of(pid) for pid in pids)

    # -- lifetime ------------------------------------------------------------------------

    def _drain_stderr(self) -> None:
        stream = self.proc.stderr
        if stream is None:
            return
        while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16):
            room = self.limits.stderr_bytes - len(self._stderr)
            if room > 0:
                self._stderr += chunk[:room]

    def stderr_tail(self, n: int = 300) -> str:
        """The last line the host wrote to stderr, its last ``n`` characters, printable."""
        text = bytes(self._stderr).decode(errors="replace").strip().splitlines()
        return printable((text[-1] if text else "")[-n:], n)

    def kill(self) -> None:
        """Kill the whole process group, reap it and remove the scratch directory."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        remove_tree(self.scratch)

    def close(self) -> None:
        """Ask the host to exit, kill it if it has not within :data:`GRACE_SECONDS`."""
        if self.proc.poll() is None:
            deadline = time.monotonic() + GRACE_SECONDS
            try:
                self._send(encode_frame({"op": "exit"}), deadline)
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except (HostFailure, subprocess.TimeoutExpired):
                pass
        self.kill()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
