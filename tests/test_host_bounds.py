"""A hostile host cannot hold, swell or paint the optimizer (:mod:`sandbox.isolate`).

The program in each host here reached the interpreter's real builtins (the ``ESCAPE`` of
``test_sandbox_hostile``, loaded straight into a host, no tier 1): it writes what it likes to
the frame pipe and stops reading its input. Whatever it does, a request ends within its
deadline plus 2 s, the optimizer's peak memory (``VmHWM`` of a fresh optimizer process)
stays under 1 GiB, backend requests over the request's budget are refused, and no terminal
control character it wrote reaches the optimizer's messages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from test_sandbox_hostile import ESCAPE

from contract.types import Message, Segment
from evolve.evaluation.backend import BackendService
from evolve.models.embed import HashingEmbedder
from sandbox.budget import BackendBudget
from sandbox.isolate import (
    BACKEND_FRAME_BYTES,
    FRAME_BYTES,
    Host,
    HostFailure,
    HostTimeout,
    Limits,
    ProgramFailure,
)
from sandbox.wire import max_items

ROOT = Path(__file__).resolve().parents[1]
DENSE = (ROOT / "seeds" / "dense.py").read_text()
GIB = 1 << 30
SEGMENT = asdict(Segment("1", "2024-01-02", (Message("m1", "user", "I like tea"),)))
LIMITS = Limits(cpu_seconds=30, call_seconds=20.0)

# What the program gets on top of the real builtins: raw writes and reads of its pipes.
TOOLS = """
WRITE, READ, EXIT = (real("posix", n) for n in ("write", "read", "_exit"))
SLEEP = real("time", "sleep")
VIEW, PACK = real("builtins", "memoryview"), real("struct", "pack")
WIRE = real("sys", "modules")["sandbox.wire"]


def send(data):
    view = VIEW(data)
    while view:
        view = view[WRITE(1, view) :]


def frame(code, text):
    send(PACK(">II", len(text), code << 8) + text)


def result(value):  # a result frame (then no more): the JSON of its value given as bytes
    frame(0, b'{"kind": "result", "result": ' + value + b'}')
    SLEEP(30)


def backend(texts):  # an embed request (then no more): the JSON of its texts given as bytes
    frame(2, b'{"kind": "backend", "method": "embed", "texts": ' + texts + b'}')
    SLEEP(30)
"""


def hostile(top: str = "", hook: str = "", index: str = "") -> str:
    """seeds/dense.py with code that has the real builtins: at load (``top``), in a
    ``postprocess_units`` hook (its frames answer a ``units`` request) or in ``index``."""
    source = DENSE + ESCAPE + TOOLS + textwrap.dedent(top)
    if hook:
        source += "\n\ndef postprocess_units(units, segment):\n" + textwrap.indent(hook, "    ")
    if index:
        old = "        vectors = self.backend.embed([u.content for u in units])\n"
        assert old in source
        source = source.replace(old, textwrap.indent(textwrap.dedent(index), " " * 8) + old)
    return source


def _serve() -> BackendService:
    return BackendService(HashingEmbedder(), None, "test", 0)


# -- a host that stops reading ------------------------------------------------------------

STALL = """
send(WIRE.encode_frame({"kind": "backend", "method": "embed",
                        "texts": [f"word {i}" for i in range(2000)]}))
got = 0
while got < 4096:  # one page of the answer: the pipe has room again, but far from 64 KiB
    got += len(READ(0, 4096 - got))
SLEEP(15)
"""


def test_a_host_that_stops_reading_cannot_hold_the_optimizer_past_the_deadline() -> None:
    with Host(LIMITS, serve=_serve()) as host:
        began = time.monotonic()
        with pytest.raises(HostTimeout):
            host.call("load", {"source": hostile(top=STALL), "path": "stall.py"}, timeout=2.0)
        took = time.monotonic() - began
    assert took < 2.0 + 2.0, f"held {took:.1f} s past a 2 s deadline"


# -- frames that would swell the optimizer --------------------------------------------------

# A fresh optimizer process runs the calls against a host and reports its peak memory.
CHILD = """
import json, sys, time
from evolve.evaluation.backend import BackendService
from evolve.models.embed import HashingEmbedder
from sandbox.isolate import Host, HostFailure, Limits, ProgramFailure

