"""Nothing a sandbox verdict rests on can be forged by the program, even by code that got past
every Python-level restriction: the probe's clock and meters, the frames the optimizer reads,
the type of what ``retrieve`` returns, the scratch directory's size.

Code with the real builtins is loaded straight into a host, skipping tier 1, through the
hostile corpus's escape (:data:`test_sandbox_hostile.ESCAPE`): what it may still do is what
the host itself allows.
"""

from __future__ import annotations

import time

import pytest
from test_sandbox_hostile import ESCAPE, QUADRATIC_INDEX, QUADRATIC_INIT, dense

from sandbox import wire
from sandbox.check import CHECK_LIMITS, _probe_tier, check_program
from sandbox.isolate import Host, HostFailure, ProgramFailure
from sandbox.probe import BackendShape, ProbeBackend
from sandbox.tiers import TierError, smoke_tier

# Every clock a program could reach in the host reads zero: the host's own modules' bound
# clocks included. The probe must still see the quadratic work.
STOP_CLOCKS = """
_sys = real("sys", "modules")
for _mod in list(_sys.values()):
    try:
        _names = _mod.__dict__  # (the restricted getattr refuses private names)
    except AttributeError:
        continue
    for _name in ("_now", "process_time", "perf_counter", "monotonic", "thread_time"):
        if callable(_names.get(_name)):
            _names[_name] = lambda *a: 0.0
"""


def test_a_program_that_stops_every_clock_still_fails_the_probe() -> None:
    source = dense(top=ESCAPE + STOP_CLOCKS, init=QUADRATIC_INIT, index=QUADRATIC_INDEX)
    backend = ProbeBackend()
    with Host(CHECK_LIMITS, serve=backend.serve) as host:
        host.call("load", {"source": source, "path": "clock.py"})
        result = _probe_tier(host, backend)
    assert not result.passed and result.rule == "probe", result
    assert "super-linear work" in (result.error or ""), result.error


def test_the_probe_counts_embeddings_where_the_program_cannot_reach() -> None:
    backend = ProbeBackend()
    with Host(CHECK_LIMITS, serve=backend.serve) as host:
        host.call("load", {"source": dense(), "path": "dense.py"})
        result = _probe_tier(host, backend)
    assert result.passed, result
    full, small = result.details["full"], result.details["small"]
    assert full["texts"] >= 2000 and small["texts"] >= 500  # every unit was embedded, here
    assert full["cpu_s"] > 0  # read from the kernel, not reported by the host


FORGED_FRAME = """
_write = real("posix", "write")
# a frame announcing a 400 MiB blob, under the wire's own 512 MiB limit (>II json length and blob
# count, the JSON, >Q blob length), then the first bytes of it
_write(1, (2).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"{}" + (400 << 20).to_bytes(8, "big")
       + b"x" * 65536)
"""


def test_a_forged_frame_is_refused_from_its_length_not_read() -> None:
    source = dense(retrieve=FORGED_FRAME, top=ESCAPE)
    with Host(CHECK_LIMITS, serve=ProbeBackend().serve) as host:
        host.call("load", {"source": source, "path": "forge.py"})
        start = time.monotonic()
        with pytest.raises(HostFailure, match="protocol"):
            smoke_tier(host, BackendShape(), 20.0, seed=0)
        assert time.monotonic() - start < 5


def test_read_frame_checks_every_length_before_reading_its_bytes() -> None:
    frame = wire.encode_frame({"kind": "result"}, [b"x" * 100])
    asked: list[int] = []
    view = memoryview(frame)

    def recv(n: int) -> bytes:
        nonlocal view
        asked.append(n)
        out, view = bytes(view[:n]), view[n:]
        return out

    with pytest.raises(wire.WireError, match="too large"):
        wire.read_frame(recv, max_bytes=50)
    assert 100 not in asked  # the blob's bytes were never requested
    view = memoryview(frame)
    assert wire.read_frame(recv, max_bytes=200)[1] == [b"x" * 100]


LYING_STR = """
class Short(str):
    def __len__(self):
        return 10
"""


def test_a_str_subclass_cannot_lie_about_its_length() -> None:
    source = dense(top=LYING_STR, retrieve='return Short("x" * 20000)')
    report = check_program(source, "lying.py")
    assert not report.passed and report.failure is not None
    assert report.failure.tier in (1, 3), report.repair_text()
    if report.failure.tier == 3:  # tier 1 may refuse the subclass outright; if not, tier 3 does
        assert "must return str" in (report.failure.error or ""), report.repair_text()


def test_evaluation_refuses_a_str_subclass_too() -> None:
    source = dense(top=ESCAPE + LYING_STR, retrieve='return Short("x" * 20000)')
    with Host(CHECK_LIMITS, serve=ProbeBackend().serve) as host:
        host.call("load", {"source": source, "path": "lying.py"})
        with pytest.raises((ProgramFailure, TierError), match="must return str"):
            smoke_tier(host, BackendShape(), 20.0, seed=0)
