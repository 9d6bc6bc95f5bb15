"""The import graph stays light where the runtime stands and has no circle anywhere.

- ``import evolve.runtime.api`` (and the public face, ``evolve.open_memory``) loads at most
  :data:`RUNTIME_MODULES` project modules, counted in a fresh interpreter: the memory an agent
  uses loads what it runs (evaluation's pipeline, the models, the sandbox check), not the
  optimizer (a run store, archive, scoring) nor the evaluation engine.
- The whole import graph of ``evolve``, ``sandbox`` and ``contract`` (grimp, function-level and
  ``TYPE_CHECKING`` imports included, a package's ``__init__`` a module of its own) has no
  cycle: no strongly connected component of more than one module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evolve", "sandbox", "contract")
RUNTIME_MODULES = 50  # the most project modules importing the runtime may load

COUNT = (
    "import sys, json\n{statement}\n"
    f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {PACKAGES!r})))"
)


def loaded_by(statement: str) -> list[str]:
    """The project modules a fresh interpreter has loaded after ``statement``."""
    done = subprocess.run([sys.executable, "-c", COUNT.format(statement=statement)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    modules: list[str] = json.loads(done.stdout)
    return modules


@pytest.mark.parametrize(
    "statement", ["import evolve.runtime.api", "import evolve; evolve.open_memory"]
)
def test_the_runtime_loads_few_project_modules(statement: str) -> None:
    modules = loaded_by(statement)
    print(f"{statement}: {len(modules)} project modules")
    assert "evolve.runtime.api" in modules
    assert not [m for m in modules if m.startswith("evolve.evolution")], modules
    assert len(modules) <= RUNTIME_MODULES, f"{len(modules)} modules: {modules}"


def strongly_connected(graph: grimp.ImportGraph) -> Iterator[list[str]]:
    """Tarjan's strongly connected components of ``graph``'s modules (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                yield sorted(component)


def a_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """One import cycle through the component's first module, as ``a -> b -> ... -> a``."""
    first = component[0]
    members = set(component)
    after = next(m for m in sorted(graph.find_modules_directly_imported_by(first)) if m in members)
    back = graph.find_shortest_chain(after, first) or ()
    return [first, *back]


def test_the_import_graph_has_no_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # writes nothing into the checkout
    assert "evolve.runtime.api" in graph.modules and "evolve" in graph.modules
    cycles = [" -> ".join(a_cycle(graph, c)) for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p", imported="p.a")
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p")
    graph.add_import(importer="p.b", imported="p.c")
    components = [c for c in strongly_connected(graph) if len(c) > 1]
    assert components == [["p", "p.a", "p.b"]]
    assert a_cycle(graph, components[0]) == ["p", "p.a", "p.b", "p"]
