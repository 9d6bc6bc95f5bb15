"""Survey of what memory programs can reach in the allowed modules: callables that open paths,
run processes, test runners or code, or get and set attributes by a name given as data.

Walks every public attribute of every module in :data:`sandbox.static.ALLOWED_IMPORTS`, of
their public submodules (``module.sub``, imported or importable), and of the public classes
found there (``module.Class.method``), and flags each Python-level callable by reading its
source with :mod:`ast` (following calls to functions of the same package, three deep):

- ``path``: a parameter named like a path (:data:`PATH_PARAMETERS`), or a call of ``open``
  (builtin, ``io``/``os``/``gzip``/... ``.open``, numpy's ``_datasource``) or of a
  ``DataSource``;
- ``process``: ``subprocess``, ``os.system``/``popen``/``exec*``/``spawn*``, an import of
  ``pytest``, ``exec``/``eval``/``compile`` (builtins);
- ``import``: ``__import__`` or ``importlib.import_module`` (imports a module named by data);
- ``attribute``: ``getattr``/``setattr``/``delattr`` (or ``attrgetter``/``methodcaller``) in
  the callable itself, with a name taken from its arguments (a parameter, or a loop over one).

C callables cannot be read; those are decided in :data:`C_CALLABLES` below by reading their
documentation. The result is compared with the decisions tier 1 makes
(``tests/test_escapes.py``): a flagged callable is either refused by
:func:`sandbox.static.check_source` or listed with the reason it is harmless in
:data:`sandbox.static.REVIEWED_MEMBERS`. Allowing a new module, or upgrading a library, makes
that test fail until each new finding is decided.

    python tests/surface_survey.py            # prints every flagged callable and its reasons
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
import textwrap
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.static import ALLOWED_IMPORTS, import_allowed  # noqa: E402

PATH_PARAMETERS = frozenset(
    "file fname filename filepath path pathname fid dirname destpath save_dir directory "
    "root_dir local_dir filenames files paths".split()
)
OPENER_MODULES = frozenset(
    "io os gzip bz2 lzma zipfile tarfile _datasource codecs builtins".split()
)
PROCESS_CALLS = frozenset(
    "system popen execv execve execvp execl spawnv spawnve posix_spawn fork run call check_call "
    "check_output Popen".split()
)
# C callables of allowed modules that open paths or run code (their documentation says so).
C_CALLABLES = {
    "numpy.fromfile": "path", "numpy.ndarray.tofile": "path", "numpy.ndarray.dump": "path",
    "numpy.memmap": "path", "operator.attrgetter": "attribute",
    "operator.methodcaller": "attribute",
}  # fmt: skip
MAX_DEPTH = 3


def _python_source(fn: Any) -> ast.AST | None:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    try:
        return ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None


def _reasons(fn: Any, package: str, depth: int, seen: set[int]) -> set[str]:
    """Why ``fn`` is flagged (empty when it is not), following same-package calls."""
    fn = inspect.unwrap(fn) if callable(fn) else fn
    if id(fn) in seen or depth > MAX_DEPTH:
        return set()
    seen.add(id(fn))
    reasons: set[str] = set()
    if isinstance(fn, type):
        init = vars(fn).get("__init__")
        targets = [init] if isinstance(init, types.FunctionType) else []
    else:  # and for a callable object, such as numpy.test (a PytestTester), its __call__
        call = inspect.getattr_static(type(fn), "__call__", None)
        plain = isinstance(fn, types.FunctionType | types.MethodType | types.BuiltinFunctionType)
        targets = [fn] if plain or not isinstance(call, types.FunctionType) else [fn, call]
    for target in targets:
        try:
            params = set(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            params = set()
        if params & PATH_PARAMETERS:
            reasons.add("path")
        tree = _python_source(target)
        if tree is None:
            continue
        namespace = getattr(target, "__globals__", {})
        data = _data_names(tree, params) if depth == 0 else set()
        for node in ast.walk(tree):
            reasons |= _node_reasons(node, data)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and depth < MAX_DEPTH:
                callee = namespace.get(node.func.id)
                module = getattr(callee, "__module__", "") or ""
                if isinstance(callee, types.FunctionType | type) and module.startswith(package):
                    reasons |= _reasons(callee, package, depth + 1, seen)
    return reasons


def _data_names(tree: ast.AST, params: set[str]) -> set[str]:
    """The caller's data inside a function: its parameters and names looping over them."""
    names = set(params)
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.comprehension) and isinstance(node.target, ast.Name):
            if {n.id for n in ast.walk(node.iter) if isinstance(n, ast.Name)} & names:
                names.add(node.target.id)
    return names


