"""The optimizer's side of a confined host (:mod:`sandbox.isolate`) in a busy process.

A long run's worker holds many descriptors (caches, logs, sockets of concurrent calls), so the
pipes to a host it starts can be numbered 1024 or more, past what ``select`` can watch: talking
to the host must work there all the same (it once failed every question with "filedescriptor
out of range in select()").
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.isolate import Host, Limits

DENSE = (Path(__file__).resolve().parents[1] / "seeds" / "dense.py").read_text()
HIGH = 1100  # the first descriptor the host's pipes may get


@pytest.fixture()
def low_descriptors_taken() -> Iterator[None]:
    """Every descriptor below :data:`HIGH` is open, so new pipes are numbered above it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HIGH + 64:
        pytest.skip(f"the hard limit on open files ({hard}) is below {HIGH + 64}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 64), hard))
    taken = []
    with open(os.devnull) as null:
        while not taken or taken[-1] < HIGH:
            taken.append(os.dup(null.fileno()))
    try:
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_host_whose_pipes_are_numbered_above_1024_answers(low_descriptors_taken: None) -> None:
    with Host(Limits(cpu_seconds=30, call_seconds=20.0)) as host:
        assert host.proc.stdin is not None and host.proc.stdin.fileno() > 1024
        host.call("load", {"source": DENSE, "path": "dense.py"})
        host.call("smoke")
