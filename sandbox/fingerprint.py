"""Component fingerprints: one hash per pipeline component, computed from program source.

:func:`fingerprints` hashes each component (extract, index, plan, retrieve, answer; the roots
of each are named by :mod:`contract.spec`) from the program's AST: the component's own code
plus every top-level helper, constant and import it uses, transitively; ``Memory`` methods
reached through ``self.<name>`` count as well. Top-level statements that define nothing (bare
expressions, ``if`` blocks) and ``Memory`` members reached from neither ``index`` nor
``retrieve`` are folded into every / the index fingerprint respectively — conservative by
construction. Import-time side effects count too: a statement is part of every component that
reaches anything its import-time code (:func:`sandbox.statefulness.import_time_nodes`) can
reach — a name it reads, what its callees touch, a module outside :data:`STATELESS_MODULES` it
uses — save names bound only to literals; statements binding ``Memory`` besides its last
``class`` statement (``Memory.retrieve = f``) count for index and retrieve. Comments and
formatting do not change a fingerprint; docstrings do. (Tier 1 also rejects in-place changes at
import.)

They are sound only for programs that pass tier 1 (:mod:`sandbox.static` rejects the
in-place changes at import the graph could not attribute), which is why the sandbox check
hands them out with the checked program (:class:`sandbox.check.CheckedProgram`). The step
cache keys of :mod:`evolve.evaluation.stepcache` chain them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from contract.parsing import parse
from contract.spec import COMPONENTS, MEMORY_METHODS, memory_roots, top_roots
from sandbox.statefulness import def_annotations, import_time_nodes, root_of

MEMORY_COMPONENTS = tuple(dict.fromkeys(owner for owner, _ in MEMORY_METHODS.values()))


def digest(*parts: Any) -> str:
    """sha256 over the JSON of each part (shared with the step keys)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()


# Allowed modules whose functions keep no state that a call could change for later callers.
# A call into any other module (random's generator, numpy's print options, decimal's context,
# abc registries) may change what every user of that module sees.
STATELESS_MODULES = frozenset(
    "__future__ math cmath re dataclasses typing itertools functools heapq bisect statistics "
    "datetime json string textwrap difflib enum copy operator unicodedata fractions array "
    "hashlib Stemmer".split()
)
Node = tuple[str, str]  # ("top", name) | ("member", name) | ("header", "") | ("module", name)
_HEADER: Node = ("header", "")


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _self_attrs(node: ast.AST) -> set[str]:
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        names = [stmt.name]
    elif isinstance(stmt, ast.Import | ast.ImportFrom):
        if any(a.name == "*" for a in stmt.names):
            return []  # binds names we cannot see: treated as loose code (every component)
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    else:
        return []
    walrus = [n.target.id for n in import_time_nodes(stmt) if isinstance(n, ast.NamedExpr)]
    return list(dict.fromkeys(names + walrus))  # ``X = (Y := 5)`` binds Y at module level too


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


class _Graph:
    """What each node contributes to a fingerprint (``code``) and which nodes it depends on.

    Forward edges run from code to every name and ``self.<member>`` it mentions. Reverse edges
    run from everything a statement's import-time code can reach to the statement: running it
    may change those objects (``ZZ = CFG.update(k=9)`` changes ``CFG``), so whoever depends on
    them depends on it."""

    def __init__(self) -> None:
        self.code: dict[Node, list[ast.AST]] = {}
        self.edges: dict[Node, set[Node]] = {}

    def add(self, node: Node, code: ast.AST) -> None:
        self.code.setdefault(node, []).append(code)
        refs = {("top", n) for n in _names_used(code)} | {("member", a) for a in _self_attrs(code)}
        self.link(node, refs)

    def link(self, node: Node, targets: Iterable[Node]) -> None:
        self.edges.setdefault(node, set()).update(targets)

    def reach(self, start: Iterable[Node]) -> set[Node]:
        seen: set[Node] = set()
        todo = list(start)
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo += self.edges.get(node, ())
        return seen


def _program_graph(tree: ast.Module) -> tuple[_Graph, set[str], list[ast.stmt]]:
    """The dependency graph of a program, its ``Memory`` member names and its loose code."""
    graph, loose, imported = _Graph(), [], set()
    annotations = not any(  # ``from __future__ import annotations``: annotations never run
        isinstance(s, ast.ImportFrom) and s.module == "__future__"
        and any(a.name == "annotations" for a in s.names) for s in tree.body
    )  # fmt: skip
    memory = [s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "Memory"]
    memory_def = memory[-1] if memory else None  # the last definition is the class in use
    units: list[tuple[list[Node], ast.AST]] = []  # (nodes, import-time code) pairs
    for stmt in tree.body:
        names = _bound_names(stmt)
        if stmt is memory_def:
            continue
        if not names:
            if not _is_docstring(stmt):
                loose.append(stmt)  # a module docstring changes nothing; other loose code may
            continue
        nodes = [_HEADER if n == "Memory" else ("top", n) for n in names]  # Memory.x = ...
        for node in nodes:
            graph.add(node, stmt)
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            imported.update(names)
            module = stmt.module if isinstance(stmt, ast.ImportFrom) else stmt.names[0].name
            if str(module).split(".")[0] not in STATELESS_MODULES:
                for node in nodes:
                    graph.link(node, [("module", str(module).split(".")[0])])
        else:
            units.append((nodes, stmt))
    members: set[str] = set()
    if memory_def is not None:
        for part in [*memory_def.bases, *memory_def.keywords, *memory_def.decorator_list]:
            graph.add(_HEADER, part)
            units.append(([_HEADER], part))
        for stmt in memory_def.body:
            names = _bound_names(stmt)
            if not names and _is_docstring(stmt):
                continue
            nodes = [("member", n) for n in names] or [_HEADER]  # class-body code: header
            members.update(names)
            for node in nodes:
                graph.add(node, stmt)
            units.append((nodes, stmt))
    graph.link(("top", "Memory"), [_HEADER, *(("member", m) for m in members)])
    _add_effects(graph, units, _mutable_names(tree) - imported, annotations)
    return graph, members, loose


