r"""Second red team corpus for the walls (issue 40): the optimizer's own bounds against a host.

Same assumption as :mod:`test_hostile_walls`: the program holds the real builtins (here by
patching :mod:`sandbox.serve` in its own host, which tier 1 refuses but a host does not) and
can time anything. These cases attack the new code of the issue: the frame scan of
:mod:`sandbox.wire` (what ``json.loads`` accepts that the byte scan does not see), the deadline
of :mod:`sandbox.isolate` (dripped frames, deadline credit for backend time) and text a program
can bring to a terminal through tier 1. Three got through at eb7b50d and are closed now, each
case guarding its fix: frames in UTF-16/32 (``json.loads`` of bytes detects them; their code
units hide quotes from the byte scan, so a 33 MiB units frame decoded into 5.7M dicts), many
one-character embed calls whose per-call time moved the deadline in full, and raw control
characters and bidi overrides in a program's source, which ``evolve show`` printed.
"""

from __future__ import annotations

import struct
import textwrap
import time
from typing import Any

import pytest
from conftest import MINIMAL, unchecked

from contract.types import Message, Segment
from evolve.evaluation.pipeline import Pipeline
from evolve.models.embed import HashingEmbedder
from sandbox.isolate import (
    BACKEND_EXTENSION,
    GRACE_SECONDS,
    Host,
    HostFailure,
    HostTimeout,
    Limits,
    ProgramFailure,
)
from sandbox.static import check_source
from sandbox.wire import MAX_DEPTH, WireError, json_cost, max_items, read_frame

SEGMENT = Segment("s1", "2024-01-01", (Message("m1", "user", "hello there"),))


def _frame_reader(data: bytes, code: int = 0) -> Any:
    frame = struct.pack(">II", len(data), code) + data
    at = 0

    def recv(n: int) -> bytes:
        nonlocal at
        out, at = frame[at : at + n], at + n
        return out

    return recv


def _pipeline(patch: str, call_timeout: float = 20.0) -> Pipeline:
    """The minimal program whose host runs ``patch`` at import with the real builtins."""
    forge = 'B = print.__self__\nserve = B.__import__("sandbox.serve").serve\n'
    source = MINIMAL.replace(
        "from dataclasses import dataclass\n",
        "from dataclasses import dataclass\n" + forge + textwrap.dedent(patch),
    )
    return Pipeline(unchecked(source), llm=None, embedder=HashingEmbedder(), call_prefix="t",
                    max_complete_calls=0, call_timeout=call_timeout)  # fmt: skip


# -- the frame scan: encodings json.loads detects but the byte scan does not read ----------------

BYPASS_HEAD = '{"x":"\u2241","kind":"result","result":['  # U+2241: one 0x22 byte in UTF-16/32


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le"])
def test_a_frame_in_another_encoding_is_counted_or_refused(encoding: str) -> None:
    """1 MiB allowed: at most max_items(1 MiB) values may be decoded, whatever the encoding."""
    allowed = 1 << 20
    n = allowed // len("{},".encode(encoding)) - 64
    data = (BYPASS_HEAD + "{}," * n + "{}]}").encode(encoding)
    assert len(data) <= allowed
    try:
        header, _ = read_frame(_frame_reader(data), bounds={"result": allowed})
    except WireError:
        return
    assert len(header["result"]) <= max_items(allowed), (len(header["result"]), json_cost(data))


UTF16_UNITS = """
struct = B.__import__("struct")
def units(self, req, blobs):  # UTF-16-LE by hand: the host cannot load codecs once confined
    text = ('{"x":"A","kind":"result","result":[' + "{}," * 150_000 + '{}]}').encode()
    data = bytearray(2 * len(text))
    data[0::2] = text
    data[13] = 0x22  # the "A" becomes U+2241, one 0x22 byte inside a string
    self.out.write(struct.pack(">II", len(data), 0) + data)
    self.out.flush()
    return [], []
serve.Server.op_units = units
"""


