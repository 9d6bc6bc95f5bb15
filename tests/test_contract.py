"""The contract leaf and the sandbox's boundary: what imports what, what a check hands over,
and what an error frame carries."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

from contract import spec
from sandbox.check import check_program
from sandbox.fingerprint import fingerprints
from sandbox.static import check_source

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = (ROOT / "seeds" / "simple.py").read_text()

PROGRAM = textwrap.dedent(
    """\
    from dataclasses import dataclass

    EXTRACTION_INSTRUCTION = "Extract facts."
    PLANNING_INSTRUCTION = "Plan the query."
    ANSWER_INSTRUCTION = "Answer."


    @dataclass
    class MemoryUnit:
        content: str


    @dataclass
    class Query:
        query: str


    class Memory:
        def __init__(self, backend):
            self.units = []

        def index(self, units, segment):
            self.units.extend(units)

        def retrieve(self, query):
            raise ValueError("the message mentions (line 999)")
    """
)


def _loaded_modules(*modules: str) -> set[str]:
    """The project modules a fresh interpreter holds after importing ``modules``."""
    code = (
        f"import sys; import {', '.join(modules)}; "
        "print('\\n'.join(m for m in sys.modules if m.split('.')[0] in "
        "('evolve', 'sandbox', 'contract')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_the_host_loads_contract_and_sandbox_only() -> None:
    loaded = _loaded_modules("sandbox.host", "sandbox.serve", "sandbox.tiers")
    assert not {m for m in loaded if m.startswith("evolve")}
    assert "sandbox.fingerprint" not in loaded  # fingerprinting is the optimizer's business


def test_the_contract_imports_nothing_else_of_the_project() -> None:
    loaded = _loaded_modules(*(f"contract.{p.stem}" for p in (ROOT / "contract").glob("[!_]*.py")))
    assert loaded and all(m.split(".")[0] == "contract" for m in loaded)


def test_serve_does_not_import_host() -> None:
    tree = ast.parse((ROOT / "sandbox" / "serve.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "sandbox.host" not in imported


def test_tier_one_names_what_the_spec_requires() -> None:
    (finding,) = check_source("   \n")
    assert ", ".join(spec.REQUIRED_NAMES) in finding.message
    missing = {f.message.split("'")[1] for f in check_source("X = 1\n")}
    assert missing == set(spec.REQUIRED_NAMES)


def test_component_roots_cover_every_named_part_of_the_contract() -> None:
    named = {n for c in spec.COMPONENTS for n in spec.top_roots(c)}
    assert named == {*spec.INSTRUCTIONS.values(), *spec.DATACLASSES.values(), *spec.HOOKS}
    methods = {m for c in spec.COMPONENTS for m in spec.memory_roots(c)}
    assert methods == set(spec.MEMORY_METHODS)


def test_a_passing_check_hands_over_the_checked_program() -> None:
    report = check_program(SIMPLE, "simple.py")
    assert report.passed and report.program is not None
    program = report.program
    assert program.source == SIMPLE and program.path == "simple.py"
    assert program.digest == hashlib.sha256(SIMPLE.encode()).hexdigest()
    assert program.fingerprints == fingerprints(SIMPLE)
    assert "program" not in report.as_json()


def test_a_failing_check_hands_over_nothing() -> None:
    report = check_program(SIMPLE.replace("class Memory", "class Memo"), "bad.py")
    assert not report.passed and report.program is None


def test_an_error_frame_carries_the_program_line_not_a_line_in_the_text() -> None:
    report = check_program(PROGRAM, "prog.py")
    failure = report.failure
    assert failure is not None and failure.name == "smoke"
    assert failure.rule == "exception"
    lines = PROGRAM.splitlines()
    assert failure.line == 1 + next(i for i, text in enumerate(lines) if "raise" in text)
