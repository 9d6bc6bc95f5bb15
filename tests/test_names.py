"""One meaning per name (docs/design.md §9): a class name is defined once in the project's
packages, and the names retired because they had a second meaning do not come back."""

from __future__ import annotations

import ast
import io
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evolve", "sandbox", "contract")
# Names several modules define on purpose, each the same thing for its own case.
SAME_THING = {"Scorer": "each benchmark's answer scorer, one per module of evolve/scoring"}
# Identifiers that named a second thing, and what that thing is called now.
RETIRED = {
    "ConversationSession": "one conversation's evaluation is a ConversationRun",
    "StoreError": "the runtime's store is the MemoryStore (MemoryStoreError)",
    "Store": "a store is named by its kind: RunStore, StepStore, MemoryStore",
}


def _files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_each_class_name_is_defined_once() -> None:
    defined: dict[str, list[str]] = defaultdict(list)
    for path in _files(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                defined[node.name].append(str(path.relative_to(ROOT)))
    twice = {name: where for name, where in defined.items()
             if len(where) > 1 and name not in SAME_THING}  # fmt: skip
    assert not twice, twice
    assert len(defined["ModelConfig"]) == 1


def test_retired_names_do_not_come_back() -> None:
    found = []
    for path in _files(*PACKAGES, "tests", "bench"):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
        previous = ""
        for tok in tokens:
            # ``ast.Store`` (the syntax tree's context) is Python's name, not ours
            if tok.type == tokenize.NAME and tok.string in RETIRED and previous != ".":
                where = f"{path.relative_to(ROOT)}:{tok.start[0]}"
                found.append(f"{where} {tok.string}: {RETIRED[tok.string]}")
            if tok.type not in (tokenize.NL, tokenize.COMMENT):
                previous = tok.string
    assert not found, "\n".join(found)