def test_a_units_answer_in_utf16_is_a_protocol_breach() -> None:
    pipeline = _pipeline(UTF16_UNITS)
    try:
        with pytest.raises(HostFailure) as failed:
            pipeline.units(SEGMENT, None)
        assert "does not conform" not in str(failed.value)  # refused before it was decoded
    finally:
        pipeline.close()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            '{"kind":"result","a":"' + '\\\\\\"' * 1000 + '","b":[' + "[]," * 40_000 + "[]]}",
            id="esc",
        ),
        pytest.param('{"kind":"result","a":' + "[" * 40 + "]" * 40 + "}", id="deep"),
        pytest.param('{"kind":"result","a":' + "1" * 5000 + "}", id="int-digits"),
        pytest.param('\ufeff{"kind":"result","a":[' + "{}," * 60_000 + "{}]}", id="bom"),
        pytest.param('{"kind":"result","a":"\\ud800' + "\x00" * 10 + '"}', id="raw-nul"),
    ],
)
def test_utf8_frames_the_scan_counts(text: str) -> None:
    """Escapes, nesting, long integers, a BOM, raw NULs: refused, or decoded within bounds."""
    allowed = 1 << 20
    data = text.encode("utf-8", "surrogatepass")
    t0 = time.process_time()
    try:
        header, _ = read_frame(_frame_reader(data), bounds={"result": allowed})
    except WireError:
        return
    finally:
        assert time.process_time() - t0 < 1.0
    assert _values(header) <= max_items(allowed) and _depth(header) <= MAX_DEPTH


def _values(v: Any) -> int:
    if isinstance(v, list):
        return 1 + sum(_values(x) for x in v)
    if isinstance(v, dict):
        return 1 + sum(1 + _values(x) for x in v.values())
    return 1


def _depth(v: Any) -> int:
    items = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else None
    return 0 if items is None else 1 + max(map(_depth, items), default=0)


# -- the deadline ------------------------------------------------------------------------------

DRIP = """
time, struct = B.__import__("time"), B.__import__("struct")
def drip(self, req, blobs):
    self.out.write(struct.pack(">II", 1000, 0))
    self.out.flush()
    for _ in range(200):  # one byte a poll interval
        self.out.write(b" ")
        self.out.flush()
        time.sleep(0.05)
    return None, []
serve.Server.op_open = drip
"""


def test_a_dripped_frame_ends_the_request_at_its_deadline() -> None:
    pipeline = _pipeline(DRIP, call_timeout=3.0)
    pipeline.schema("MemoryUnit")  # loaded, before the timed request
    try:
        began = time.monotonic()
        with pytest.raises(HostTimeout):
            pipeline.open()
        assert time.monotonic() - began < 3.0 + GRACE_SECONDS + 0.5
    finally:
        pipeline.close()


ONE_CHAR_CALLS = MINIMAL.replace(
    "        self.units = []\n",
    "        self.units = []\n        for _ in range(250):\n            backend.embed(['x'])\n",
)


def test_many_tiny_embed_calls_do_not_stretch_a_request_past_its_cap() -> None:
    """Each call costs the optimizer 20 ms whatever its size (a model's per-call overhead)."""

    def serve(header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        time.sleep(0.02)
        n = len(header["texts"])
        return {"array": {"shape": [n, 8]}}, [bytes(32 * n)]

    allowed = 0.3
    with Host(Limits(call_seconds=20), serve=serve) as host:
        host.call("load", {"source": ONE_CHAR_CALLS, "path": "p.py"})
        began = time.monotonic()
        try:
            host.call("open", {"dim": 8, "max_complete_calls": 0}, timeout=allowed,
                      embed_chars=4000)  # fmt: skip
        except (HostTimeout, ProgramFailure):
            pass
        took = time.monotonic() - began
    assert took < allowed * (1 + BACKEND_EXTENSION) + GRACE_SECONDS, took


# -- text a program brings to a terminal ---------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('NOTE = "\x1b]0;pwned\x07\x1b[2Jverdict: passed"\n', id="esc-string"),
        pytest.param("# \x1b[1A\x1b[2K tier 1 passed\n", id="esc-comment"),
        pytest.param('NOTE = "ok\u202e\u2066"  # trojan source\n', id="bidi"),
    ],
)
def test_tier1_refuses_terminal_control_characters_in_the_source(line: str) -> None:
    assert check_source(MINIMAL + line, "p.py")
