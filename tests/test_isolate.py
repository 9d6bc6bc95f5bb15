"""The optimizer's side of a confined host (:mod:`sandbox.isolate`) in a busy process.

A long run's worker holds many descriptors (caches, logs, sockets of concurrent calls), so the
pipes to a host it starts can be numbered 1024 or more, past what ``select`` can watch: talking
to the host must work there all the same (it once failed every question with "filedescriptor
out of range in select()"); and every frame it reads is bounded by the kind its prefix
declares before any of it is read.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import wire
from sandbox.isolate import remove_tree

HIGH = 1100  # the first descriptor the host's pipes may get

# Run in a fresh interpreter: in the test worker, a thread left by an earlier test or a garbage
# collection during ``Host()`` can close a low descriptor and hand it to the host's pipes.
CHILD = f"""
import os, resource, sys
from pathlib import Path
from sandbox.isolate import Host, Limits
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, {HIGH} + 64), hard))
null = os.open(os.devnull, os.O_RDONLY)
while os.dup(null) < {HIGH}:
    pass
with Host(Limits(cpu_seconds=30, call_seconds=20.0)) as host:
    assert host.proc.stdin is not None
    print("stdin", host.proc.stdin.fileno(), flush=True)
    host.call("load", {{"source": Path(sys.argv[1]).read_text(), "path": "dense.py"}})
    host.call("schema")
print("answered", flush=True)
"""


def test_a_host_whose_pipes_are_numbered_above_1024_answers() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HIGH + 64:
        pytest.skip(f"the hard limit on open files ({hard}) is below {HIGH + 64}")
    dense = Path(__file__).resolve().parents[1] / "seeds" / "dense.py"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(dense)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split()
    assert int(lines[lines.index("stdin") + 1]) > 1024
    assert "answered" in lines


def _recorder(frame: bytes) -> tuple[list[int], Callable[[int], bytes]]:
    """A ``recv`` over ``frame`` that records how many bytes each read asked for."""
    asked: list[int] = []
    view = memoryview(frame)

    def recv(n: int) -> bytes:
        nonlocal view
        asked.append(n)
        out, view = bytes(view[:n]), view[n:]
        return out

    return asked, recv


BOUNDS = {"result": 1 << 10, "error": 1 << 10, "backend": 1 << 20}


def test_a_frame_is_bounded_by_its_declared_kind_before_any_of_it_is_read() -> None:
    big = {"kind": "result", "result": "x" * 4096}  # within a backend request's bound
    asked, recv = _recorder(wire.encode_frame(big))
    with pytest.raises(wire.WireError, match="too large"):
        wire.read_frame(recv, bounds=BOUNDS)
    assert asked == [8]  # the prefix only: the JSON was never read
    request = {"kind": "backend", "method": "embed", "texts": ["x" * 4096]}
    assert wire.read_frame(_recorder(wire.encode_frame(request))[1], bounds=BOUNDS)[0] == request


def test_a_frame_whose_header_lies_about_its_kind_is_refused() -> None:
    frame = bytearray(wire.encode_frame({"kind": "result", "result": "x" * 4096}))
    frame[6] = wire.KINDS.index("backend")  # declared a backend request: the bigger bound
    with pytest.raises(wire.WireError, match="'result' header in a 'backend' frame"):
        wire.read_frame(_recorder(bytes(frame))[1], bounds=BOUNDS)
    frame[6] = len(wire.KINDS)
    with pytest.raises(wire.WireError, match="kind code"):
        wire.read_frame(_recorder(bytes(frame))[1], bounds=BOUNDS)
    with pytest.raises(wire.WireError, match="unexpected frame kind 'ready'"):
        wire.read_frame(_recorder(wire.encode_frame({"kind": "ready"}))[1], bounds=BOUNDS)


def _backend(texts: object) -> bytes:
    return wire.encode_frame({"kind": "backend", "method": "embed", "texts": texts})


def test_a_frame_is_decoded_only_when_its_items_and_nesting_fit_its_bound() -> None:
    most = wire.max_items(BOUNDS["backend"])
    with pytest.raises(wire.WireError, match=f"{most + 1:,} JSON items"):  # the header has 7
        wire.read_frame(_recorder(_backend([0] * (most - 6)))[1], bounds=BOUNDS)
    wire.read_frame(_recorder(_backend([0] * (most - 7)))[1], bounds=BOUNDS)
    deep: list[object] = []
    for _ in range(wire.MAX_DEPTH - 2):  # in the header's object: MAX_DEPTH levels
        deep = [deep]
    wire.read_frame(_recorder(_backend(deep))[1], bounds=BOUNDS)
    with pytest.raises(wire.WireError, match=f"deeper than {wire.MAX_DEPTH}"):
        wire.read_frame(_recorder(_backend([deep]))[1], bounds=BOUNDS)


def test_what_strings_hold_is_not_counted_as_items_or_nesting() -> None:
    texts = [",[{:" * 100_000, '\\"[[[', '\\\\"' + "[" * 100, '"' * 50 + "{" * 50, "\\"]
    frame = _backend(texts)
    assert wire.json_cost(frame[8:]) == (1 + 1 + 3 + 2 + 1 + len(texts) - 1, 2)
    assert wire.read_frame(_recorder(frame)[1], bounds=BOUNDS)[0]["texts"] == texts


def test_removing_a_scratch_directory_touches_nothing_outside_it(tmp_path: Path) -> None:
    """Its parent keeps its mode when the directory is gone, or is removed a second time (a
    host is killed, then closed), and unreadable folders inside it go too."""
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(0o1777)
    scratch = parent / "scratch"
    (scratch / "hidden").mkdir(parents=True)
    (scratch / "hidden" / "left").write_text("x")
    (scratch / "hidden").chmod(0o300)
    for _ in range(2):
        remove_tree(str(scratch))
        assert not scratch.exists()
        assert parent.stat().st_mode & 0o7777 == 0o1777
    remove_tree(str(parent / "never-made"))
    assert parent.stat().st_mode & 0o7777 == 0o1777
