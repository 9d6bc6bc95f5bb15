"""A hostile corpus for the sandbox (docs/design.md §5): every program here must be rejected,
and the check must contain it.

Each case names the tier (and, where it is stable, the rule id) that is expected to stop it,
so this file documents where each attack is stopped:

- tier 1 ``source``, static rules (:mod:`sandbox.static`): the program never runs; the report
  has no ``isolation`` because no host was started. This includes the obfuscated escapes to
  the interpreter's real builtins (:data:`ESCAPE`, :data:`ESCAPES`: private attributes through
  a parameter named ``self``) and monkeypatching an imported module;
- tier 1 ``source`` at load time, tiers 2-4 (:mod:`sandbox.host`, :mod:`sandbox.tiers`),
  cases marked ``runtime=True``: programs static analysis allows (crashes, exits, hangs,
  memory bombs, wrong types, a thread pool re-exported by bm25s, quadratic indexing) run inside
  the confined host (network namespace, throwaway uid with RLIMIT_NPROC=1, rlimits,
  restricted builtins, disarmed library functions, wall-clock kill) and behind the OS
  barrier of :mod:`sandbox.barrier` (namespaces, chroot to a capped tmpfs, seccomp, Landlock).

What the host alone does with code that has the real builtins is tested by loading each of
:data:`ESCAPES` straight into a host, skipping tier 1 (``test_escaped_code_is_contained_by_the_
host``): it must fail with the error its confinement produces (no network, no fork or thread,
an empty chroot for files, ...).

Cases marked ``barrier=True`` and the direct host tests are contained only by the OS barrier
(:mod:`sandbox.barrier`, for root and for an ordinary user alike): on a machine whose kernel
refuses it they skip, and with ``PRISMEM_BARRIER=require`` (``.ci/run``, which runs this
module as root and again as an ordinary user) that skip is a failure.

Containment checked around every case: the test process is unharmed and has no new child
processes; nothing is written to a world-writable sentinel folder under ``tmp_path`` or to
``/tmp/prismem-pwned-*``; the repository's ``splits/beam.json`` and ``seeds/*.py`` keep their
mtime and size; a TCP server on 127.0.0.1 receives no connection.

Speed: :data:`sandbox.check.TIER_SECONDS` is patched for this module to
:data:`FAST_TIER_SECONDS` (source/schema/smoke 5 s, probe 12 s instead of 30/15/30/90 s), and a
case that hangs in a tier (``Case.hangs``) gets :data:`HANG_SECONDS` there (2 s, probe 6 s), so
it is killed after 2-6 s instead of 30-90 s. Static cases take milliseconds; the whole module
takes about 40 s on two cores.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Unavailable, minimal

from sandbox import barrier
from sandbox import check as sandbox_check
from sandbox.check import CheckReport, check_program
from sandbox.isolate import Host, HostFailure, Limits, ProgramFailure
from sandbox.probe import BackendShape, ProbeBackend
from sandbox.tiers import TierError, smoke_tier

REPO = Path(__file__).resolve().parents[1]
SEEDS = sorted((REPO / "seeds").glob("[!_]*.py"))  # not __init__.py
DENSE = (REPO / "seeds" / "dense.py").read_text()
WATCHED = [REPO / "splits" / "beam.json", *SEEDS]
PWNED_PREFIX = f"/tmp/prismem-pwned-{uuid.uuid4().hex[:10]}"
FAST_TIER_SECONDS = {"source": 5.0, "schema": 5.0, "smoke": 5.0, "probe": 12.0}
# A case that hangs in a tier (Case.hangs) gets this limit there: the limit under test kills it
# as surely as the module's, and the tiers before it keep theirs.
HANG_SECONDS = {"source": 2.0, "smoke": 2.0, "probe": 6.0}
TIMEOUT_CEILING_S = 120.0  # any single check, hung programs included, returns within this


# -- program builders ---------------------------------------------------------------------


def _block(code: str, indent: str) -> str:
    return textwrap.indent(textwrap.dedent(code).strip("\n") + "\n", indent)


def dense(*, top: str = "", init: str = "", index: str = "", retrieve: str = "") -> str:
    """``seeds/dense.py`` with code inserted after the imports and at the start of methods."""
    src = DENSE
    for anchor, code, indent in (
        ("import numpy as np\n", top, ""),
        ("        self.backend = backend\n", init, " " * 8),
        ("    def index(self, units, segment):\n", index, " " * 8),
        ("    def retrieve(self, query):\n", retrieve, " " * 8),
    ):
        if code:
            assert anchor in src, f"seeds/dense.py changed: {anchor!r} not found"
            src = src.replace(anchor, anchor + _block(code, indent), 1)
    return src


# An escape that static analysis does not see: private attributes are allowed on any receiver
# *named* ``self``, and a ForwardRef made from a run-time string is evaluated by typing with
# ``eval`` in a fresh namespace, which gets the interpreter's real builtins (typing's frame).
ESCAPE = """
import typing

