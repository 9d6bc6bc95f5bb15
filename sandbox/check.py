"""The sandbox report: four tiers, in order, each stopping the check when it fails.

1. **source** — static analysis (:mod:`sandbox.static`), then the module loads inside a confined
   host and defines the required names;
2. **schema** — dataclass field types and signatures (in the host);
3. **smoke** — open, index, index empty, retrieve (twice, and another query between), the
   memory's state compared around the retrieves (:func:`sandbox.tiers.smoke_tier`);
4. **probe** — the complexity probe: runs of a synthetic conversation at two sizes, the
   verdict made here from the kernel's CPU accounting of the host and the embeddings served
   to it (:mod:`sandbox.probe`).

Tiers 3 and 4 send the host evaluation's own requests, and its backend requests are answered
by :class:`sandbox.probe.ProbeBackend` with the shape of the evaluation the program is checked
for (:class:`sandbox.probe.BackendShape`: the embedder's dimension, the task-LLM call budget;
``check_program``'s ``backend``, by default evaluation's defaults). The backend's rows and the
synthetic conversation are drawn afresh for each check from one seed the program never sees.

Invariants: candidate code never runs in this process; a crash, hang or protocol breach of the
host fails the tier it happened in with rule ``crash`` or ``timeout``; a contract rule a
request enforces in the host (rule ``contract``) fails tiers 3 and 4 with the tier's name as
rule, as does a rule of the tier itself (:class:`sandbox.tiers.TierError`). Each failure
carries the tier, a rule id, the program line when known (from the host's error frame, never
parsed out of its text), and one line of text written for a model to repair the program
(:meth:`CheckReport.repair_text`). A report that passed carries the :class:`CheckedProgram`
(source, digest, component fingerprints, imports), the only value evaluation and the runtime
take: nothing needs to remember which sources passed, read the file or parse the source again.
The source is parsed once per check (:func:`sandbox.static.read_source`): tier 1, the imports
the host loads and the fingerprints all read that tree. A caller that refuses a program that
did not pass does so through :meth:`CheckReport.require`, in its own words.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from contract.program import source_digest
from sandbox.fingerprint import tree_fingerprints
from sandbox.isolate import Host, HostFailure, HostTimeout, Limits, ProgramFailure
from sandbox.probe import PROBE_UNITS, BackendShape, ProbeBackend, ProbeFailure, fresh_seed, judge
from sandbox.static import imported_modules, read_source
from sandbox.tiers import SyntheticConversation, TierError, probe_run, smoke_tier

TIERS = ("source", "schema", "smoke", "probe")
CHECK_LIMITS = Limits(cpu_seconds=120, memory_mb=4096, call_seconds=60.0)
EVALUATION = BackendShape()  # evaluation's defaults: MiniLM's 384 dimensions, 8 task-LLM calls
TIER_SECONDS = {"source": 30.0, "schema": 15.0, "smoke": 30.0, "probe": 90.0}


@dataclass
class TierResult:
    tier: int
    name: str
    passed: bool
    seconds: float
    rule: str | None = None
    line: int | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckedProgram:
    """A program that passed every tier: its source as checked, the path it was checked under,
    its sha256, its component fingerprints (:mod:`sandbox.fingerprint`) and the top-level
    modules it imports (what its host loads before confinement), all read from the one parse
    of the check. Picklable: evaluation hands it to its workers whole, and they parse nothing."""

    source: str
    path: str
    digest: str
    fingerprints: dict[str, str]
    imports: frozenset[str]


@dataclass
class CheckReport:
    passed: bool
    tiers: list[TierResult]
    isolation: dict[str, Any] = field(default_factory=dict)
    program: CheckedProgram | None = field(default=None, repr=False)  # set when passed

    @property
    def failure(self) -> TierResult | None:
        return next((t for t in self.tiers if not t.passed), None)

    def require(self, refuse: Callable[[str], Exception]) -> CheckedProgram:
        """The checked program; raises ``refuse(repair text)`` when the check failed (each
        caller words its own error)."""
        if self.program is None:
            raise refuse(self.repair_text())
        return self.program

    def repair_text(self) -> str:
        """One line for the coding model: failing tier, rule, line, what is wrong."""
        t = self.failure
        if t is None:
            return "all sandbox tiers passed"
        where = f" at line {t.line}" if t.line else ""
        return f"sandbox tier {t.tier} ({t.name}) failed, rule {t.rule}{where}: {t.error}"

    def as_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "tiers": [asdict(t) for t in self.tiers],
            "isolation": self.isolation,
        }


def check_program(
    source: str,
    path: str = "<candidate>",
    parent_source: str | None = None,
    limits: Limits = CHECK_LIMITS,
    backend: BackendShape = EVALUATION,
) -> CheckReport:
    """Run the four tiers on ``source`` and report; never raises for a bad program.
    ``backend``: the backend the program will be evaluated with (embedding dimension, task-LLM
    call budget), which tiers 3 and 4 give it too."""
    tiers: list[TierResult] = []
    start = time.perf_counter()
    tree, findings = read_source(source, parent_source)
    if tree is None or findings:
        first = findings[0]
        tiers.append(
            TierResult(
                1,
                "source",
                False,
                time.perf_counter() - start,
                first.rule,
                first.line,
                first.message,
                {"findings": [asdict(f) for f in findings]},
            )
        )
        return CheckReport(False, tiers)
    seed = fresh_seed()
    served = ProbeBackend(backend.dim, seed)
    imports = imported_modules(tree)
    try:
        host = Host(limits, serve=served.serve, imports=imports)
    except HostFailure as exc:
        tiers.append(
            TierResult(
                1,
                "source",
                False,
                time.perf_counter() - start,
                "crash",
                None,
                f"the sandbox host did not start: {exc}",
            )
        )
        return CheckReport(False, tiers)
    with host:

        def smoke() -> tuple[Any, list[bytes]]:
            return smoke_tier(host, backend, TIER_SECONDS["smoke"], seed), []

        steps: list[tuple[str, str | Callable[[], tuple[Any, list[bytes]]], dict[str, Any]]] = [
            ("source", "load", {"source": source, "path": path}),
            ("schema", "schema", {}),
            ("smoke", smoke, {}),
        ]
        for number, (name, op, payload) in enumerate(steps, 1):
            if number > 1:
                start = time.perf_counter()
            result = _run_tier(host, number, name, op, payload, start)
            tiers.append(result)
            if not result.passed:
                break
        else:
            tiers.append(_probe_tier(host, served, backend, seed))
        isolation = host.isolation
    if not (all(t.passed for t in tiers) and len(tiers) == len(TIERS)):
        return CheckReport(False, tiers, isolation)
    fingerprints = tree_fingerprints(tree)
    program = CheckedProgram(source, path, source_digest(source), fingerprints, imports)
    return CheckReport(True, tiers, isolation, program)


def _probe_tier(
    host: Host,
    backend: ProbeBackend,
    shape: BackendShape = EVALUATION,
    seed: int | None = None,
) -> TierResult:
    """Tier 4: every run of the probe is evaluation's requests on a fresh memory, its CPU time
    read from outside the host, its embeddings counted by ``backend``."""
    start = time.perf_counter()
    deadline = time.monotonic() + TIER_SECONDS["probe"]
    conversation = SyntheticConversation.draw(PROBE_UNITS, fresh_seed() if seed is None else seed)

    def run(units: int) -> dict[str, float]:
        backend.take()
        return {**probe_run(host, shape, conversation, units, deadline), **backend.take()}

    return _run_tier(host, 4, "probe", lambda: (judge(run, len(conversation)), []), {}, start)


def _run_tier(
    host: Host,
    number: int,
    name: str,
    op: str | Callable[[], tuple[Any, list[bytes]]],
    payload: dict[str, Any],
    start: float,
) -> TierResult:
    try:
        if callable(op):
            details, _ = op()
        else:
            details, _ = host.call(op, payload, timeout=TIER_SECONDS[name])
    except ProbeFailure as exc:
        took = time.perf_counter() - start
        return TierResult(number, name, False, took, "probe", None, str(exc))
    except TierError as exc:
        took = time.perf_counter() - start
        return TierResult(number, name, False, took, name, None, str(exc))
    except ProgramFailure as exc:
        took = time.perf_counter() - start
        rule = name if exc.rule == "contract" and number > 2 else exc.rule
        return TierResult(number, name, False, took, rule, exc.line, str(exc))
    except HostFailure as exc:
        rule = "timeout" if isinstance(exc, HostTimeout) else "crash"
        return TierResult(number, name, False, time.perf_counter() - start, rule, None, str(exc))
    return TierResult(
        number,
        name,
        True,
        time.perf_counter() - start,
        details=details if isinstance(details, dict) else {},
    )