def _node_reasons(node: ast.AST, data: set[str]) -> set[str]:
    """Reasons found in one node; ``data`` names the caller's data (attribute names that
    come from elsewhere, the library's own constants passed down, are not flagged)."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
        runners = ("pytest", "subprocess")
        return {"process"} if any(n.split(".")[0] in runners for n in names) else set()
    if not isinstance(node, ast.Call):
        return set()
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    owner = getattr(getattr(func, "value", None), "id", "")
    if isinstance(func, ast.Name) and name in ("getattr", "setattr", "delattr"):
        attr = node.args[1] if len(node.args) > 1 else None
        from_data = isinstance(attr, ast.Name) and attr.id in data
        return {"attribute"} if from_data else set()
    if name in ("attrgetter", "methodcaller") and any(
        isinstance(a, ast.Name) and a.id in data for a in node.args
    ):
        return {"attribute"}
    if name == "open" and (isinstance(func, ast.Name) or owner in OPENER_MODULES):
        return {"path"}
    if name == "DataSource":
        return {"path"}
    if owner in ("subprocess", "os") and name in PROCESS_CALLS:
        return {"process"}
    if isinstance(func, ast.Name) and name in ("exec", "eval", "compile"):
        return {"process"}
    if name in ("__import__", "import_module"):
        return {"import"}
    return set()


def _public(obj: Any) -> Iterator[tuple[str, Any]]:
    for name in sorted(getattr(obj, "__all__", None) or dir(obj)):
        if name.startswith("_") or not isinstance(name, str):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield name, getattr(obj, name)
        except Exception:  # lazy attributes that fail to import
            continue


def _modules(top: str) -> Iterator[tuple[str, str, types.ModuleType]]:
    """``top`` and its public submodules a program could import or reach, each as (the module
    a program imports, the attribute chain from it, the module)."""
    module = importlib.import_module(top)
    yield top, "", module
    for name, value in _public(module):
        if isinstance(value, types.ModuleType):
            yield top, name, value
    for info in pkgutil.iter_modules(getattr(module, "__path__", []) or []):
        path = f"{top}.{info.name}"
        if info.name.startswith("_") or not import_allowed(path):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield path, "", importlib.import_module(path)
        except Exception:  # an optional dependency is missing
            continue


@dataclass(frozen=True)
class Flagged:
    """One flagged callable: ``import module`` then ``module.chain`` reaches it."""

    module: str
    chain: str
    reasons: frozenset[str]

    @property
    def path(self) -> str:
        return f"{self.module}.{self.chain}"


def survey(modules: frozenset[str] = ALLOWED_IMPORTS) -> list[Flagged]:
    """Every flagged callable reachable as ``module.attr``, ``module.sub.attr`` or
    ``module.Class.method`` of ``modules`` (the allowed ones), with its reasons, by path."""
    found: dict[tuple[str, str], set[str]] = {}
    for top in sorted(modules - {"__future__"}):
        package = top.split(".")[0]
        for module_path, prefix, module in _modules(top):
            base = f"{prefix}." if prefix else ""
            for name, value in _public(module):
                members = [(f"{base}{name}", value)]
                if isinstance(value, type):
                    members += [(f"{base}{name}.{m}", v) for m, v in _public(value) if callable(v)]
                for chain, obj in members:
                    key = (module_path, chain)
                    if f"{module_path}.{chain}" in C_CALLABLES:
                        found.setdefault(key, set()).add(C_CALLABLES[f"{module_path}.{chain}"])
                    if not callable(obj) or isinstance(obj, types.ModuleType):
                        continue
                    owner = (getattr(obj, "__module__", None) or package).split(".")[0]
                    reasons = _reasons(obj, owner, 0, set())
                    if reasons:
                        found.setdefault(key, set()).update(reasons)
    flagged = [Flagged(m, c, frozenset(r)) for (m, c), r in found.items()]
    return sorted(flagged, key=lambda f: f.path)


def main() -> None:
    flagged = survey()
    for item in flagged:
        print(f"{item.path}: {', '.join(sorted(item.reasons))}")
    print(f"{len(flagged)} flagged callables", file=sys.stderr)


if __name__ == "__main__":
    main()