_U = "_" * 2


def _evaluate(self, namespace):
    try:
        self._evaluate(namespace, None, frozenset())
    except TypeError:  # typing checks the value only after the code ran
        pass
    return namespace


def escape(code):
    ref = typing.get_args(typing.List["(value := " + code + ") and int"])[0]
    return _evaluate(ref, {})["value"]


def real(module, name):
    return escape(_U + "import" + _U + "(" + repr(module) + ")." + name)
"""


# -- the corpus -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    tier: int | tuple[int, ...]  # the tier expected to stop it (a tuple: any of these)
    rules: tuple[str, ...]  # rule ids accepted for the failing tier ("" in it: any rule)
    error: str = ""  # text expected in the failing tier's error
    parent: str | None = None
    runtime: bool = False  # gets past static analysis: contained at run time
    barrier: bool = False  # contained only by the OS barrier (NPROC, seccomp, namespaces)
    seconds: float = TIMEOUT_CEILING_S
    hangs: str | None = None  # the tier it hangs in, killed by that tier's wall clock


def static(id: str, source: str, *rules: str, **kw: Any) -> Case:
    return Case(id, source, 1, rules, **kw)


def runtime(id: str, source: str, tier: int | tuple[int, ...], *rules: str, **kw: Any) -> Case:
    return Case(id, source, tier, rules, runtime=True, **kw)


# Schema and signature errors: tier 2 (docs/design.md §5); loading checks only the names.
SCHEMA = 2
DYNAMIC_FORMAT = '("{0." + "_" * 2 + "globals" + "_" * 2 + "}").format(render)'
FORGE_TOP = """
import json

_REAL_DUMPS = json.dumps


