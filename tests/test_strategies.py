"""A run's strategies are objects chosen once from its config's names (evolution/wiring.py).

The config and the command line keep the names (``--selection``, ``--cases``,
``--offline-search``); each registry holds exactly those names (each object under its own), and
no module but the wiring reads the names off a config or asks a proposer's type: the loop asks
the objects.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any, get_args

import pytest
from conftest import run_config

from evolve.cli.main import build_parser
from evolve.config import RunConfig
from evolve.evolution.cases import SeededDraw, WorstFirst
from evolve.evolution.coder import CoderProposer
from evolve.evolution.constants import ConstantProposer
from evolve.evolution.selection import DependencyAware, RoundRobin
from evolve.evolution.tpe import TPEProposer
from evolve.evolution.wiring import CASE_ORDERS, SEARCHES, SELECTIONS, assemble
from evolve.models.llm import ModelConfig, Models
from evolve.models.testing import ScriptedLLM

EVOLVE = Path(__file__).resolve().parents[1] / "evolve"
WIRING = EVOLVE / "evolution" / "wiring.py"
# config field -> (registry, command-line flag)
CHOSEN = {"selection": (SELECTIONS, "--selection"), "cases": (CASE_ORDERS, "--cases"),
          "offline_search": (SEARCHES, "--offline-search")}  # fmt: skip


def _choices(flag: str) -> tuple[str, ...]:
    run = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in run.choices["run"]._actions if flag in a.option_strings)
    return tuple(action.choices or ())


@pytest.mark.parametrize("field", sorted(CHOSEN))
def test_each_registry_holds_the_configs_choices_and_the_flags(field: str) -> None:
    registry, flag = CHOSEN[field]
    choices = get_args(RunConfig.model_fields[field].annotation)
    assert sorted(registry) == sorted(choices) == sorted(_choices(flag))
    assert RunConfig.model_fields[field].default in registry


def test_the_config_names_the_run_s_strategies(tmp_path: Path) -> None:
    base = run_config(tmp_path, tmp_path / "cache")
    parts = assemble(base, tmp_path)
    assert type(parts.proposer) is TPEProposer and not parts.proposer.builds_cases
    assert type(parts.selection) is DependencyAware and type(parts.case_order) is WorstFirst
    ablated = base.replace(selection="round-robin", cases="random", offline_search="random")
    parts = assemble(ablated, tmp_path)
    assert type(parts.proposer) is ConstantProposer and not parts.proposer.builds_cases
    assert type(parts.selection) is RoundRobin and type(parts.case_order) is SeededDraw
    coder = ScriptedLLM(lambda *_: "", Models(coder=ModelConfig(model="scripted")))
    parts = assemble(base, tmp_path, coder=coder)
    assert isinstance(parts.proposer, CoderProposer) and parts.proposer.builds_cases
    assert parts.annotator is None  # an injected coder without an injected annotator


def _strategy_reads(source: str) -> list[str]:
    """Reads of a strategy's name off a config (``config.selection``, ``self.config.cases``)
    and ``isinstance`` asked of a proposer class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in CHOSEN:
            receiver: Any = node.value
            name = receiver.id if isinstance(receiver, ast.Name) else getattr(receiver, "attr", "")
            if name == "config":
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            classes = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            if "Proposer" in classes:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_check_sees_a_name_read_and_a_type_asked() -> None:
    source = "a = self.config.selection\nb = config.cases\nc = isinstance(p, ConstantProposer)\n"
    assert len(_strategy_reads(source)) == 3
    assert _strategy_reads("a = request.cases\nb = isinstance(x, str)\n") == []


def test_only_the_wiring_turns_a_strategy_name_into_an_object() -> None:
    reads = [
        f"{path.relative_to(EVOLVE.parent)}:{where}"
        for path in sorted(EVOLVE.rglob("*.py"))
        if path != WIRING
        for where in _strategy_reads(path.read_text(encoding="utf-8"))
    ]
    assert not reads, "\n".join(reads)
