"""The memory-state codec: a built ``Memory`` as bytes, and back, without trusting the bytes.

:func:`dump_state` pickles an object's attributes with the program's classes and functions
replaced by portable references (their module-level name) and the backend by a placeholder;
:func:`load_state` rebinds them to the *current* program's namespace and backend. Runs inside
the sandbox host only: the optimizer stores the bytes
(:class:`evolve.evaluation.stepcache.StepStore`)
but never unpickles them. Every load returns a fresh object, so two memories never share
mutable state.

A stored blob is hostile input: a host that once ran escaped code could have stored it, and it
is read later by a clean program's restore. So:

- A program reference is one plain name (an identifier, no dots, not a dunder) that the current
  program binds at module level to a class or function it defines itself (its ``__module__`` is
  the program's and its ``__qualname__`` is that name). Nothing is resolved attribute by
  attribute; a nested class, a method or a lambda has no such name and is not storable.
- Any other global is one of the exact (module, name) pairs of :data:`ALLOWED_GLOBALS`: safe
  builtins, a few stdlib containers and dates, ``random.Random``, numpy's dtype, ndarray, scalar
  types, ufuncs, random generators, masked arrays and the reconstructors their pickles use,
  scipy.sparse matrix classes and ``bm25s.BM25``.
  No module is open as a whole and no dotted name is looked up.
- :func:`dump_state` refuses (``pickle.PicklingError``) a program object without a plain name
  and any other global outside :data:`ALLOWED_GLOBALS`, which :func:`load_state` would refuse
  whatever the program: such a memory is rebuilt each time rather than stored.
- :func:`load_state` reads at most :data:`MAX_STATE_BYTES`, wants a dict with string keys, and
  turns every failure into one :class:`StateError` line (never a traceback of internals).

:func:`state_digest` is the comparison of a state that cannot be stored: a sha256 over the same
walk with nothing refused, functions and lambdas by their code, defaults, closure cells and
attributes, bound methods by function and receiver, generators by position and locals, every
other object by its pickle reduction (iterators and ``itertools`` objects reduce to their
position). Two digests of one memory differ when anything reachable from its attributes
changed in between (the smoke tier compares them around a retrieve, :mod:`sandbox.tiers`); a
walk that still fails (an object with no reduction) gives None.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import types
from pickle import whichmodule  # type: ignore[attr-defined]
from typing import Any

import numpy as np

from contract.types import ContractError

MAX_STATE_BYTES = 1 << 30


class StateError(ContractError, pickle.UnpicklingError):
    """A stored memory state that cannot be restored (damaged, hostile or from another program)."""


def _pairs(objects: list[Any]) -> set[tuple[str, str]]:
    return {(whichmodule(o, o.__name__), o.__name__) for o in objects}


_SAFE_BUILTINS = (
    "set frozenset dict list tuple complex bytearray bytes slice range object int float str "
    "bool".split()
)
_RANDOM = np.random
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {("builtins", name) for name in _SAFE_BUILTINS}
    | {("collections", n) for n in ("OrderedDict", "defaultdict", "deque", "Counter")}
    | {("datetime", n) for n in ("date", "datetime", "time", "timedelta", "timezone")}
    | {("random", "Random")}
    | {("numpy", "dtype"), ("numpy", "ndarray")}
    | _pairs(list(set(np.sctypeDict.values())))  # numpy's scalar types (numpy.float32, ...)
    | _pairs([u for u in vars(np).values() if isinstance(u, np.ufunc)])
    | {
        (f"numpy.{core}.{module}", name)  # numpy 2 spells the core package _core, numpy 1 core
        for core in ("core", "_core")
        for module, name in (
            ("multiarray", "_reconstruct"),
            ("multiarray", "scalar"),
            ("numeric", "_frombuffer"),
        )
    }  # fmt: skip
    | {("numpy.random._pickle", n) for n in ("__generator_ctor", "__bit_generator_ctor")}
    | {("numpy.random._pickle", "__randomstate_ctor")}
    | {("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence")}
    | _pairs([_RANDOM.Generator, _RANDOM.RandomState, _RANDOM.SeedSequence, _RANDOM.PCG64])
    | _pairs([_RANDOM.PCG64DXSM, _RANDOM.MT19937, _RANDOM.Philox, _RANDOM.SFC64])
    | {("numpy.ma", "MaskedArray"), ("numpy.ma.core", "MaskedArray")}
    | {("numpy.ma.core", "_mareconstruct")}
    | {  # scipy.sparse matrices, which bm25s may hold
        (f"scipy.sparse._{fmt}", f"{fmt}_{kind}")
        for fmt in ("csr", "csc", "coo", "bsr", "dia", "dok", "lil")
        for kind in ("matrix", "array")
    }
    | {("bm25s", "BM25"), ("bm25s.tokenization", "Tokenized")}
)


def plain_program_name(name: Any) -> bool:
    """Whether ``name`` can name a program object in a state: an identifier, not a dunder."""
    return isinstance(name, str) and name.isidentifier() and not name.startswith("__")


def _program_object(namespace: dict[str, Any], name: Any) -> Any:
    """The class or function the program defines at module level as ``name``, or None."""
    if not plain_program_name(name):
        return None
    obj = namespace.get(name)
    if not isinstance(obj, type | types.FunctionType):
        return None
    defined_here = obj.__module__ == namespace.get("__name__") and obj.__qualname__ == name
    return obj if defined_here else None


def _by_reference(obj: Any) -> bool:
    """Whether pickle stores ``obj`` as a global reference (module and name)."""
    return isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType | np.ufunc)


class _StatePickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO | _HashSink, program_module: str, backend: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._program_module = program_module
        self._backend = backend

    def persistent_id(self, obj: Any) -> Any:
        if obj is self._backend:
            return ("backend",)
        if not _by_reference(obj):
            return None
        if getattr(obj, "__module__", None) == self._program_module:
            name = getattr(obj, "__qualname__", "")
            if not plain_program_name(name):  # load_state checks the program defines it
                raise pickle.PicklingError(
                    f"cannot store {name}: only classes and functions defined at the program's "
                    "top level (plain names) can be stored"
                )
            return ("program", name)
        name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "")
        pair = (whichmodule(obj, name), name)
        if pair not in ALLOWED_GLOBALS:
            raise pickle.PicklingError(f"cannot store {pair[0]}.{pair[1]}: not allowed in state")
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
            obj = _program_object(self._namespace, pid[1])
            if obj is not None:
                return obj
            raise pickle.UnpicklingError(
                f"it refers to {str(pid[1])[:80]!r}, which is not a top-level class or function "
                "of this program"
            )
        raise pickle.UnpicklingError(f"unknown persistent id {str(pid)[:80]}")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"it refers to {module[:80]}.{name[:80]}, which is not allowed"
        )


def dump_state(obj: Any, program_module: str, backend: Any) -> bytes:
    """Serialise an object's attributes; raises (PicklingError, TypeError, ...) if it can't."""
    buf = io.BytesIO()
    _StatePickler(buf, program_module, backend).dump(vars(obj))
    return buf.getvalue()


def load_state(cls: Any, data: bytes, program_namespace: dict[str, Any], backend: Any) -> Any:
    """A fresh ``cls`` instance carrying the saved attributes (``__init__`` is not called).

    Raises :class:`StateError` (one line) for anything it will not or cannot restore."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_STATE_BYTES:
        raise StateError(f"memory state cannot be restored: not bytes of at most {MAX_STATE_BYTES}")
    try:
        state = _StateUnpickler(io.BytesIO(data), program_namespace, backend).load()
    except Exception as exc:  # hostile bytes reach reconstructors: any error is a refusal
        reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        raise StateError(f"memory state cannot be restored: {reason}") from None
    if not (isinstance(state, dict) and all(isinstance(k, str) for k in state)):
        raise StateError("memory state cannot be restored: it is not a dict of attributes")
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def _walked(*parts: Any) -> None:
    """Stands for an object in a digest's pickle (never called: digests are not unpickled)."""


