"""Sandbox tier 1, the object model: class features that let library code or a borrowed
method reach what the attribute rules of :mod:`sandbox.static` keep out of sight.

Owns :func:`object_model_issues`, which returns :data:`sandbox.statefulness.Issue` tuples that
:mod:`sandbox.static` turns into findings. Pure, deterministic, never runs the program.

Rejected, and why:

- ``dunder-method``: defining a dunder method outside :data:`ALLOWED_DUNDER_METHODS`, in a class
  or anywhere else. The rest are hooks that library code calls with data of its own choosing
  or that change what attribute lookups and copies do: ``__getattr__``/``__getattribute__``
  answer any name (a helper asking for ``__globals__`` gets the program's object), the
  ``__reduce__``/``__getstate__``/``__setstate__``/``__copy__`` family makes ``copy`` and
  ``pickle`` call any function with any arguments or set attributes by name, ``__fspath__``
  turns an object into a path for file openers, ``__set_name__``/``__init_subclass__``/
  ``__class_getitem__``/``__del__``/``__format__``/``__index__`` run at moments the program does
  not control, and ``__array_*__`` intercept numpy. Allowed: construction, representation,
  comparison, hashing, container and iterator protocols, arithmetic, ``__call__`` and
  ``with``.
- ``unbound-method``: taking a plain method (not ``@staticmethod``/``@classmethod``) from a
  class instead of an instance: ``Cls.method(obj)``, ``cls.method``, ``type(x).method``.
  Private attributes are allowed on a method's own ``self``; called through its class, a method
  gets any object as ``self`` (a module, a library object) and reads its private attributes.
  ``super().method(...)`` binds ``self`` and stays allowed.
- ``class-value``: a class the program defines, or ``type(x)``, used as a value other than
  by calling it, reading an attribute or item of it, iterating it (an ``Enum``), comparing
  it, ``isinstance``/``issubclass``, ``except``/``raise``/``case``, a base class,
  ``default_factory=`` or as the first argument of a call that never returns it
  (``super``, ``fields``, ``defaultdict``, ``list``, ``sorted``, ``len``, ...):
  an alias (``C = Peek``) would carry the class past the ``unbound-method`` rule.
- ``attribute-by-name``: ``functools.wraps`` given more than the wrapped function (its
  ``assigned``/``updated`` name attributes to copy); ``update_wrapper`` itself is a forbidden
  attribute of :mod:`sandbox.static`.
- ``dynamic-type``: the functional ``Enum`` API (``Enum("E", names)``), which makes a class
  whose attribute names are data.

A filter, not a proof: a class reached through library data (``dataclasses.fields(x)[0].type``
without ``from __future__ import annotations``) is not followed.
"""

from __future__ import annotations

import ast

from sandbox.statefulness import Issue

ALLOWED_DUNDER_METHODS: frozenset[str] = frozenset(
    f"__{name}__"
    for name in (
        "init post_init repr str len iter next reversed contains getitem setitem delitem "
        "missing eq ne lt le gt ge hash bool call enter exit neg pos abs invert "
        "add radd iadd sub rsub isub mul rmul imul truediv rtruediv itruediv floordiv "
        "rfloordiv ifloordiv mod rmod pow rpow matmul rmatmul and rand or ror xor rxor"
    ).split()
)
ENUM_TYPES = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"})
_DUNDER_FIX = "define only the usual methods (__init__, __repr__, __eq__, __len__, ...)"
_UNBOUND_FIX = (
    "call methods on instances (obj.method()); make a function that needs no instance "
    "@staticmethod or @classmethod, or a top-level function"
)
_VALUE_FIX = "call the class or use its attributes directly; do not store or pass it"
_FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef
_TYPE_CHECKS = frozenset({"isinstance", "issubclass"})
# Calls given a class as first argument that never hand the class itself back.
_CLASS_CONSUMERS = frozenset(
    "defaultdict super fields is_dataclass list tuple set frozenset sorted len iter "
    "reversed".split()
)


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {_name(d) for d in fn.decorator_list}


def plain_methods(tree: ast.Module) -> set[str]:
    """Names of the functions defined in class bodies that bind ``self`` when called on an
    instance (every method but ``@staticmethod`` and ``@classmethod`` ones)."""
    return {
        item.name
        for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
        for item in cls.body
        if isinstance(item, _FUNCTIONS) and not _decorators(item) & {"staticmethod", "classmethod"}
    }  # fmt: skip


