"""Stage reuse: component fingerprints from program source, cache keys, and the stage store.

Owns three things (design §2):

1. :func:`fingerprints` — one hash per component (extract, index, plan, retrieve, answer)
   computed from the program's AST: the component's own code plus every top-level helper,
   constant and import it uses, transitively; ``Memory`` methods reached through ``self.<name>``
   count as well. Top-level statements that define nothing (bare expressions, ``if`` blocks) and
   ``Memory`` members reached from neither ``index`` nor ``retrieve`` are folded into every /
   the index fingerprint respectively — conservative by construction. Comments and formatting
   do not change a fingerprint; docstrings do.
2. :class:`StageKeys` — cache keys that chain each stage's fingerprint with every upstream key,
   the model signature and a digest of the input data, so a key changes whenever anything that
   could change the output changes.
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
        return [stmt.name]
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        if any(a.name == "*" for a in stmt.names):
            return []  # binds names we cannot see: treated as loose code (every component)
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def fingerprints(source: str) -> dict[str, str]:
    """Component name -> fingerprint (hex). Raises SyntaxError on unparsable source."""
    tree = ast.parse(source)
    top: dict[str, list[ast.stmt]] = {}
    loose: list[ast.stmt] = []
    for stmt in tree.body:
        names = _bound_names(stmt)
        if not names:
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                loose.append(stmt)  # a module docstring changes nothing; other loose code may
            continue
        for name in names:
            top.setdefault(name, []).append(stmt)

    memory_def = next((s for s in top.get("Memory", []) if isinstance(s, ast.ClassDef)), None)
    members: dict[str, list[ast.stmt]] = {}
    header: list[ast.AST] = []
    if memory_def is not None:
        header = [*memory_def.bases, *memory_def.keywords, *memory_def.decorator_list]
        for stmt in memory_def.body:
            names = _bound_names(stmt)
            if not names and not (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            ):
                header.append(stmt)  # class-body code that binds no name (an ``if`` block, say)
            for name in names:
                members.setdefault(name, []).append(stmt)

    def closure(top_roots: Iterable[str], member_roots: Iterable[str]) -> tuple[set[str], set[str]]:
        seen_top: set[str] = set()
        seen_members: set[str] = set()
        todo: list[tuple[str, str]] = [("top", r) for r in top_roots]
        todo += [("member", r) for r in member_roots]
        if member_roots:
            todo += [("top", n) for h in header for n in _names_used(h)]
        while todo:
            kind, name = todo.pop()
            table, seen = (top, seen_top) if kind == "top" else (members, seen_members)
            if name in seen or name not in table:
                continue
            seen.add(name)
            for stmt in table[name]:
                todo += [("top", n) for n in _names_used(stmt)]
                todo += [("member", n) for n in _self_attrs(stmt)]
        seen_top.discard("Memory")  # Memory is fingerprinted member by member
        return seen_top, seen_members

    closures = {c: closure(TOP_ROOTS.get(c, ()), MEMORY_ROOTS.get(c, ())) for c in COMPONENTS}
    reached = closures["index"][1] | closures["retrieve"][1]
    unreached = set(members) - reached
    if unreached:  # conservatively part of indexing
        extra_top, extra_members = closure((), unreached)
        closures["index"] = (closures["index"][0] | extra_top, closures["index"][1] | extra_members)

    def dump(nodes: Iterable[ast.AST]) -> list[str]:
        return [ast.dump(n, include_attributes=False) for n in nodes]

    loose_dump = dump(loose)
    out = {}
    for component, (tops, mems) in closures.items():
        parts = [["top", name, dump(top[name])] for name in sorted(tops)] + [
            ["member", name, dump(members[name])] for name in sorted(mems)
        ]
        if mems:
            parts.append(["header", dump(header)])
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

    def extract(self, segment_digest: str) -> str:
        return _digest("extract", self.fp["extract"], self.model_sig, segment_digest)

    def index(self, extract_keys: list[str]) -> str:
        return _digest("index", self.fp["index"], self.embed_sig, extract_keys)

    def plan(self, question: str, question_date: str | None) -> str:
        return _digest("plan", self.fp["plan"], self.model_sig, question, question_date)

    def retrieve(self, index_key: str, plan_key: str) -> str:
        return _digest("retrieve", self.fp["retrieve"], index_key, plan_key)

    def answer(self, retrieve_key: str, question: str) -> str:
        return _digest("answer", self.fp["answer"], self.model_sig, retrieve_key, question)


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
    """A stored retrieval (what :mod:`evolve.worker` records for one question)."""

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
