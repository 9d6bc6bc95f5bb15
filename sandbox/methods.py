"""The program's classes and functions as Python resolves them, read from its syntax tree.

Owns :class:`ProgramClasses` (the program's top-level classes and functions: what
``self.<name>`` and ``super().<name>`` run in a method of a class, what calling a class runs,
which methods a name may reach on an object whose class is not known) and the tables of the
dunder methods Python calls for syntax or builtins applied to an object (:data:`ITER`,
:data:`BUILTIN_DUNDERS`, :data:`ANY_PROTOCOL`, ...). :mod:`sandbox.readonly` follows a
``retrieve`` through them.

Invariants: pure and deterministic; reads the tree, never changes it, never runs the program.
Classes resolve as the program defines them: bases the program does not define contribute no
methods (a library base's code is not the program's).
"""

from __future__ import annotations

import ast

from contract.spec import MEMORY
from sandbox.statefulness import RNG_CONSTRUCTORS

FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef
Fn = ast.FunctionDef | ast.AsyncFunctionDef
# The dunder methods Python calls on an object for syntax or builtins applied to it.
ITER = frozenset({"__iter__", "__next__"})  # __next__ only of a class iterating itself
ITEMS = frozenset({"__getitem__", "__missing__"})
COMPARE = frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__"})
TEXT = frozenset({"__str__", "__repr__"})
TRUTH = frozenset({"__bool__", "__len__"})
UNARY = frozenset({"__neg__", "__pos__", "__invert__"})
ARITH = frozenset(
    f"__{op}__"
    for name in "add sub mul truediv floordiv mod pow matmul and or xor".split()
    for op in (name, "r" + name)
)
BUILTIN_DUNDERS: dict[str, frozenset[str]] = {
    "len": frozenset({"__len__"}), "bool": TRUTH, "str": TEXT, "repr": TEXT,
    "print": TEXT, "format": TEXT, "hash": frozenset({"__hash__"}),
    "abs": frozenset({"__abs__"}), "next": frozenset({"__next__"}),
    "reversed": ITER | {"__reversed__", "__len__", "__getitem__"},
    "sorted": ITER | COMPARE, "min": ITER | COMPARE, "max": ITER | COMPARE,
    "sum": ITER | ARITH, "isinstance": frozenset(), "id": frozenset(), "type": frozenset(),
    **dict.fromkeys("iter list tuple set frozenset dict enumerate zip map filter any all".split(),
                    ITER),
}  # fmt: skip
# What a library function given an alias may call on it (a builtin not listed above too).
ANY_PROTOCOL = ITER | ITEMS | COMPARE | TEXT | TRUTH | UNARY | ARITH | {"__contains__"}


def decorators(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
    """The names of ``node``'s decorators (``staticmethod``, ``functools.cache`` as ``cache``)."""
    out = set()
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        out.add(getattr(d, "id", getattr(d, "attr", "")))
    return out


def _is_name(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    """``fn``'s positional parameters, in order (``self`` first in a method)."""
    return [*fn.args.posonlyargs, *fn.args.args]


class ProgramClasses:
    """The program's top-level classes and functions, and how ``self.<name>`` resolves."""

    def __init__(self, tree: ast.Module) -> None:
        self.classes = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
        self.functions = {s.name: s for s in tree.body if isinstance(s, FUNCTIONS)}
        self.owner: dict[int, str] = {}  # id(method) -> the class defining it
        for cls in self.classes.values():
            for item in cls.body:
                if isinstance(item, FUNCTIONS):
                    self.owner[id(item)] = cls.name
        self.mro = self._mro(MEMORY)
        self.rngs = {  # attributes of self bound to a random generator anywhere in the classes
            t.attr
            for cls in self.classes.values() for n in ast.walk(cls)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "id", getattr(n.value.func, "attr", "")) in RNG_CONSTRUCTORS
            for t in n.targets if isinstance(t, ast.Attribute)
        }  # fmt: skip
        self.methods: dict[str, list[Fn]] = {}  # name -> the methods of that name, any class
        for cls in self.classes.values():
            for item in cls.body:
                if isinstance(item, FUNCTIONS):
                    self.methods.setdefault(item.name, []).append(item)
        self.next_of_self_iterators: list[Fn] = []  # __next__ of classes iterating themselves
        for it in self.methods.get("__iter__", []):
            if any(_is_name(n.value, positional(it)[0].arg if positional(it) else "")
                   for n in ast.walk(it) if isinstance(n, ast.Return)):  # fmt: skip
                self.next_of_self_iterators += [
                    fn for fn in self.methods.get("__next__", [])
                    if self.owner[id(fn)] == self.owner[id(it)]
                ]  # fmt: skip

    def dunders(self, names: frozenset[str], iterating: bool = False) -> list[Fn]:
        """The program's methods Python may call for ``names`` (see the module docstring)."""
        found = [fn for name in sorted(names - {"__next__"}) for fn in self.methods.get(name, [])]
        if "__next__" in names:
            found += self.next_of_self_iterators if iterating else self.methods.get("__next__", [])
        return found

    def constructor(self, name: str) -> list[Fn]:
        """What calling the program's class ``name`` runs of its code: ``__init__`` and
        ``__post_init__`` as its classes resolve them."""
        out = []
        for wanted in ("__init__", "__post_init__"):
            for cls in self._mro(name):
                found = [i for i in self.classes[cls].body if isinstance(i, FUNCTIONS)
                         and i.name == wanted]  # fmt: skip
                if found:
                    out.append(found[0])
                    break
        return out

    def _mro(self, name: str) -> list[str]:
        """``name`` and the program-defined classes it derives from, depth first, once each."""
        out: list[str] = []
        todo = [name]
        while todo:
            current = todo.pop(0)
            if current in self.classes and current not in out:
                out.append(current)
                bases = self.classes[current].bases
                todo[:0] = [b.id for b in bases if isinstance(b, ast.Name)]
        return out

    def method(self, name: str, owner: str = MEMORY, after: bool = False) -> Fn | None:
        """The method ``self.<name>`` runs in a method of ``owner`` (``super().<name>`` when
        ``after``)."""
        mro = self.mro if owner == MEMORY else self._mro(owner)
        classes = mro[1:] if after else mro
        for cls in classes:
            for item in self.classes[cls].body:
                if isinstance(item, FUNCTIONS) and item.name == name:
                    return item
        return None
