"""contract/parsing.py: every AST the project builds from source is built one thread at a time
(CPython 3.11's AST constructor is not thread-safe: a question once failed in CI with
``SystemError: AST constructor recursion depth mismatch``)."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contract import parsing
from evolve.evolution.constants import tunables
from sandbox.fingerprint import fingerprints
from sandbox.static import check_source

SEED = (Path(__file__).resolve().parents[1] / "seeds" / "hybrid.py").read_text()


def test_parse_is_ast_parse() -> None:
    assert ast.dump(parsing.parse(SEED)) == ast.dump(ast.parse(SEED))
    assert ast.dump(parsing.parse("1 + x", mode="eval")) == ast.dump(ast.parse("1 + x", "", "eval"))
    with pytest.raises(SyntaxError):
        parsing.parse("def (")


READERS: dict[str, Callable[[str], Any]] = {
    "tunables": tunables,
    "fingerprints": fingerprints,
    "check_source": check_source,
}


@pytest.mark.parametrize("name", list(READERS))
def test_readers_of_a_source_wait_for_a_parse_in_another_thread(name: str) -> None:
    source = SEED + f"\n# {name}: a source no cache has seen\n"
    done = threading.Event()
    reader = threading.Thread(target=lambda: (READERS[name](source), done.set()))
    with parsing._LOCK:  # another thread is inside ast.parse
        reader.start()
        assert not done.wait(0.3), f"{name} parsed while another thread held the parse lock"
    reader.join(10)
    assert done.is_set()