def _annotation_ids(tree: ast.Module) -> set[int]:
    roots = [getattr(n, "annotation", None) for n in ast.walk(tree)]
    roots += [n.returns for n in ast.walk(tree) if isinstance(n, _FUNCTIONS)]
    return {id(sub) for root in roots if root is not None for sub in ast.walk(root)}


def _one_arg_type(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    return node.func.id == "type" and len(node.args) == 1 and not node.keywords


class _Parents:
    def __init__(self, tree: ast.Module) -> None:
        self.of: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.of[id(child)] = node

    def admits_class(self, node: ast.AST) -> bool:
        """Whether a class object at ``node`` is used in one of the admitted ways."""
        parent = self.of.get(id(node))
        if isinstance(parent, ast.Tuple):  # isinstance(x, (A, B)), except (A, B)
            node, parent = parent, self.of.get(id(parent))
        if isinstance(parent, ast.Call):
            callee = _name(parent.func)
            return (
                parent.func is node
                or (callee in _TYPE_CHECKS and node in parent.args[1:])
                or (callee in _CLASS_CONSUMERS and parent.args[:1] == [node])
            )
        if isinstance(parent, ast.For | ast.comprehension):  # iterating an Enum
            return parent.iter is node
        if isinstance(parent, ast.Subscript):  # an Enum member by name
            return parent.value is node
        if isinstance(parent, ast.keyword):
            grand = self.of.get(id(parent))
            return parent.arg == "default_factory" or isinstance(grand, ast.ClassDef)
        admitted = ast.Attribute | ast.Compare | ast.ClassDef | ast.ExceptHandler | ast.Raise
        return isinstance(parent, admitted | ast.MatchClass)


def object_model_issues(tree: ast.Module) -> list[Issue]:
    """Every object-model issue of a parsed program (module docstring), unsorted."""
    issues: list[Issue] = []
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    methods = plain_methods(tree)
    annotations = _annotation_ids(tree)
    parents = _Parents(tree)
    for node in ast.walk(tree):
        if isinstance(node, _FUNCTIONS) and node.name.startswith("__") and node.name.endswith("__"):
            if node.name not in ALLOWED_DUNDER_METHODS:
                problem = f"method '{node.name}' may not be defined"
                issues.append(("dunder-method", node.lineno, problem, _DUNDER_FIX))
        elif isinstance(node, ast.Attribute) and node.attr in methods:
            receiver = node.value
            from_class = (
                (isinstance(receiver, ast.Name) and receiver.id in classes | {"cls"})
                or (isinstance(receiver, ast.Attribute) and receiver.attr in classes)
                or _one_arg_type(receiver)
            )
            if from_class:
                shown = f"{ast.unparse(receiver)}.{node.attr}"[:60]
                problem = f"'{shown}' takes a method from its class, not an instance"
                issues.append(("unbound-method", node.lineno, problem, _UNBOUND_FIX))
        elif (
            (
                (
                    isinstance(node, ast.Name)
                    and node.id in classes
                    and isinstance(node.ctx, ast.Load)
                )
                or _one_arg_type(node)
            )
            and id(node) not in annotations
            and not parents.admits_class(node)
        ):
            shown = ast.unparse(node)[:40]
            problem = f"the class '{shown}' is used as a value"
            issues.append(("class-value", getattr(node, "lineno", 0), problem, _VALUE_FIX))
        elif isinstance(node, ast.Call):
            issues += _call_issues(node)
    return issues


def _call_issues(node: ast.Call) -> list[Issue]:
    callee = _name(node.func)
    if callee == "wraps" and (len(node.args) != 1 or node.keywords):
        problem = "'wraps' with assigned/updated copies attributes by name"
        fix = "use @functools.wraps(function) with the function alone"
        return [("attribute-by-name", node.lineno, problem, fix)]
    if callee in ENUM_TYPES and (
        len(node.args) > 1 or any(k.arg == "names" for k in node.keywords)
    ):
        problem = f"'{callee}(name, members)' creates a class at run time"
        return [("dynamic-type", node.lineno, problem, "define enums with a class statement")]
    return []
