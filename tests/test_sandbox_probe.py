"""The complexity probe's growth verdict (tier 4, :mod:`sandbox.probe`) on a busy machine.

A correct (linear) program must never be rejected because the machine was loaded, and a
quadratic one must still be. Two checks: the verdict logic against scripted timings in which a
run is slowed by :data:`sandbox.probe.LOAD_TOLERANCE` at the worst moment for the verdict, and
the whole check of real linear and quadratic programs while busy-loop processes compete for
the CPUs.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from sandbox import probe
from sandbox.check import check_program

Cost = Callable[[int], float]


def scripted_runs(cost: Cost, slowed: Callable[[int], bool]) -> Callable[..., dict[str, float]]:
    """A stand-in for a measured probe run: ``cost(units)`` CPU seconds, times the load factor
    on the runs ``slowed(units)`` picks."""

    def run(n_units: int) -> dict[str, float]:
        factor = probe.LOAD_TOLERANCE if slowed(n_units) else 1.0
        sessions = n_units // 20
        return {"cpu_s": cost(n_units) * factor, "sessions": sessions,
                "embed_calls": sessions + 2, "texts": n_units + 2}  # fmt: skip

    return run


FULL = probe.PROBE_UNITS


def linear(n: int) -> float:  # 3 s at full size: well over the floor, under the budget
    return 3.0 * n / FULL


def quadratic(n: int) -> float:  # 4 s at full size
    return 4.0 * (n / FULL) ** 2


def test_linear_program_passes_when_its_full_runs_are_slowed():
    result = probe.judge(scripted_runs(linear, lambda n: n == FULL))
    assert result["cpu_growth"] <= probe.GROWTH_LIMIT
    assert result["full"]["cpu_s"] > probe.GROWTH_FLOOR_S  # the verdict was not skipped


def test_quadratic_program_is_rejected_when_its_small_runs_are_slowed():
    run = scripted_runs(quadratic, lambda n: n < FULL)
    with pytest.raises(probe.ProbeFailure, match="super-linear work"):
        probe.judge(run)


def test_a_verdict_just_under_the_limit_is_measured_again():
    """Quadratic work with a linear part (3.5 per doubling idle, as the hostile corpus's
    indexer) whose first small run is slowed measures 2.69: in doubt, so it is measured again,
    and its cheapest small run gives the verdict."""
    cost = lambda n: 3.0 * (n / FULL) ** 2 + 0.34 * n / FULL  # noqa: E731
    seen: Counter[int] = Counter()

    def first_small_slowed(n: int) -> bool:
        seen[n] += 1
        return n < FULL and seen[n] == 1

    run = scripted_runs(cost, first_small_slowed)
    with pytest.raises(probe.ProbeFailure, match="super-linear work: .* by 3.5"):
        probe.judge(run)
    assert seen[FULL // probe.GROWTH_SIZES] >= 2


def counted_runs(sessions: Callable[[int], int], texts: Cost) -> probe.Run:
    """Cheap linear CPU, one embed call per session (and per query), ``texts(units)`` texts."""

    def run(n_units: int) -> dict[str, float]:
        made = sessions(n_units)
        return {"cpu_s": 0.1 * n_units / FULL, "sessions": made, "embed_calls": made + 2,
                "texts": texts(n_units)}  # fmt: skip

    return run


def test_backend_calls_are_judged_per_session_and_texts_per_unit() -> None:
    """Sessions come in random sizes, so a quarter of the units may hold more than a quarter of
    the sessions: one call per session passes however many there are. Embedding every unit
    indexed so far again at each session (texts growing with the square of the units) fails."""
    more_at_full = counted_runs(lambda n: n // 25 if n < FULL else n // 18, lambda n: n + 2)
    assert probe.judge(more_at_full)["full"]["sessions"] == FULL // 18
    again = counted_runs(lambda n: n // 20, lambda n: (n // 20) * (n // 40) * 20)
    with pytest.raises(probe.ProbeFailure, match="super-linear embedding"):
        probe.judge(again)


# Two programs doing the same work per comparison and about the same work at full size: LINEAR
# compares each unit with 500 fixed anchors, QUADRATIC with every other unit indexed before it.
PROGRAM = """
from dataclasses import dataclass

EXTRACTION_INSTRUCTION = "Extract facts."
PLANNING_INSTRUCTION = "Plan a query."
ANSWER_INSTRUCTION = "Answer."


@dataclass
class MemoryUnit:
    content: str


@dataclass
class Query:
    text: str


class Memory:
    def __init__(self, backend):
        self.backend = backend
        self.units = []
        self.seen = []
        self.anchors = [{f"w{j}" for j in range(i, i + 12)} for i in range(500)]

    def index(self, units, segment):
        for u in units:
            words = set(u.content.split())
            hits = 0
            for other in @OTHERS@:
                hits += len(words & other) + len(words ^ other)
            self.seen.append(words)
            self.units.append(u.content)

    def retrieve(self, query):
        return "\\n".join(self.units)[:16000]
"""
LINEAR = PROGRAM.replace("@OTHERS@", "self.anchors")
QUADRATIC = PROGRAM.replace("@OTHERS@", "self.seen[::2]")


@pytest.fixture
def busy_machine() -> Iterator[None]:
    """Two busy-loop processes competing for the CPUs while the test runs."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in loops:
            proc.kill()
            proc.wait()


def test_growth_verdicts_hold_on_a_busy_machine(busy_machine: None):
    report = check_program(LINEAR, "linear.py")
    tier = report.tiers[-1]
    assert report.passed, report.repair_text()
    assert tier.details["full"]["cpu_s"] > probe.GROWTH_FLOOR_S  # the verdict was made
    report = check_program(QUADRATIC, "quadratic.py")
    assert not report.passed and report.failure is not None
    assert (report.failure.tier, report.failure.rule) == (4, "probe"), report.repair_text()
    assert "super-linear work" in report.repair_text()
