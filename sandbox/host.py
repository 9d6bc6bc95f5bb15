"""The confined host process: the only place where candidate code runs.

Started by :class:`sandbox.isolate.Host` as ``python -I -m sandbox.host '<limits json>'
'<json list of the modules the program imports>'``.
Before it reads any candidate code it confines itself, root or not (:mod:`sandbox.barrier`):
new user (unless root), mount, network, PID and IPC namespaces, and in every mode a reaper
outside that kills the host when the optimizer dies; resource limits (:func:`confine`); the
libraries programs may use imported while the interpreter's files are still readable
(:func:`warm_up`); a chroot into a capped tmpfs on its scratch directory, then a throwaway uid
(root) or no capabilities (everyone else); no new processes or threads, Landlock, no dumps and
a seccomp filter. Where the kernel refuses a step the host reports what it got instead (the
``ready`` frame's ``isolation``); as root without namespaces it still chroots and becomes a
throwaway uid, as an ordinary user it makes its scratch directory private. It also disarms
process, network and file functions reachable through the allowed libraries, and serves
requests over stdin/stdout frames. Candidate modules get restricted builtins
(:func:`restricted_builtins`): no ``open``/``exec``/``eval``/``compile``, and an ``__import__``
that admits only the allow-listed modules of :mod:`sandbox.static`.

Requests (``op``): ``load``, ``schema``, then evaluation's ``units``, ``query``, ``open``,
``add``, ``dump`` (with ``state_chunk``), ``state_part``, ``restore`` and ``retrieve`` (see
:mod:`sandbox.serve`); the sandbox's tiers 3 and 4 send the same requests
(:mod:`sandbox.tiers`), so a program cannot tell a check from an evaluation by them. Every
answer is one frame of kind ``result`` or ``error``; while handling a request the host may send
``backend`` frames and waits for their answers. An ``error`` frame carries ``type`` (the
exception's class), ``error`` (one line for a model), ``line`` (the program line it came from,
or null) and ``rule`` (``contract`` for a rule a request enforces, or ``exception``), so
nothing reads them back out of the text.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys
from typing import Any

from sandbox import barrier  # only this before barrier.enter(): see confine_process

_DENIED_BUILTINS = {
    "open", "exec", "eval", "compile", "globals", "locals", "vars", "breakpoint", "input",
    "exit", "quit", "help", "memoryview", "copyright", "credits", "license",
}  # fmt: skip


def confine(limits: dict[str, Any]) -> None:
    """Resource limits of the host process (CPU, address space, file size, open files)."""
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def warm_up(on_demand: frozenset[str] | None = None) -> None:
    """Import what programs may use and exercise lazy imports inside those libraries; of
    :data:`~sandbox.surface.LOADED_ON_DEMAND`, only the modules in ``on_demand`` (None: all)."""
    import importlib

    import numpy as np

    from sandbox.surface import ALLOWED_IMPORTS, LOADED_ON_DEMAND

    for module in ("sandbox.serve", "sandbox.wire", "sandbox.static"):  # the host's own code
        importlib.import_module(module)
    loaded = LOADED_ON_DEMAND if on_demand is None else LOADED_ON_DEMAND & on_demand
    for name in sorted((ALLOWED_IMPORTS - {"__future__"} - LOADED_ON_DEMAND) | loaded):
        importlib.import_module(name)
    if "bm25s" in loaded:
        import bm25s
        import Stemmer

        stemmer = Stemmer.Stemmer("english")
        corpus = ["a first small text", "another text about numbers"]
        retriever = bm25s.BM25()
        retriever.index(
            bm25s.tokenize(corpus, stemmer=stemmer, show_progress=False), show_progress=False
        )
        retriever.get_scores(["text"])
        retriever.retrieve(
            bm25s.tokenize(["text"], stemmer=stemmer, show_progress=False), k=1,
            show_progress=False,
        )  # fmt: skip
    matrix = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    np.linalg.norm(matrix, axis=1)
    np.argpartition(matrix[:, 0], 2)
    # numpy's C code imports its Python helpers on first use, through the caller's __import__:
    # a program's first ``x.sum()`` or ``str(x)`` would ask the host's restricted ``__import__``
    # for numpy._core._methods (refused: private). Used once here, numpy keeps them.
    for method in ("max", "min", "sum", "prod", "mean", "std", "var", "any", "all", "cumsum",
                   "cumprod", "argmax", "argmin", "round"):  # fmt: skip
        getattr(matrix, method)()
    matrix.clip(0, 1)
    records = np.zeros(2, dtype=[("a", "f4"), ("b", "i4")])
    for shown in (matrix, matrix.dtype, matrix[0, 0], records, records.dtype, np.float32(1.5)):
        str(shown), repr(shown), format(shown)
    for lazy in ("numpy.fft", "numpy.polynomial", "numpy.ma", "_strptime", "encodings.idna",
                 "encodings.latin_1", "encodings.ascii", "encodings.utf_16", "encodings.utf_32",
                 "encodings.cp1252", "encodings.unicode_escape"):  # fmt: skip
        importlib.import_module(lazy)
    import datetime

    datetime.datetime.strptime("2024-03-15", "%Y-%m-%d")


def _denied(*_args: Any, **_kwargs: Any) -> Any:
    raise PermissionError("not allowed in the sandbox")


def disarm() -> None:
    """Replace process, network and file entry points reachable through allowed libraries.
    ``socket`` and ``subprocess`` are disarmed where a library loaded them (bm25s does); where
    none did they cannot be loaded: the host's root holds no library files by now."""
    import numpy as np

    for name in ("system", "popen", "fork", "forkpty", "execv", "execve", "execvp", "execl",
                 "spawnv", "spawnve", "posix_spawn", "posix_spawnp", "kill", "killpg",
                 "remove", "unlink", "rmdir", "rename", "replace", "mkdir", "chmod", "chown",
                 "setsid", "open", "symlink", "link", "truncate"):  # fmt: skip
        if hasattr(os, name):
            setattr(os, name, _denied)
    for module, names in (("subprocess", ("Popen",)), ("socket", ("socket", "create_connection"))):
        if module in sys.modules:
            for name in names:
                setattr(sys.modules[module], name, _denied)
    for name in ("load", "save", "savez", "savez_compressed", "fromfile", "loadtxt", "savetxt",
                 "genfromtxt", "memmap", "fromregex"):  # fmt: skip
        setattr(np, name, _denied)


