"""Stage reuse: component fingerprints from program source, cache keys, and the stage store.

Owns three things (design §2):

1. :func:`fingerprints` — one hash per component (extract, index, plan, retrieve, answer)
   computed from the program's AST: the component's own code plus every top-level helper,
   constant and import it uses, transitively; ``Memory`` methods reached through ``self.<name>``
   count as well. Top-level statements that define nothing (bare expressions, ``if`` blocks) and
   ``Memory`` members reached from neither ``index`` nor ``retrieve`` are folded into every /
   the index fingerprint respectively — conservative by construction. Import-time side
   effects count too: a statement is part of every component that reaches anything its
   import-time code (:func:`sandbox.statefulness.import_time_nodes`) can reach — a name it
   reads, what its callees touch, a module outside :data:`STATELESS_MODULES` it uses — save
   names bound only to literals; statements binding ``Memory`` besides its last ``class`` statement
   (``Memory.retrieve = f``) count for index and retrieve. Comments and formatting do not
   change a fingerprint; docstrings do. (Tier 1 also rejects in-place changes at import.)
2. :class:`StageKeys` — cache keys that chain each stage's fingerprint with every upstream key,
   the model signature, the evaluator version and a digest of the input data, so a key changes
   whenever anything that could change the output changes.
3. :class:`StageStore` — an on-disk store of stage outputs written atomically (tmp + rename).
   Memory state is pickled with program classes replaced by portable references and the
   backend by a placeholder; loading it rebinds them to the *current* program's classes and
   backend and allows only a fixed set of safe globals. Every load returns a fresh object, so a
   parent's and a child's memory never share mutable state. Failures are never stored. Every
   read checks the shape of what it reads (:data:`SHAPES`: extract a list of unit records, plan
   a query record, retrieve the retrieval record, answer a string; index state a complete
   pickle stream): an entry that fails is a miss, reported to ``on_invalid``, recomputed by the
   caller and overwritten.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import pickle
import pickletools
import tempfile
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from sandbox.statefulness import def_annotations, import_time_nodes, root_of

COMPONENTS = ("extract", "index", "plan", "retrieve", "answer")

# Roots of each component: top-level names, and (for Memory) method names.
TOP_ROOTS = {
    "extract": ("EXTRACTION_INSTRUCTION", "MemoryUnit", "postprocess_units"),
    "plan": ("PLANNING_INSTRUCTION", "Query", "postprocess_query"),
    "answer": ("ANSWER_INSTRUCTION",),
}
MEMORY_ROOTS = {"index": ("__init__", "index"), "retrieve": ("retrieve",)}


def _digest(*parts: Any) -> str:
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
    """Component name -> fingerprint (hex). Raises SyntaxError on unparsable source."""
    graph, members, loose = _program_graph(ast.parse(source))
    roots = {c: [("top", n) for n in TOP_ROOTS.get(c, ())] for c in COMPONENTS}
    for component, methods in MEMORY_ROOTS.items():
        roots[component] += [_HEADER, *(("member", m) for m in methods)]
    closures = {c: graph.reach(roots[c]) for c in COMPONENTS}
    reached = {n for c in MEMORY_ROOTS for n in closures[c] if n[0] == "member"}
    unreached = {("member", m) for m in members} - reached
    closures["index"] |= graph.reach(unreached)  # conservatively part of indexing

    def dump(nodes: Iterable[ast.AST]) -> list[str]:
        return [ast.dump(n, include_attributes=False) for n in nodes]

    loose_dump = dump(loose)
    out = {}
    for component, closure in closures.items():
        parts = [[*node, dump(graph.code[node])] for node in sorted(closure) if node in graph.code]
        out[component] = _digest(component, parts, loose_dump)
    return out


def changed_components(parent_source: str, child_source: str) -> list[str]:
    """Components whose fingerprint differs between two program versions."""
    a, b = fingerprints(parent_source), fingerprints(child_source)
    return [c for c in COMPONENTS if a[c] != b[c]]


@dataclass(frozen=True)
class StageKeys:
    """Cache keys for one program under one model configuration."""

    fp: dict[str, str]
    model_sig: str  # "offline" or the task model id and parameters
    embed_sig: str  # the embedder's name: index state contains its vectors
    evaluator: str  # evolve.session.evaluator_version(): what the evaluator adds to outputs

    def _key(self, stage: str, *parts: Any) -> str:
        return _digest(stage, self.fp[stage], self.evaluator, *parts)

    def extract(self, segment_digest: str) -> str:
        return self._key("extract", self.model_sig, segment_digest)

    def index(self, extract_keys: list[str]) -> str:
        return self._key("index", self.embed_sig, extract_keys)

    def plan(self, question: str, question_date: str | None) -> str:
        return self._key("plan", self.model_sig, question, question_date)

    def retrieve(self, index_key: str, plan_key: str) -> str:
        return self._key("retrieve", index_key, plan_key)

    def answer(self, retrieve_key: str, question: str) -> str:
        return self._key("answer", self.model_sig, retrieve_key, question)


# --- the store ---------------------------------------------------------------------------

_SAFE_BUILTINS = {
    "set", "frozenset", "dict", "list", "tuple", "complex", "bytearray", "bytes", "slice",
    "range", "object", "int", "float", "str", "bool",
}  # fmt: skip
_SAFE_STDLIB = ("collections", "datetime", "copyreg", "_codecs")  # any name in these
# Libraries whose modules also hold code runners (numpy.testing's ``runstring`` execs a string):
# from these only classes, ufuncs and the reconstructors their pickles use are allowed.
_SAFE_LIBRARIES = ("numpy", "scipy.sparse", "bm25s")
_SAFE_RECONSTRUCTORS = {
    "_reconstruct", "scalar", "_frombuffer", "_mareconstruct",
    "__generator_ctor", "__bit_generator_ctor", "__randomstate_ctor",
}  # fmt: skip


def _in_packages(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


_MEMMAP = np.memmap  # bound at import: the sandbox host later disarms numpy's file functions


def _safe_library_global(obj: Any, name: str) -> bool:
    if isinstance(obj, type):
        return not issubclass(obj, _MEMMAP)  # memmap would open (or create) a file
    if isinstance(obj, np.ufunc):
        return True
    return callable(obj) and (name in _SAFE_RECONSTRUCTORS or name.startswith("__pyx_unpickle_"))


class _StatePickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, program_module: str, backend: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._program_module = program_module
        self._backend = backend

    def persistent_id(self, obj: Any) -> Any:
        if obj is self._backend:
            return ("backend",)
        if isinstance(obj, type | types.FunctionType) and obj.__module__ == self._program_module:
            if "<" in obj.__qualname__:  # a lambda or local: no name to rebind it by
                raise pickle.PicklingError(f"cannot store {obj.__qualname__}")
            return ("program", obj.__qualname__)
        return None


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, program_namespace: dict[str, Any], backend: Any) -> None:
        super().__init__(file)
        self._namespace = program_namespace
        self._backend = backend

    def persistent_load(self, pid: Any) -> Any:
        if pid == ("backend",):
            return self._backend
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "program":
            obj: Any = self._namespace
            for part in str(pid[1]).split("."):
                obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
            return obj
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if _in_packages(module, _SAFE_STDLIB):
            return super().find_class(module, name)
        if _in_packages(module, _SAFE_LIBRARIES) and "__main__" not in module.split("."):
            obj = super().find_class(module, name)
            if _safe_library_global(obj, name):
                return obj
        raise pickle.UnpicklingError(
            f"memory state refers to {module}.{name}, which is not allowed"
        )


def dump_state(obj: Any, program_module: str, backend: Any) -> bytes:
    """Serialise an object's attributes; raises (PicklingError, TypeError, ...) if it can't."""
    buf = io.BytesIO()
    _StatePickler(buf, program_module, backend).dump(vars(obj))
    return buf.getvalue()


def load_state(cls: Any, data: bytes, program_namespace: dict[str, Any], backend: Any) -> Any:
    """A fresh ``cls`` instance carrying the saved attributes (``__init__`` is not called)."""
    state = _StateUnpickler(io.BytesIO(data), program_namespace, backend).load()
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


class _Retrieved(BaseModel):
    """A stored retrieval (what :mod:`evolve.session` records for one question)."""

    model_config = ConfigDict(strict=True)
    retrieved: str
    over_budget: bool
    raw_chars: int
    retrieve_ms: float | None = None


_STRICT = ConfigDict(strict=True)
SHAPES: dict[str, TypeAdapter[Any]] = {  # what a JSON entry of each stage must be
    "extract": TypeAdapter(list[dict[str, Any]], config=_STRICT),
    "plan": TypeAdapter(dict[str, Any], config=_STRICT),
    "retrieve": TypeAdapter(_Retrieved),
    "answer": TypeAdapter(str, config=_STRICT),
}


def _complete_pickle(data: bytes) -> bool:
    """Whether ``data`` is one whole pickle stream (opcodes are read, nothing is built)."""
    try:
        return any(op.name == "STOP" for op, _, _ in pickletools.genops(data))
    except Exception:  # pickletools raises ValueError, and others on garbage
        return False


class StageStore:
    """Stage outputs on disk: JSON for records and texts, bytes for memory state.

    With ``reuse=False`` the store still writes every output (so trusted-side readers such as
    compact cases find them) but reads back only what this instance wrote: nothing computed by
    another evaluation is reused (``evolve run --no-reuse``, the baseline reuse is measured by).
    A read that finds an entry of the wrong shape (:data:`SHAPES`) returns None and calls
    ``on_invalid(stage)``.
    """

    def __init__(
        self,
        root: Path,
        *,
        reuse: bool = True,
        on_invalid: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self._own: set[Path] | None = None if reuse else set()
        self._on_invalid = on_invalid or (lambda _stage: None)

    def _path(self, stage: str, key: str, suffix: str) -> Path:
        return self.root / stage / key[:2] / f"{key}{suffix}"

    def _readable(self, path: Path) -> bool:
        return self._own is None or path in self._own

    def has(self, stage: str, key: str) -> bool:
        return any(
            self._readable(path) and path.exists()
            for path in (self._path(stage, key, suffix) for suffix in (".json", ".bin"))
        )

    def get_json(self, stage: str, key: str) -> Any | None:
        path = self._path(stage, key, ".json")
        if not self._readable(path):
            return None
        try:
            value = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:  # not JSON, or not UTF-8
            self._on_invalid(stage)
            return None
        try:
            if stage in SHAPES:
                SHAPES[stage].validate_python(value)
        except ValidationError:
            self._on_invalid(stage)
            return None
        return value

    def put_json(self, stage: str, key: str, value: Any) -> None:
        self._write(self._path(stage, key, ".json"), json.dumps(value).encode())

    def get_bytes(self, stage: str, key: str) -> bytes | None:
        path = self._path(stage, key, ".bin")
        if not self._readable(path):
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if not _complete_pickle(data):
            self._on_invalid(stage)
            return None
        return data

    def put_bytes(self, stage: str, key: str, value: bytes) -> None:
        self._write(self._path(stage, key, ".bin"), value)

    def _write(self, path: Path, data: bytes) -> None:
        if self._own is not None:
            self._own.add(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