class _HashSink:
    def __init__(self) -> None:
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)


class _DigestPickler(_StatePickler):
    """:class:`_StatePickler`'s walk with nothing refused: what pickle cannot store is walked."""

    def persistent_id(self, obj: Any) -> Any:
        if obj is self._backend:
            return ("backend",)
        if isinstance(obj, type | types.ModuleType | types.BuiltinFunctionType | np.ufunc):
            return ("named", getattr(obj, "__module__", None), getattr(obj, "__qualname__", None),
                    getattr(obj, "__name__", None))  # fmt: skip
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType) and obj is not _walked:
            cells = tuple(_cell(c) for c in obj.__closure__ or ())
            parts = (obj.__module__, obj.__qualname__, obj.__code__.co_code, obj.__defaults__,
                     obj.__kwdefaults__, cells, obj.__dict__)  # fmt: skip
            return _walked, parts
        if isinstance(obj, types.MethodType):
            return _walked, ("method", obj.__func__, obj.__self__)
        if isinstance(obj, types.GeneratorType):
            frame = obj.gi_frame
            where = (frame.f_lasti, dict(frame.f_locals)) if frame is not None else None
            return _walked, ("generator", obj.gi_code.co_qualname, where)
        return NotImplemented


def _cell(cell: types.CellType) -> Any:
    try:
        return ("cell", cell.cell_contents)
    except ValueError:  # an empty cell
        return ("cell",)


def state_digest(obj: Any, program_module: str, backend: Any) -> str | None:
    """sha256 of everything reachable from ``obj``'s attributes (see the module docstring), or
    None when something on the way has no reduction."""
    sink = _HashSink()
    try:
        _DigestPickler(sink, program_module, backend).dump(vars(obj))
    except Exception:
        return None
    return sink.hash.hexdigest()
