"""The runtime through its public API (:func:`evolve.open_memory`): users apart, writes
serialised per user and concurrent across users, one closed session per ``add``, retries that do
not double, reopening, switching programs and rolling back, the one-line notices, bad input."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import evolve
from evolve.evaluation.identity import HEADER_MARK, ScoredAs, pipeline_version, read_scored_as
from evolve.evaluation.pipeline import Pipeline
from evolve.models.embed import precision

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = (ROOT / "seeds" / "simple.py").read_text()

# A hostile program: every text it ever indexes goes into a module global (reached through a
# function, which the static checker does not follow), and retrieval returns that global,
# whatever memory it is asked about: one host shared by two users would leak.
LEAKY = """
from dataclasses import dataclass

EXTRACTION_INSTRUCTION = "Write one unit per message."
PLANNING_INSTRUCTION = "Use the question."
ANSWER_INSTRUCTION = "Answer from the memories."
SEEN = []


def shared():
    return SEEN


@dataclass
class MemoryUnit:
    content: str


@dataclass
class Query:
    text: str


class Memory:
    def __init__(self, backend):
        self.backend = backend
        self.count = 0

    def index(self, units, segment):
        self.count += len(units)
        shared().extend(u.content for u in units)

    def retrieve(self, query):
        return " | ".join(shared())[-16000:]