def _forge(obj, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("kind") == "error":
        obj = {"kind": "result", "result": {}}
    return _REAL_DUMPS(obj, *args, **kwargs)


json.dumps = _forge
"""
QUADRATIC_INIT = "self.seen = []"
QUADRATIC_INDEX = """
for u in units:
    words = set(u.content.split())
    for other in self.seen:
        if len(words & other) > 99:
            break
    self.seen.append(words)
"""
DATASOURCE_TOP = """
from numpy import lib


def _datasource(self):
    return self._datasource


def _openers(self):
    return self._file_openers


_OPEN = _openers(_datasource(lib))[None]
with _OPEN("@REPO@/spl" + "its/beam.json") as fh:
    LEAKED = fh.read()
with _OPEN("@PWNED@", "w") as fh:
    fh.write(LEAKED[:100])
"""

CASES: list[Case] = [
    # ---- reading files
    static("read-open", dense(index='open("/etc/passwd").read()'), "forbidden-name"),
    static(
        "read-pathlib-import",
        dense(top="import pathlib", index='pathlib.Path("/etc/passwd").read_text()'),
        "import-not-allowed",
    ),
    static(
        "read-pathlib-via-bm25s",
        dense(top="import bm25s", index='bm25s.tokenization.Path("/etc/passwd").read_text()'),
        "forbidden-attribute",
    ),
    static("read-np-load", dense(index='np.load("@SENTINEL@.npy")'), "forbidden-attribute"),
    static(
        "read-np-load-from-import",
        dense(top="from numpy import load as fetch", index='fetch("@SENTINEL@.npy")'),
        "import-not-allowed",
    ),
    static(
        "read-np-load-private-impl",
        dense(index='np.lib._npyio_impl.load("@SENTINEL@.npy")'),
        "private-attribute",
        "forbidden-attribute",
    ),
    static(
        "read-np-fromfile",
        dense(index='np.fromfile("/etc/passwd", dtype=np.uint8)'),
        "forbidden-attribute",
    ),  # fmt: skip
    static(
        "read-bm25s-load",
        dense(top="import bm25s", index='bm25s.BM25.load("/tmp")'),
        "forbidden-attribute",
    ),
    # ---- writing files
    static("write-open", dense(index='open("@SENTINEL@", "w").write("x")'), "forbidden-name"),
    static(
        "write-np-save", dense(index='np.save("@SENTINEL@", np.zeros(3))'), "forbidden-attribute"
    ),
    static(
        "write-ndarray-tofile", dense(index='np.zeros(3).tofile("@PWNED@")'), "forbidden-attribute"
    ),
    static(
        "write-bm25s-save",
        dense(top="import bm25s", index='bm25s.BM25().save("@PWNED@")'),
        "forbidden-attribute",
    ),
    # ---- imports and escapes through builtins or attribute chains
    static(
        "escape-dunder-import",
        dense(index='__import__("os").system("touch @PWNED@")'),
        "forbidden-name",
    ),
    static(
        "escape-getattr-builtins",
        dense(index='getattr(__builtins__, "open")("@PWNED@", "w")'),
        "forbidden-name",
    ),
    static(
        "escape-subclasses-walk",
        dense(index="().__class__.__bases__[0].__subclasses__()"),
        "dunder-attribute",
    ),
    static("escape-subclasses-mro", dense(index="type(()).mro()"), "forbidden-attribute"),
    static(
        "escape-random-os",
        dense(top="import random", index='random._os.system("touch @PWNED@")'),
        "forbidden-attribute",
    ),
    static(
        "escape-random-os-through-self",
        dense(
            top="import random\n\n\ndef peek(self):\n    return self._os",
            index="peek(random.Random())",
        ),
        "forbidden-attribute",
    ),
    static(
        "escape-dataclasses-sys",
        dense(top="import dataclasses", index='dataclasses.sys.modules["os"]'),
        "forbidden-attribute",
    ),
    static(
        "escape-from-dataclasses-import-sys",
        dense(top="from dataclasses import sys", index='sys.modules["os"]'),
        "import-not-allowed",
    ),
    static(
        "escape-enum-bltns",
        dense(top="import enum", index='enum.bltns.open("@PWNED@", "w")'),
        "forbidden-attribute",
    ),
    static("escape-getattr-built-name", dense(index='getattr(np, "lo" + "ad")'), "forbidden-name"),
    static(
        "escape-attrgetter-built-name",
        dense(top="import operator", index='operator.attrgetter("to" + "file")(np.zeros(3))'),
        "forbidden-attribute",
    ),
    static(
        "escape-format-globals",
        dense(index='"{0.__globals__}".format(render)'),
        "format-attribute",
        "dunder-string",
    ),
    static("escape-format-dynamic-template", dense(index=DYNAMIC_FORMAT), "dynamic-format"),
    static("exec", dense(index='exec("x = 1")'), "forbidden-name"),
    static("eval", dense(index='eval("1 + 1")'), "forbidden-name"),
    static("compile", dense(index='compile("1", "<x>", "eval")'), "forbidden-name"),
    # ---- processes, network, signals
    static(
        "os-system",
        dense(top="import os", index='os.system("touch @PWNED@")'),
        "import-not-allowed",
    ),
    static(
        "subprocess-run",
        dense(top="import subprocess", index='subprocess.run(["touch", "@PWNED@"])'),
        "import-not-allowed",
    ),
    static(
        "socket-connect",
        dense(top="import socket", index='socket.create_connection(("127.0.0.1", @PORT@))'),
        "import-not-allowed",
    ),
    static(
        "fork-bomb",
        dense(top="import os", index="while True:\n    os.fork()"),
        "import-not-allowed",
    ),
    static(
        "os-kill-parent",
        dense(top="import os\nimport signal", index="os.kill(os.getppid(), signal.SIGTERM)"),
        "import-not-allowed",
    ),
    # ---- evaluation side: labels, scorer, splits
    static(
        "import-evolve-scoring",
        dense(top="import evolve.scoring", index="evolve.scoring.retrieval"),
        "import-not-allowed",
    ),
    static("import-sandbox", dense(top="from sandbox import tiers"), "import-not-allowed"),
    static(
        "path-probing-questions",
        dense(index='LABELS = "/work/shared/data/beam/probing_questions.json"'),
        "evaluation-access",
    ),
    static("path-splits", dense(index='SPLIT = "splits/beam.json"'), "evaluation-access"),
    static("name-gold", dense(index="gold = {}"), "evaluation-access"),
    # ---- state a restored memory would not see (step reuse)
    static(
        "index-fills-module-dict",
        dense(top="SEEN = {}", index="SEEN['n'] = len(units)", retrieve="print(SEEN)"),
        "module-state-mutation",
    ),
    static(
        "index-reseeds-global-rng", dense(top="import random", index="random.seed(7)"), "global-rng"
    ),
    # ---- exiting the process
    static("sys-exit-at-import", dense(top="import sys\n\nsys.exit(0)"), "import-not-allowed"),
    static("exit-builtin-in-index", dense(index="exit(0)"), "forbidden-name"),
    static("quit-builtin-at-import", dense(top="quit()"), "forbidden-name"),
    # ---- source-level contract
    static("empty-source", "  \n", "empty"),
    static("syntax-error", DENSE + "\ndef broken(:\n", "syntax"),
    static(
        "missing-instruction",
        minimal(('ANSWER_INSTRUCTION = "Answer."\n', "")),
        "missing-definition",
    ),
    static(
        "unchanged-vs-parent",
        DENSE.replace("class Memory:", "# a comment only\nclass Memory:", 1),
        "unchanged",
        parent=DENSE,
    ),
    # ---- run time, tier 1 (load)
    runtime(
        "empty-instruction",
        minimal(('ANSWER_INSTRUCTION = "Answer."', 'ANSWER_INSTRUCTION = "   "')),
        1,
        "contract",
        error="ANSWER_INSTRUCTION must be a non-empty string",
    ),
    runtime(
        "raises-at-import",
        dense(top='raise RuntimeError("boom")'),
        1,
        "contract",
        error="RuntimeError: boom",
    ),
    runtime(
        "memory-unit-not-dataclass",
        minimal(("@dataclass\nclass MemoryUnit:", "class MemoryUnit:")),
        1,
        "contract",
        error="MemoryUnit must be a @dataclass",
    ),
    runtime("system-exit-at-import", dense(top="raise SystemExit(0)"), 1, "crash"),
    runtime(
        "infinite-loop-at-import",
        dense(top="while True:\n    pass"),
        1,
        "timeout",
        seconds=HANG_SECONDS["source"] + 15,
        hangs="source",
    ),
    # ---- run time, tier 2 (schema and signatures)
    runtime(
        "schema-dict-field",
        minimal(("    content: str\n", "    content: str\n    meta: dict\n")),
        SCHEMA,
        "contract",
        error="unsupported type",
    ),
    runtime(
        "schema-list-int-field",
        minimal(("    text: str\n", "    text: str\n    ids: list[int]\n")),
        SCHEMA,
        "contract",
        error="unsupported type",
    ),
    runtime(
        "schema-empty-dataclass",
        minimal(("class Query:\n    text: str\n", "class Query:\n    pass\n")),
        SCHEMA,
        "contract",
        error="at least one field",
    ),
    runtime(
        "signature-retrieve-self-only",
        minimal(("def retrieve(self, query):", "def retrieve(self):")),
        SCHEMA,
        "contract",
        error="Memory.retrieve must accept",
    ),
    runtime(
        "signature-async-index",
        minimal(
            ("    def index(self, units, segment):", "    async def index(self, units, segment):")
        ),
        SCHEMA,
        "contract",
        error="synchronous",
    ),
    runtime(
        "signature-index-without-segment",
        minimal(("def index(self, units, segment):", "def index(self, units):")),
        SCHEMA,
        "contract",
        error="Memory.index must accept",
    ),
    # ---- run time, tier 3 (smoke)
    runtime(
        "index-returns-value",
        minimal(("        self.units.extend(units)\n", "        return len(units)\n")),
        3,
        "smoke",
        error="Memory.index must return None",
    ),
    runtime(
        "retrieve-returns-list",
        minimal(('return "\\n".join(u.content for u in self.units)[:16000]', "return self.units")),
        3,
        "smoke",
        error="must return str",
    ),
    runtime(
        "retrieve-returns-10mb",
        dense(retrieve='return "x" * 10_000_000'),
        3,
        "smoke",
        error="10000000 characters",
    ),
    runtime(  # 100 MB through print (stdout is the host's stderr): frames stay intact
        "print-100mb-then-bad-retrieve",
        dense(index='print("x" * 100_000_000)', retrieve="return None"),
        3,
        "smoke",
        error="must return str, got NoneType",
    ),
    runtime("system-exit-in-index", dense(index="raise SystemExit(3)"), 3, "crash"),
    runtime(
        "keyboard-interrupt-in-retrieve", dense(retrieve="raise KeyboardInterrupt"), 3, "crash"
    ),
    runtime(
        "memory-bomb-bytearray",
        dense(index="blob = bytearray(10**11)"),
        3,
        "exception",
        error="MemoryError",
    ),
    runtime(
        "memory-bomb-list-doubling",  # MemoryError, or the wall clock first on a busy machine
        dense(index="x = [0]\nwhile True:\n    x = x + x"),
        3,
        "exception",
        "timeout",
    ),
    runtime(
        "deep-recursion",
        dense(top="def dive(n):\n    return dive(n + 1) + 1", index="dive(0)"),
        3,
        "exception",
        error="RecursionError",
    ),
    runtime(
        "backend-embed-replaced",
        dense(init="backend.embed = lambda texts: np.ones((len(texts), backend.dim), np.float32)"),
        3,
        "smoke",
        error="modified the backend",
    ),
    runtime(
        "backend-dim-changed",
        dense(init="self.backend.dim = 3"),
        3,
        "smoke",
        error="modified the backend",
    ),  # fmt: skip
    runtime(
        "infinite-loop-in-index",
        dense(index="while True:\n    pass"),
        3,
        "timeout",
        seconds=HANG_SECONDS["smoke"] + 15,
        hangs="smoke",
    ),
    runtime(
        "infinite-loop-in-retrieve",
        dense(retrieve="n = 0\nwhile True:\n    n += 1"),
        3,
        "timeout",
        seconds=HANG_SECONDS["smoke"] + 15,
        hangs="smoke",
    ),
    # ---- run time, tier 4 (complexity probe)
    runtime(
        "quadratic-index",
        dense(init=QUADRATIC_INIT, index=QUADRATIC_INDEX),
        4,
        "probe",
        "timeout",
        seconds=FAST_TIER_SECONDS["probe"] + 15,
    ),
    runtime(
        "busy-loop-over-1000-units",
        dense(
            init="self.count = 0",
            index="self.count += len(units)\nif self.count > 1000:\n    for _ in range(10**11):\n"
            "        pass",
        ),
        4,
        "timeout",
        "probe",
        seconds=HANG_SECONDS["probe"] + 15,
        hangs="probe",
    ),
    runtime(  # allowed by static analysis: bm25s re-exports concurrent.futures' executor
        "threads-via-bm25s-executor",
        dense(top="import bm25s", index="bm25s.ThreadPoolExecutor(4).submit(print, 1).result()"),
        3,
        "exception",
        error="can't start new thread",
        barrier=True,
    ),
    runtime(  # the probe's meters do not live on the backend the program can write
        "probe-accounting-backend-seconds",
        dense(init=QUADRATIC_INIT, index="self.backend.seconds += 1000.0\n" + QUADRATIC_INDEX),
        3,
        "exception",
        "smoke",
    ),
    # ---- monkeypatching an imported module (json.dumps forges the host's verdict frames)
    static(
        "forged-verdict-json-dumps", dense(top=FORGE_TOP, retrieve="return None"), "module-mutation"
    ),  # fmt: skip
]


@dataclass(frozen=True)
class Escape:
    """Code that reaches the interpreter's real builtins through a private attribute on a
    parameter named ``self``. Tier 1 stops it (rule private-attribute); loaded straight into
    a host, ``contained`` is the text of the error the host's confinement produces."""

    id: str
    source: str
    contained: str


ESCAPES = [
    Escape("escape-socket-raw-connect",
           dense(top=ESCAPE + '\nreal("_socket", "socket")().connect(("127.0.0.1", @PORT@))'),
           "Operation not permitted"),  # seccomp: no AF_INET socket
    Escape("escape-socket-disarmed",
           dense(top=ESCAPE + '\nreal("socket", "create_connection")(("127.0.0.1", @PORT@), 2)'),
           "not allowed in the sandbox"),
    Escape("escape-fork",
           dense(top=ESCAPE + '\nif real("posix", "fork")() == 0:\n    while True:\n        pass'),
           "Operation not permitted"),
    Escape("escape-thread",
           dense(top=ESCAPE + '\nreal("_thread", "start_new_thread")(print, ("spawned",))'),
           "can't start new thread"),
    Escape("escape-system",
           dense(top=ESCAPE + '\nif real("posix", "system")("touch @PWNED@") != 0:\n'
                 '    raise OSError("system() failed")'),
           "system() failed"),
    Escape("escape-kill-parent",
           dense(top=ESCAPE + '\nreal("posix", "kill")(real("posix", "getppid")(), 0)'),
           "Operation not permitted"),
    Escape("escape-write-repo-seed",
           dense(top=ESCAPE + '\nreal("builtins", "open")("@REPO@/seeds/dense.py", "a")'),
           "No such file or directory"),  # the host's root is an empty chroot
    Escape("escape-write-tmp-path-sentinel",
           dense(top=ESCAPE + '\nreal("builtins", "open")("@SENTINEL@", "w").write("x")'),
           "No such file or directory"),
    Escape("escape-posix-exit-in-index", dense(top=ESCAPE, index='real("posix", "_exit")(0)'),
           "exited with status 0"),
    Escape("escape-corrupt-protocol",
           dense(top=ESCAPE + '\nreal("posix", "write")(1, b"\\xff" * 64)'), "protocol"),
    Escape("forwardref-escape-reads-splits-writes-tmp",
           dense(top=ESCAPE + '\nOPEN = real("builtins", "open")'
                 '\nLEAKED = OPEN("@REPO@/spl" + "its/beam.json").read()'
                 '\nOPEN("@PWNED@", "w").write(LEAKED[:100])'),
           "No such file or directory"),
    Escape("numpy-datasource-open", dense(top=DATASOURCE_TOP), "No such file or directory"),
]  # fmt: skip
CASES += [static(e.id, e.source, "private-attribute") for e in ESCAPES]

# -- containment fixtures ---------------------------------------------------------------------


def _children() -> set[int]:
    """Pids of live (or zombie) processes whose parent is this test process."""
    me, kids = os.getpid(), set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        ppid = next((line.split()[1] for line in lines if line.startswith("PPid:")), None)
        if ppid == str(me):
            kids.add(int(status.parent.name))
    return kids


def _snapshot() -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in WATCHED}


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(scope="module", autouse=True)
def fast_tiers() -> Iterator[None]:
    """Shorter wall-clock limits per tier for this module (see the module docstring)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, seconds in FAST_TIER_SECONDS.items():
            mp.setitem(sandbox_check.TIER_SECONDS, name, seconds)
        yield


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()
    assert server.connections == 0, "a sandboxed program reached a TCP server on 127.0.0.1"


@pytest.fixture(scope="module", autouse=True)
def module_containment() -> Iterator[None]:
    """At the end of the module: no new child processes, no pwned files, repo files intact."""
    children, files = _children(), _snapshot()
    yield
    time.sleep(0.2)
    assert _children() - children == set(), "stray child processes remain"
    assert not list(Path("/tmp").glob(Path(PWNED_PREFIX).name + "*"))
    assert _snapshot() == files


def _render(case: Case, sentinel: Path, pwned: str, port: int) -> str:
    return (
        case.source.replace("@SENTINEL@", str(sentinel))
        .replace("@PWNED@", pwned)
        .replace("@PORT@", str(port))
        .replace("@REPO@", str(REPO))
    )


def _need_barrier(unavailable: Unavailable) -> None:
    if not barrier.complete(barrier.survey()):
        unavailable("PRISMEM_BARRIER", barrier.describe(barrier.survey()))


def _rules(report: CheckReport) -> set[str]:
    failure = report.failure
    assert failure is not None
    findings = failure.details.get("findings") if failure.tier == 1 else None
    rules = {f["rule"] for f in findings} if findings else set()
    return rules | {failure.rule or ""}


# -- tests ------------------------------------------------------------------------------------


def test_corpus_is_large_and_distinct() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({c.source for c in CASES}) == len(CASES)
    assert len(CASES) >= 30 and len({e.id for e in ESCAPES} - {c.id for c in CASES}) == 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_program_is_rejected_and_contained(
    case: Case,
    tmp_path: Path,
    listener: Listener,
    unavailable: Unavailable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if case.barrier:
        _need_barrier(unavailable)
    tmp_path.chmod(0o777)  # world-writable: the throwaway uid could write here if it got in
    sentinel = tmp_path / "pwned"
    pwned = f"{PWNED_PREFIX}-{case.id}"
    source = _render(case, sentinel, pwned, listener.port)
    before, children = _snapshot(), _children()
    if case.hangs:
        monkeypatch.setitem(sandbox_check.TIER_SECONDS, case.hangs, HANG_SECONDS[case.hangs])

    start = time.monotonic()
    report = check_program(source, path=f"<{case.id}>", parent_source=case.parent)
    elapsed = time.monotonic() - start

    # containment first, cleaning up what an escape left behind before asserting
    written = [p for p in (str(sentinel), pwned) if os.path.lexists(p)]
    for path in written:
        os.unlink(path)
    time.sleep(0.05)
    assert _children() - children == set(), "the check left child processes behind"
    assert _snapshot() == before, "a repository file was modified"
    assert listener.connections == 0, "a sandboxed program reached 127.0.0.1"
    assert elapsed < min(case.seconds, TIMEOUT_CEILING_S), f"took {elapsed:.1f} s"

    failure = report.failure
    summary = f"{case.id}: {report.repair_text()}"
    assert not written, f"{case.id} wrote {written}"
    assert report.passed is False, f"{case.id} passed every tier: {report.as_json()}"
    tiers = case.tier if isinstance(case.tier, tuple) else (case.tier,)
    assert failure is not None and failure.tier in tiers, summary
    rules = _rules(report)
    assert "" in case.rules or rules & set(case.rules), f"rules {rules}: {summary}"
    assert case.error in (failure.error or ""), summary
    if case.runtime and barrier.complete(barrier.survey()):  # it ran, behind the barrier
        assert barrier.complete(report.isolation), report.isolation
    elif case.runtime:
        assert report.isolation, "a program ran without a host"
    else:  # stopped by static analysis: no host was started, nothing ran
        assert report.isolation == {} and len(report.tiers) == 1, summary
    assert report.repair_text().startswith(f"sandbox tier {failure.tier} ({failure.name})")


@pytest.mark.parametrize("case", ESCAPES, ids=lambda e: e.id)
def test_escaped_code_is_contained_by_the_host(
    case: Escape, tmp_path: Path, listener: Listener, unavailable: Unavailable
) -> None:
    """Code with the interpreter's real builtins, loaded straight into a host (no tier 1)."""
    _need_barrier(unavailable)
    tmp_path.chmod(0o777)
    sentinel, pwned = tmp_path / "pwned", f"{PWNED_PREFIX}-direct-{case.id}"
    source = _render(case, sentinel, pwned, listener.port)
    before, children = _snapshot(), _children()
    outcome = "no failure"
    limits = Limits(cpu_seconds=30, call_seconds=20.0)
    with Host(limits, serve=ProbeBackend().serve) as host:
        try:
            host.call("load", {"source": source, "path": "escape.py"})
            smoke_tier(host, BackendShape(), 20.0, seed=0)
        except (ProgramFailure, HostFailure, TierError) as exc:
            outcome = str(exc)
    written = [p for p in (str(sentinel), pwned) if os.path.lexists(p)]
    for path in written:
        os.unlink(path)
    time.sleep(0.05)
    assert not written and _snapshot() == before and listener.connections == 0
    assert _children() - children == set()
    assert case.contained in outcome, outcome


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_seed_passes_all_tiers_quickly(path: Path) -> None:
    report = check_program(path.read_text(), path=str(path))
    times = {t.name: round(t.seconds, 2) for t in report.tiers}
    assert report.passed, f"{path.name}: {report.repair_text()} (times {times})"
    assert [t.tier for t in report.tiers] == [1, 2, 3, 4]
    assert all(t.passed for t in report.tiers)
    assert all(t.seconds < 10 for t in report.tiers), f"{path.name} tier seconds: {times}"
