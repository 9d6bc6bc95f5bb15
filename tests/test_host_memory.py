"""A memory grown one session at a time in the host (``open``, ``add``, ``dump``) and the memory
restored from its dumped state in another host are the same memory: the same retrieval; and no
request carries more than one session.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from contract.types import Message, Segment
from evolve.evaluation.backend import BackendService
from evolve.models.embed import HashingEmbedder
from sandbox.isolate import Host, Limits

SEEDS = Path(__file__).parent.parent / "seeds"


def sessions() -> list[Segment]:
    topics = ("marathon training", "database schema", "guitar lessons", "trip to Paris")
    return [
        Segment(
            str(i),
            f"2024-03-{i + 1:02d}",
            tuple(
                Message(
                    f"{i}-{j}",
                    "user" if j % 2 == 0 else "assistant",
                    f"Session {i} message {j} about {topics[(i + j) % 4]}.",
                )  # fmt: skip
                for j in range(6)
            ),
        )
        for i in range(5)
    ]


def host_for(seed: str) -> Host:
    service = BackendService(HashingEmbedder(), None, "test", 0)
    host = Host(Limits(cpu_seconds=120, call_seconds=60.0), serve=service)
    host.call("load", {"source": (SEEDS / seed).read_text(), "path": seed})
    return host


def units_of(host: Host, segment: Segment) -> list[dict[str, object]]:
    units, _ = host.call("units", {"segment": asdict(segment), "records": None})
    return list(units)


def dumped(host: Host) -> bytes:
    """The host's memory state, fetched chunk by chunk as the pipeline does."""
    result, _ = host.call("dump")
    assert result["stored"], result
    chunks: list[bytes] = []
    while sum(map(len, chunks)) < result["bytes"]:
        _, blobs = host.call("state_chunk", {"offset": sum(map(len, chunks))})
        chunks += blobs
    return b"".join(chunks)


@pytest.mark.parametrize("seed", ["hybrid.py", "simple.py"])
def test_a_memory_grown_session_by_session_equals_its_restored_state(seed: str) -> None:
    segments = sessions()
    limits = {"dim": HashingEmbedder.dim, "max_complete_calls": 0}
    with host_for(seed) as grown, host_for(seed) as restored:
        grown.call("open", limits)
        for segment in segments:
            grown.call("add", {"segment": asdict(segment), "units": units_of(grown, segment)})
        state = dumped(grown)
        restored.call("state_part", {}, [state])
        restored.call("restore", limits)
        assert dumped(restored)  # a restored memory dumps again
        for question in ("When was the marathon training?", "What about the schema?"):
            query, _ = grown.call("query", {"question": question, "date": None, "record": None})
            got_grown, _ = grown.call("retrieve", {"query": query})
            got_restored, _ = restored.call("retrieve", {"query": query})
            assert got_restored == got_grown and got_grown["text"]


def test_add_before_open_is_one_clear_error() -> None:
    from sandbox.isolate import ProgramFailure

    with host_for("simple.py") as host:
        with pytest.raises(ProgramFailure, match="no memory opened"):
            host.call("add", {"segment": asdict(sessions()[0]), "units": []})