"""

# Every unit's content, in index order: what the memory holds, each time it holds it.
ALL = SIMPLE.replace(
    'text = "\\n\\n".join(render(u) for u in self.units)',
    'text = " ".join(u.content for u in self.units)',
)


def program(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def opened(tmp_path: Path, prog: Path, notices: list[str] | None = None, **kw: object):
    said = notices if notices is not None else []
    return evolve.open_memory(prog, tmp_path / "store", embedder="hashing", notice=said.append,
                              **kw)  # type: ignore[arg-type]  # fmt: skip


def test_users_apart_even_from_a_program_that_leaks_through_a_global(tmp_path: Path):
    """A's context never holds B's text: each user has a host of their own, also after
    eviction (max_live=1 closes a user's host when the other one is used)."""
    prog = program(tmp_path, "leaky.py", LEAKY)
    for max_live in (2, 1):
        with opened(tmp_path / str(max_live), prog, max_live=max_live) as memory:
            memory.add([{"role": "user", "content": "ana's secret is 1234"}], user="ana")
            memory.add([{"role": "user", "content": "bob's secret is 9876"}], user="bob")
            memory.add([{"role": "user", "content": "ana again"}], user="ana")
            assert memory.live_hosts() <= max_live
            ana = memory.context("secret?", user="ana")
            bob = memory.context("secret?", user="bob")
            assert "9876" not in ana and "1234" not in bob, (ana, bob)
            if max_live == 2:  # evicted, a host loses its globals: they are not the memory's
                assert "1234" in ana and "9876" in bob, (ana, bob)


def test_writes_serialised_per_user_and_concurrent_across_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two threads per user add sessions at once: each user's adds never overlap, the two
    users' adds do, and every session is in its user's memory once, in its log once."""
    spans: dict[str, list[tuple[float, float]]] = {"ana": [], "bob": []}
    real_add = Pipeline.add

    def slow_add(self: Pipeline, segment, units, timeout=None):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        real_add(self, segment, units, timeout)
        time.sleep(0.05)  # on the optimizer's side: long enough for the other user to overlap
        spans[segment.session_id.split("-")[0]].append((began, time.perf_counter()))

    monkeypatch.setattr(Pipeline, "add", slow_add)
    prog = program(tmp_path, "all.py", ALL)
    with opened(tmp_path, prog) as memory:
        for user in spans:  # hosts started first, so the timed part is the adds
            memory.context("warm", user=user)

        def adds(user: str, part: int) -> None:
            for i in range(6):
                memory.add([{"role": "user", "content": f"{user}-{part}-{i}"}], user=user,
                           session_id=f"{user}-{part}-{i}")  # fmt: skip

        threads = [threading.Thread(target=adds, args=(u, p)) for u in spans for p in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for user, own in spans.items():
            own.sort()
            assert len(own) == 12
            assert all(a[1] <= b[0] for a, b in zip(own, own[1:], strict=False)), "overlap"
            text = memory.context("all", user=user)
            words = text.split()
            expected = {f"{user}-{p}-{i}" for p in (0, 1) for i in range(6)}
            assert sorted(w for w in words if "-" in w) == sorted(expected)
            assert len({s.session_id for s in memory.history(user)}) == 12
        other = {u: [s for s in spans[u]] for u in spans}
        overlapping = any(a[0] < b[1] and b[0] < a[1] for a in other["ana"] for b in other["bob"])
        assert overlapping, "the two users' adds never ran side by side"


def test_one_add_is_one_closed_session_and_a_retry_does_not_double(tmp_path: Path):
    """What retrieval sees: every session whose add returned, nothing else (there is no open
    session); an add retried with its session id adds nothing."""
    prog = program(tmp_path, "all.py", ALL)
    with opened(tmp_path, prog) as memory:
        assert memory.context("anything", user="ana") == ""
        assert memory.add([{"content": "first"}, {"content": "second"}], user="ana",
                          date="2024-05-01", session_id="s1")  # fmt: skip
        assert memory.context("anything", user="ana") == "user: first user: second"
        assert not memory.add([{"content": "first"}], user="ana", session_id="s1")
        assert memory.add([{"role": "assistant", "content": "third"}], user="ana")
        assert memory.context("x", user="ana") == "user: first user: second assistant: third"
        (session, later) = memory.history("ana")
        assert session.session_id == "s1" and session.date == "2024-05-01"
        assert [m.id for m in session.messages] == ["s1.0", "s1.1"]


def test_reopen_switch_and_roll_back(tmp_path: Path):
    """A reopened store gives the same memory (snapshot plus log); a new program is built from
    the log and says so; the previous program stays in the store and serves again."""
    first = program(tmp_path, "all.py", ALL)
    second = program(
        tmp_path,
        "reversed.py",
        ALL.replace("for u in self.units)", "for u in reversed(self.units))"),
    )
    with opened(tmp_path, first, snapshot_every=2) as memory:
        for i in range(5):
            memory.add([{"content": f"m{i}"}], user="ana")
        before = memory.context("q", user="ana")
    assert before == " ".join(f"user: m{i}" for i in range(5))
    states = sorted(p.name for p in (tmp_path / "store").glob("scopes/*/*.state"))
    assert len(states) == 1 and states[0].endswith(".5.state")
    with opened(tmp_path, first) as memory:
        assert memory.context("q", user="ana") == before
    notices: list[str] = []
    with opened(tmp_path, second, notices) as memory:
        assert memory.context("q", user="ana") == " ".join(f"user: m{i}" for i in range(4, -1, -1))
        previous = memory.previous_program
        memory.add([{"content": "m5"}], user="ana")
    assert any("switched to this program" in n for n in notices), notices
    assert previous is not None and previous.read_text() == ALL
    with opened(tmp_path, previous) as memory:  # roll back: the log's sixth session too
        assert memory.context("q", user="ana") == before + " user: m5"


def header(scored: ScoredAs) -> str:
    return "\n".join([f"{HEADER_MARK} of a memory program (test)", *scored.lines()]) + "\n\n"


def test_says_once_when_it_runs_otherwise_than_scored(tmp_path: Path):
    here = ScoredAs("offline", None, "hashing", precision(), pipeline_version())
    same = program(tmp_path, "same.py", header(here) + SIMPLE)
    assert read_scored_as(same.read_text()) == here
    notices: list[str] = []
    opened(tmp_path / "a", same, notices).close()
    assert len(notices) == 1 and "offline stand-ins" in notices[0], notices
    scored = ScoredAs("task model", "openai/gpt-4o-mini", "minilm", precision(), "0" * 64)
    other = program(tmp_path, "other.py", header(scored) + SIMPLE)
    notices = []
    opened(tmp_path / "b", other, notices).close()
    (line,) = [n for n in notices if "scored otherwise" in n]
    for part in ("mode task model -> offline", "task model openai/gpt-4o-mini -> none",
                 "embedder minilm -> hashing", "pipeline version 000000000000 ->"):  # fmt: skip
        assert part in line, line
    assert "precision" not in line


def test_an_export_header_from_before_the_pipeline_version_reads_as_one() -> None:
    """Older exports name the pipeline version ``evaluator version``: read the same."""
    scored = ScoredAs("offline", None, "hashing", precision(), "e" * 64)
    old = header(scored).replace("#   pipeline version: ", "#   evaluator version: ")
    assert old != header(scored) and read_scored_as(old + SIMPLE) == scored


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.add([{"content": "x"}], user=""), "user is a non-empty string"),
        (lambda m: m.add([{"role": "user"}], user="a"), "message 0 is not a mapping"),
        (lambda m: m.add([], user="a"), "at least one message"),
        (lambda m: m.add([{"content": "x"}], user="a", date=20240501), "date is an ISO"),
        (lambda m: m.context(None, user="a"), "question is a string"),
        (lambda m: m.answer("q", user="a"), "needs a task model"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_line(tmp_path: Path, call, message: str):  # type: ignore[no-untyped-def]
    with opened(tmp_path, program(tmp_path, "simple.py", SIMPLE)) as memory:
        with pytest.raises(evolve.AgentMemoryError, match=message) as info:
            call(memory)
    assert "\n" not in str(info.value)


def test_a_program_that_fails_the_sandbox_is_refused(tmp_path: Path):
    bad = program(tmp_path, "bad.py", "import os\n" + SIMPLE)
    with pytest.raises(evolve.AgentMemoryError, match="does not pass the sandbox"):
        opened(tmp_path, bad)
    assert not (tmp_path / "store").exists()


FRAGILE = ALL.replace(
    "    def index(self, units, segment):\n",
    "    def index(self, units, segment):\n"
    "        if any('boom' in u.content for u in units):\n"
    "            raise ValueError('cannot take this session')\n",
).replace(
    "        self.units: list[MemoryUnit] = []\n",
    "        self.units: list[MemoryUnit] = []\n        self.key = lambda u: u.content\n",
)


def test_a_failed_add_adds_nothing_and_an_unstorable_memory_is_rebuilt(tmp_path: Path):
    """The program raises on one session: add raises one line, the session is not in the log
    and the memory goes on without it. Its memory holds a lambda, so it cannot be snapshotted:
    said once, and the reopened store rebuilds it from the log."""
    assert FRAGILE.count("boom") == 1 and "lambda" in FRAGILE
    prog = program(tmp_path, "fragile.py", FRAGILE)
    notices: list[str] = []
    with opened(tmp_path, prog, notices, snapshot_every=1) as memory:
        memory.add([{"content": "one"}], user="ana", session_id="a")
        with pytest.raises(evolve.AgentMemoryError, match="the program failed") as info:
            memory.add([{"content": "boom"}], user="ana", session_id="b")
        assert "\n" not in str(info.value) and "cannot take this session" in str(info.value)
        assert [s.session_id for s in memory.history("ana")] == ["a"]
        assert memory.add([{"content": "two"}], user="ana", session_id="b")  # the id is free
        assert memory.context("q", user="ana") == "user: one user: two"
    unstored = [n for n in notices if "cannot be snapshotted" in n]
    assert len(unstored) == 1, notices
    assert not list((tmp_path / "store").glob("scopes/*/*.state"))
    with opened(tmp_path, prog) as memory:
        assert memory.context("q", user="ana") == "user: one user: two"