calls = json.loads(sys.stdin.read())
outcome = "no failure"
began = time.monotonic()
serve = BackendService(HashingEmbedder(), None, "test", 0)
with Host(Limits(cpu_seconds=30, call_seconds=20.0), serve=serve) as host:
    try:
        for op, payload in calls:
            host.call(op, payload, timeout=20.0)
    except (HostFailure, ProgramFailure) as exc:
        outcome = f"{type(exc).__name__}: {exc}"
# VmHWM, this process's own peak: ru_maxrss would carry the forking test worker's RSS over exec
status = open("/proc/self/status").read()
rss = int(status.split("VmHWM:")[1].split()[0]) * 1024
print(json.dumps({"outcome": outcome, "rss": rss, "seconds": time.monotonic() - began}))
"""


def _optimizer(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], input=json.dumps(calls), capture_output=True, text=True,
        timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _load(source: str) -> tuple[str, dict[str, Any]]:
    return ("load", {"source": source, "path": "hostile.py"})


UNITS = ("units", {"segment": SEGMENT, "records": None})
OPEN = ("open", {"dim": 384, "max_complete_calls": 0})
ADD = ("add", {"segment": SEGMENT, "units": [{"content": "tea", "date": None}]})
UNITS_BYTES, MOST = FRAME_BYTES["units"], max_items(FRAME_BYTES["units"])

# The costliest answer to a units request within its bounds: as many values as it may hold
# of the costliest kind to decode ({"a":1}, about 67 bytes a value), then the rest of its bytes
# in one string that decodes to 4 bytes a character (a character outside the BMP).
UNITS_LARGEST = f"""
head = b'{{"kind": "result", "result": [' + b'{{"a":1}},' * {(MOST - 6) // 3} + b'"\\ud83d\\ude00'
frame(0, head + b"x" * ({UNITS_BYTES} - len(head) - 3) + b'"]}}')
EXIT(0)
"""
# The largest backend request within its bounds: as many texts as it may hold, one of 13 M
# characters (4 bytes each). The program's own backend.embed sends it.
BACKEND_LARGEST = f"""
self.backend.embed(["ab"] * {max_items(BACKEND_FRAME_BYTES) - 8} + ["😀" + "x" * 13_000_000])
"""

CASES = {  # name -> (the calls, what the outcome must say)
    # 10 M empty objects in 30 MiB of a units answer (within its bytes): over its items
    "units-items": ([_load(hostile(hook="result(b'[' + b'{},' * (10 << 20) + b'{}]')")),
                     UNITS], "items"),
    # 20 M empty objects in 60 MiB: over a units answer's bytes (1.5 GB of objects if decoded)
    "units-bytes": ([_load(hostile(hook="result(b'[' + b'{},' * (20 << 20) + b'{}]')")),
                     UNITS], "too large"),
    # the largest backend request the wire used to take: 60 MiB of empty objects
    "backend-bytes": ([_load(hostile(top="backend(b'[' + b'{},' * (20 << 20) + b'{}]')"))],
                      "too large"),
    # 3 M two-character texts in 15 MiB
    "backend-items": ([_load(hostile(top="backend(b'[' + b'\"ab\",' * (3 << 20) + b'\"ab\"]')"))],
                      "items"),
    # nested 100,000 deep
    "deep": ([_load(hostile(top="backend(b'[' * 100_000 + b']' * 100_000)"))], "deeper"),
    # the costliest frames within every bound
    "units-largest": ([_load(hostile(hook=UNITS_LARGEST)), UNITS], "no failure"),
    "backend-largest": ([_load(hostile(index=BACKEND_LARGEST)), OPEN, ADD],
                        f"budget: {max_items(BACKEND_FRAME_BYTES) - 7:,} texts"),
    # no escape needed: a program's own backend.embed of 200,000 two-character texts, 5 times
    "embed-many": ([_load(hostile(index="for _ in range(5):\n"
                                        "    self.backend.embed(['ab'] * 200_000)\n")),
                    OPEN, ADD], "budget"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_frame_swells_the_optimizer_past_a_gib(case: str) -> None:
    calls, said = CASES[case]
    got = _optimizer(calls)
    assert said in got["outcome"], got
    # the costliest frames within the bounds cost about 300 MiB (baseline 50): well under
    most = GIB // 2 if case.endswith("-largest") else GIB
    assert got["rss"] < most, f"{case}: peak RSS {got['rss'] / GIB:.2f} GiB"


# -- the backend budget ------------------------------------------------------------------------


def _embeds(count: int, texts: int) -> str:
    return f"for _ in range({count}):\n    self.backend.embed([str(i) for i in range({texts})])\n"


def _add(host: Host, budget: BackendBudget | None = None) -> None:
    host.call(*OPEN)
    host.call(*ADD, budget=budget)


def test_embedding_over_the_request_budget_fails_the_program_not_the_optimizer() -> None:
    budget = BackendBudget(texts_per_call=100, texts=250)
    source = hostile(index=_embeds(1, 101))
    with Host(LIMITS, serve=_serve()) as host:
        host.call("load", {"source": source, "path": "per-call.py"})
        with pytest.raises(ProgramFailure, match="budget: 101 texts in one call; at most 100"):
            _add(host, budget)
    source = hostile(index=_embeds(3, 100))
    with Host(LIMITS, serve=_serve()) as host:
        host.call("load", {"source": source, "path": "cumulative.py"})
        with pytest.raises(ProgramFailure, match="budget: 300 texts in this request; at most 250"):
            _add(host, budget)
        host.call(*ADD, budget=BackendBudget(texts_per_call=100, texts=400))  # alive, and fits


def test_the_backend_service_embeds_no_more_than_one_answer_holds() -> None:
    for dim, most in ((4096, 4096), (384, 16_384)):  # 64 MiB of rows; at most 16,384 texts
        service = BackendService(HashingEmbedder(dim), None, "test", 0)
        with pytest.raises(ValueError, match=f"at most {most} texts per call"):
            service({"method": "embed", "texts": ["ab"] * (most + 1)}, [])
        answer, _ = service({"method": "embed", "texts": ["ab"]}, [])
        assert answer == {"array": {"shape": [1, dim]}}


def test_the_default_budget_grows_with_the_request_data() -> None:
    small, grown = BackendBudget.for_request(0), BackendBudget.for_request(8_000_000)
    assert grown.chars >= small.chars + 8_000_000 and grown.texts > small.texts
    assert small.texts_per_call * 4096 * 4 <= small.reply_bytes  # the probe's width fits


# -- text a program wrote, before it reaches a terminal ----------------------------------------

PAINT = "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\u202e"
CONTROLS = "\x1b\x07\u202e"


def test_the_host_stderr_in_a_failure_is_printable() -> None:
    top = f"WRITE(2, {PAINT.encode()!r})\nEXIT(3)\n"
    with Host(LIMITS, serve=_serve()) as host, pytest.raises(HostFailure) as caught:
        host.call("load", {"source": hostile(top=top), "path": "paint.py"})
    text = str(caught.value)
    assert "exited with status 3" in text and "\\x1b]0;pwned\\x07" in text, text
    assert not set(text) & set(CONTROLS), text


def test_an_error_frame_is_printable_and_bounded() -> None:
    failure = ProgramFailure.from_frame({"error": PAINT * 1000, "type": "\x1b[31mBoom"})
    assert "\x1b" not in str(failure) + failure.kind and "\u202e" not in str(failure)
    assert len(str(failure)) <= 2000 and failure.kind == "\\x1b[31mBoom"


def test_evolve_check_prints_no_terminal_control_from_a_program(tmp_path: Path) -> None:
    program = tmp_path / "paint.py"
    old = "        vectors = self.backend.embed([u.content for u in units])\n"
    message = PAINT + "[link=https://evil.example]x[/link]"  # rich markup is text, too
    program.write_text(DENSE.replace(old, f"        raise ValueError({message!r})\n" + old))
    done = subprocess.run(
        [sys.executable, "-m", "evolve", "check", str(program)], capture_output=True,
        timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1 and b"pwned" in out, out[-2000:]
    assert b"\x1b" not in out and b"\x07" not in out and "\u202e".encode() not in out
    assert b"[link=https://evil.example]" in out


def test_a_host_that_closes_its_pipe_and_lives_on_fails_within_the_grace() -> None:
    top = 'real("posix", "close")(1)\nSLEEP(30)\n'
    with Host(LIMITS, serve=_serve()) as host:
        began = time.monotonic()
        with pytest.raises(HostFailure, match="closed its pipe"):
            host.call("load", {"source": hostile(top=top), "path": "mute.py"}, timeout=10.0)
        assert time.monotonic() - began < 2.0