def _mutable_names(tree: ast.Module) -> set[str]:
    """Module-level names whose object a statement could change: every name the module binds
    (not builtins, comprehension or function locals) but those bound only to literals."""
    stores: dict[str, list[bool]] = {}  # name -> for each statement binding it: to a literal?
    for stmt in tree.body:
        names = set(_bound_names(stmt))
        if not isinstance(stmt, ast.ClassDef):  # class-body names are class attributes
            run = list(import_time_nodes(stmt))
            local = {id(n) for c in run if isinstance(c, ast.comprehension)
                     for n in ast.walk(c.target)}  # fmt: skip
            names |= {n.id for n in run if isinstance(n, ast.Name)
                      and not isinstance(n.ctx, ast.Load) and id(n) not in local}  # fmt: skip
        literal = isinstance(stmt, ast.Assign | ast.AnnAssign) and isinstance(
            stmt.value, ast.Constant
        )
        for name in names:
            stores.setdefault(name, []).append(literal)
    rebound = {n for g in ast.walk(tree) if isinstance(g, ast.Global) for n in g.names}
    return rebound | {name for name, literal in stores.items() if not all(literal)}


def _add_effects(
    graph: _Graph, units: list[tuple[list[Node], ast.AST]], bound: set[str], annotations: bool
) -> None:
    """Reverse edges: from every module-level object a unit's import-time code can reach (its
    own names, what its callees touch, a stateful module it calls into) to the unit. ``bound``:
    the names the module binds itself (not builtins, locals or imports)."""
    effects = []
    for nodes, code in units:
        run = list(import_time_nodes(code, annotations=False))
        if annotations:  # evaluated at definition; only calls or own generics there run code
            hints = [a for f in run if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                     for a in def_annotations(f)]  # fmt: skip
            run += [n for a in hints if not _inert(a, bound) for n in ast.walk(a)]
        names = {n.id for n in run if isinstance(n, ast.Name)}
        reached = graph.reach(("top", n) for n in names)
        targets = {
            r for r in reached
            if r[0] != "top" or r[1] in bound
        } - set(nodes)  # fmt: skip
        effects.append((targets, nodes))
    for targets, nodes in effects:  # after every reach, so they see forward edges only
        for target in targets:
            graph.link(target, nodes)


def _inert(annotation: ast.expr, bound: set[str]) -> bool:
    """An annotation whose evaluation runs no program code: no call, and no subscript of a
    program-bound object (whose ``__class_getitem__`` would run)."""
    return not any(
        isinstance(n, ast.Call)
        or (isinstance(n, ast.Subscript) and getattr(root_of(n), "id", None) in bound)
        for n in ast.walk(annotation)
    )


def fingerprints(source: str) -> dict[str, str]:
    """Component name -> fingerprint (hex). Raises SyntaxError on unparsable source. A pure
    function of the text, so the last sources' fingerprints are kept (a parent is compared with
    each of its children)."""
    return dict(_fingerprints(source))


@functools.lru_cache(maxsize=64)
def _fingerprints(source: str) -> tuple[tuple[str, str], ...]:
    return tuple(tree_fingerprints(parse(source)).items())


def tree_fingerprints(tree: ast.Module) -> dict[str, str]:
    """:func:`fingerprints` of a program already parsed (``tree``, as :mod:`ast` parsed it;
    read, never changed)."""
    graph, members, loose = _program_graph(tree)
    roots: dict[str, list[Node]] = {c: [("top", n) for n in top_roots(c)] for c in COMPONENTS}
    for component in MEMORY_COMPONENTS:
        roots[component] += [_HEADER, *(("member", m) for m in memory_roots(component))]
    closures = {c: graph.reach(roots[c]) for c in COMPONENTS}
    reached = {n for c in MEMORY_COMPONENTS for n in closures[c] if n[0] == "member"}
    unreached = {("member", m) for m in members} - reached
    closures["index"] |= graph.reach(unreached)  # conservatively part of indexing

    def dump(nodes: Iterable[ast.AST]) -> list[str]:
        return [ast.dump(n, include_attributes=False) for n in nodes]

    loose_dump = dump(loose)
    out = {}
    for component, closure in closures.items():
        parts = [[*node, dump(graph.code[node])] for node in sorted(closure) if node in graph.code]
        out[component] = digest(component, parts, loose_dump)
    return out


def changed_components(parent_source: str, child_source: str) -> list[str]:
    """Components whose fingerprint differs between two program versions."""
    a, b = fingerprints(parent_source), fingerprints(child_source)
    return [c for c in COMPONENTS if a[c] != b[c]]