def restricted_builtins() -> dict[str, Any]:
    from sandbox.static import import_allowed

    real_import = builtins.__import__

    def restricted_import(name: str, globals: Any = None, locals: Any = None,
                       fromlist: Any = (), level: int = 0) -> Any:  # fmt: skip
        if level != 0 or not import_allowed(name, tuple(fromlist or ())):
            raise ImportError(f"import of {name!r} is not allowed in a memory program")
        return real_import(name, globals, locals, fromlist, level)

    def restricted_getattr(obj: Any, name: str, *default: Any) -> Any:
        if not isinstance(name, str) or name.startswith("_"):
            raise AttributeError(f"getattr of {name!r} is not allowed in a memory program")
        return getattr(obj, name, *default)

    safe = {
        k: v
        for k, v in vars(builtins).items()
        if k not in _DENIED_BUILTINS and not (k.startswith("__") and k != "__build_class__")
    }
    safe.update(__import__=restricted_import, getattr=restricted_getattr, __name__="builtins")
    safe.pop("setattr", None)
    safe.pop("delattr", None)
    return safe


def confine_process(
    limits: dict[str, Any], on_demand: frozenset[str] | None = None
) -> dict[str, Any]:
    """Every OS-level step, in order; returns what was obtained (the ``isolation`` report).
    Python-level restrictions (:func:`restricted_builtins`, :func:`disarm`) come after.

    Nothing but :mod:`sandbox.barrier` may be imported before it: the kernel refuses a new
    user namespace to a process that already runs threads, and numerical libraries start
    thread pools when imported."""
    isolation = barrier.enter()  # forks: from here on this is the host (PID 1 of its namespace)
    confine(limits)
    warm_up(on_demand)  # while the interpreter's files are still readable
    barrier.confine_files(isolation, limits["scratch_mb"], limits["scratch_files"])
    barrier.lock(isolation)
    isolation.pop("reaper", None)
    return isolation


def main() -> None:
    limits = json.loads(sys.argv[1])
    on_demand = frozenset(json.loads(sys.argv[2]))
    out = sys.stdout.buffer
    isolation = confine_process(limits, on_demand)
    from sandbox.serve import Server
    from sandbox.wire import encode_frame, reader

    builtins_ = restricted_builtins()
    disarm()
    sys.stdout = sys.stderr  # a program's prints must not corrupt the frames
    server = Server(out, reader(sys.stdin.buffer), builtins_)
    out.write(encode_frame({"kind": "ready", "isolation": isolation}))
    out.flush()
    server.run()
    out.flush()
    os._exit(0)  # the host keeps nothing: the interpreter's teardown cost every close 0.15 s


if __name__ == "__main__":
    main()
