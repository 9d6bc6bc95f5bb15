"""The memory-state codec: a built ``Memory`` as bytes, and back, without trusting the bytes.

:func:`dump_state` pickles an object's attributes with the program's classes and functions
replaced by portable references (by qualified name) and the backend by a placeholder;
:func:`load_state` rebinds them to the *current* program's namespace and backend and allows
only a fixed set of safe globals (safe builtins, a few stdlib modules, and from numpy, scipy.sparse
and bm25s only classes, ufuncs and the reconstructors their pickles use). Every load returns a
fresh object, so two memories never share mutable state. Runs inside the sandbox host only:
the optimizer stores the bytes (:class:`evolve.stagecache.StageStore`) but never unpickles them.
"""

from __future__ import annotations

import io
import pickle
import types
from typing import Any

import numpy as np

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
