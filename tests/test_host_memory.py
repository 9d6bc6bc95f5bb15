"""A memory grown one session at a time in the host (``open``, ``add``, ``dump``) is the memory
``index`` builds from all sessions at once: the same retrieval, the same stored state; and no
request carries more than one session.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from contract.types import Message, Segment
from evolve.backend_service import BackendService
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


@pytest.mark.parametrize("seed", ["hybrid.py", "simple.py"])
def test_growing_a_memory_session_by_session_equals_indexing_it_at_once(seed: str) -> None:
    segments = sessions()
    limits = {"dim": HashingEmbedder.dim, "max_complete_calls": 0}
    with host_for(seed) as once, host_for(seed) as grown:
        units = [units_of(once, s) for s in segments]
        result, state_once = once.call(
            "index", {**limits, "segments": [asdict(s) for s in segments], "units": units}
        )
        grown.call("open", limits)
        for segment, unit_dicts in zip(segments, units, strict=True):
            grown.call("add", {"segment": asdict(segment), "units": unit_dicts})
        dumped, state_grown = grown.call("dump")
        assert result["stored"] and dumped["stored"]
        assert state_grown == state_once
        for question in ("When was the marathon training?", "What about the schema?"):
            query, _ = once.call("query", {"question": question, "date": None, "record": None})
            got_once, _ = once.call("retrieve", {"query": query})
            got_grown, _ = grown.call("retrieve", {"query": query})
            assert got_grown == got_once and got_once["text"]


def test_add_before_open_is_one_clear_error() -> None:
    from sandbox.isolate import ProgramFailure

    with host_for("simple.py") as host:
        with pytest.raises(ProgramFailure, match="no memory opened"):
            host.call("add", {"segment": asdict(sessions()[0]), "units": []})
