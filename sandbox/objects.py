"""Sandbox tier 1, the object model: class features that let library code or a borrowed
method reach what the attribute rules of :mod:`sandbox.static` keep out of sight.

Owns :func:`object_model`, which returns the :data:`sandbox.statefulness.Issue` tuples that
:mod:`sandbox.static` turns into findings, and the Names through which a method may read
private attributes (its own ``self`` or ``cls``). Pure, deterministic, never runs the program.

Private attributes are allowed only on a method's own first parameter, so that parameter must
only ever be bound to an instance of the method's class (or, for a ``@classmethod``, to the
class): called with a library object as ``self``, a method reads that object's internals
(``numpy.lib._datasource`` opens files; ``typing._eval_type`` evaluates a string with the real
builtins). Three invariants keep it so:

1. A method is reached only through an instance. ``unbound-method``: a method (any function of
   a class body but a ``@staticmethod``/``@classmethod``; ``__init__`` and ``__post_init__``
   always, dataclasses generate them) looked up on a class-valued receiver: a class name, a
   classmethod's first parameter whatever its name, ``type(x)``, ``X.Nested``, or ``super()``
   where its second argument is a class (in a classmethod); or named inside its own class body,
   where it is the plain function (called, aliased, a default, ``.fget``); only
   ``@name.setter``/``getter``/``deleter`` of a property there is allowed. ``super-call``:
   ``super`` only as ``super().attr`` or ``super(C, self).attr`` directly in a method, with the
   method's own first parameter. Only functions defined directly in a class body, undecorated
   or decorated once with the builtin ``property``, ``classmethod`` or
   ``functools.cached_property``, or with an accessor of a property of the same class body,
   are methods that get private access; a ``@staticmethod``, any other decorator (it is given
   the raw function), and sunder names (``_missing_``: library hooks such as ``Enum`` call them
   through the class with data) get none. ``rebound-builtin``: a decorator named like one of
   those builtins that the program binds itself.
2. A class never travels as a value. ``class-value``: a class of the program, a classmethod's
   first parameter, ``type`` or ``type(x)`` used other than by calling it, reading an attribute
   of it, iterating it (an ``Enum``), subscripting an ``Enum``, comparing it with ``is``, as the
   class in ``isinstance``/``issubclass``, ``except``/``raise``/``case``, a base or metaclass,
   ``dataclasses.field(default_factory=...)`` or the first argument of a builtin that never
   hands it back (``super``, ``dataclasses.fields``, ``list``, ``sorted``, ``len``, ...). Those
   callees count only when they are the real ones: a program that binds the name itself (a
   function, a parameter, an assignment, a method of that name) does not get them admitted.
   Other comparisons run the other operand's ``__eq__``/``__lt__``/``__contains__``, a
   subscripted generic class forwards attributes to the class, a class nested in an ``Enum`` is
   a member value. ``annotation-class``: without ``from __future__ import annotations``, a
   dataclass's field annotations are evaluated and handed back by ``dataclasses.fields(x)[i]
   .type``, so they may not name a program class or ``type``/``Type``. ``class-decorator``: only
   ``dataclass``, ``total_ordering``, ``unique`` and ``final`` may decorate a class (a decorator
   is given the class). ``metaclass``: a class deriving from ``type`` or a library metaclass
   (:data:`METACLASSES`): a metaclass's methods and hooks get classes as ``self``.
   ``dynamic-base``: a base or metaclass computed or bound by assignment (an alias of a
   metaclass). Library attributes that hand a class back (``default_factory``, a singledispatch
   ``registry``) are refused by :mod:`sandbox.surface`'s lists.
3. ``self`` names the method's own parameter: nested functions and lambdas with a parameter of
   that name, in any position, shadow it; rebinding it (also by ``import ... as self``) is
   refused by :mod:`sandbox.static`.

Also refused: ``dunder-method``, defining a dunder method outside :data:`ALLOWED_DUNDER_METHODS`,
in a class or anywhere else. The rest are hooks that library code calls with data of its own
choosing or that change what attribute lookups and copies do: ``__getattr__`` answers any name,
the ``__reduce__``/``__getstate__``/``__copy__`` family makes ``copy`` call any function,
``__fspath__`` turns an object into a path, ``__set_name__``/``__init_subclass__``/
``__class_getitem__``/``__del__``/``__format__``/``__index__`` run at moments the program does
not control, and ``__array_*__`` intercept numpy. ``attribute-by-name``: ``functools.wraps``
given more than the wrapped function. ``dynamic-type``: the functional ``Enum`` API and calls
of a metaclass (``abc.ABCMeta(name, bases, namespace)``), which make classes at run time.

A filter, not a proof: it follows names, not values, and stops the routes it knows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

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
# Metaclasses among the allowed modules' public names (tests/test_escapes.py surveys them).
METACLASSES = frozenset({"type", "Type", "ABCMeta", "EnumMeta", "EnumType", "NamedTupleMeta"})
# Names the rules trust to mean a library object, and where each may come from: "builtins"
# when the program never binds it, else only 'from <module> import <name>' or '<module>.name'.
TRUSTED: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        "super isinstance issubclass property classmethod staticmethod list tuple set "
        "frozenset sorted len iter reversed".split(),
        frozenset({"builtins"}),
    ),
    **dict.fromkeys("dataclass field fields is_dataclass".split(), frozenset({"dataclasses"})),
    "cached_property": frozenset({"functools"}),
    "total_ordering": frozenset({"functools"}),
    "unique": frozenset({"enum"}),
    "final": frozenset({"typing"}),
}
CLASS_DECORATORS = frozenset({"dataclass", "total_ordering", "unique", "final"})
_METHOD_DECORATORS = frozenset({"property", "classmethod", "cached_property"})
_ACCESSORS = frozenset({"setter", "getter", "deleter"})
_TYPE_CHECKS = frozenset({"isinstance", "issubclass"})
# Builtins given a class as first argument that never hand the class itself back.
_CLASS_CONSUMERS = frozenset(
    "super fields is_dataclass list tuple set frozenset sorted len iter reversed".split()
)
_SUNDER = re.compile(r"_[^_](\w*[^_])?_")
_FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef
_DEFS = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_DUNDER_FIX = "define only the usual methods (__init__, __repr__, __eq__, __len__, ...)"
_UNBOUND_FIX = (
    "call methods on instances (obj.method()); make a function that needs no instance "
    "@staticmethod or @classmethod, or a top-level function"
)
_VALUE_FIX = "call the class, read its attributes or compare it with 'is'; do not store or pass it"


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _one_arg_type(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    return node.func.id == "type" and len(node.args) == 1 and not node.keywords


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    a = fn.args
    return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p}


def _bindings(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """Every node that binds each name, anywhere in the program."""
    out: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        name = None
        if isinstance(node, _FUNCTIONS | ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.arg):
            name = node.arg
        elif isinstance(node, ast.alias) and node.name != "*":
            name = node.asname or node.name.split(".")[0]
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            name = node.id
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
            name = node.name
        elif isinstance(node, ast.MatchMapping):
            name = node.rest
        if name is not None:
            out.setdefault(name, []).append(node)
    return out


def _class_scope(cls: ast.ClassDef) -> Iterator[ast.AST]:
    """Every node evaluated in a class body's own scope: its statements, and the decorators,
    defaults and annotations (bases and keywords) of the functions (classes) defined there."""
    todo: list[ast.AST] = list(cls.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, _DEFS):
            found = [*getattr(node, "decorator_list", []), *node.args.defaults]
            found += node.args.kw_defaults
            if isinstance(node, _FUNCTIONS):
                found += [p.annotation for p in ast.walk(node.args) if isinstance(p, ast.arg)]
                found.append(node.returns)
            todo += [n for n in found if n is not None]
        elif isinstance(node, ast.ClassDef):
            todo += [*node.decorator_list, *node.bases, *node.keywords]
        else:
            todo.extend(ast.iter_child_nodes(node))


class _Program:
    """What the rules need to know about a program's classes, methods and names."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
        self.bindings = _bindings(tree)
        self.class_defs = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        self.classes = {c.name for c in self.class_defs}
        self.enums = set[str]()
        while True:  # classes deriving from an Enum type, directly or through program classes
            more = {
                c.name for c in self.class_defs
                if any(_name(b) in ENUM_TYPES | self.enums for b in c.bases)
            }  # fmt: skip
            if more <= self.enums:
                break
            self.enums |= more
        self.future_annotations = any(
            isinstance(s, ast.ImportFrom) and s.module == "__future__"
            and any(a.name == "annotations" for a in s.names) for s in tree.body
        )  # fmt: skip
        self.issues: list[Issue] = []
        self.kinds: dict[int, str] = {}  # a class-body function's id -> its kind (_kind)
        self.methods = {"__init__", "__post_init__"}  # names that are plain on a class
        self.selves: set[int] = set()  # Names that are a method's own self or cls
        self.class_params: set[int] = set()  # Names that are a classmethod's own cls
        for cls in self.class_defs:
            properties: set[str] = set()  # property names, unless rebound in the class body
            rebound = {
                getattr(n, "id", None) or getattr(n, "asname", None) or getattr(n, "name", "")
                for n in _class_scope(cls)
                if isinstance(n, ast.alias | ast.ClassDef)
                or (isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load))
            }  # fmt: skip
            for fn in (m for m in cls.body if isinstance(m, _FUNCTIONS)):
                kind = self.kinds[id(fn)] = self._kind(fn, properties)
                if kind in ("instance", "other"):
                    self.methods.add(fn.name)
                if kind == "instance" and fn.decorator_list and fn.name not in rebound:
                    properties.add(fn.name)
                own = self._own_references(fn) if kind in ("instance", "class") else (set(), "")
                self.selves |= own[0] if own[1] in ("self", "cls") else set()
                self.class_params |= own[0] if kind == "class" else set()

    def trusted(self, node: ast.AST) -> bool:
        """Whether ``node`` (a name or ``module.name``) is the library object of that name."""
        if isinstance(node, ast.Name):
            sources, binders = TRUSTED.get(node.id), self.bindings.get(node.id, [])
            if sources is None:
                return False
            if not binders:
                return "builtins" in sources
            return all(
                isinstance(b, ast.alias) and b.asname is None
                and getattr(self.parent.get(id(b)), "module", None) in sources for b in binders
            )  # fmt: skip
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            sources = TRUSTED.get(node.attr, frozenset())
            binders = self.bindings.get(node.value.id, [])
            return bool(sources and binders) and all(
                isinstance(b, ast.alias) and b.asname is None and b.name in sources
                and isinstance(self.parent.get(id(b)), ast.Import) for b in binders
            )  # fmt: skip
        return False

    def _kind(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, properties: set[str]) -> str:
        """'instance' (self is an instance: private access), 'class' (a classmethod: private
        access on cls), 'static' (no private access, not plain on a class) or 'other' (no
        private access, plain on a class)."""
        decorators, sunder = fn.decorator_list, bool(_SUNDER.fullmatch(fn.name))
        names = {_name(d) for d in decorators if self.trusted(d)}
        for d in decorators:
            if isinstance(d, ast.Name) and d.id in _METHOD_DECORATORS | {"staticmethod"}:
                if d.id in self.bindings and not self.trusted(d):
                    problem = f"'{d.id}' is bound by the program, not the builtin"
                    fix = "give your own function another name"
                    self.issues.append(("rebound-builtin", d.lineno, problem, fix))
        if "staticmethod" in names or ("classmethod" in names and (sunder or len(decorators) > 1)):
            return "static"
        if sunder or len(decorators) > 1:
            return "other"
        if not decorators or names & {"property", "cached_property"}:
            return "instance"
        if names == {"classmethod"}:
            return "class"
        d = decorators[0]
        accessor = isinstance(d, ast.Attribute) and d.attr in _ACCESSORS
        value = getattr(d, "value", None)
        of_property = accessor and isinstance(value, ast.Name) and value.id in properties
        return "instance" if of_property else "other"

    def _own_references(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[int], str]:
        """The ids of the Names in ``fn`` that refer to its first parameter, and its name:
        nested functions and lambdas with a parameter of that name (in any position) and class
        bodies shadow it."""
        params = [*fn.args.posonlyargs, *fn.args.args]
        if not params:
            return set(), ""
        name, out, todo = params[0].arg, set[int](), list[ast.AST](fn.body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.ClassDef) or (
                isinstance(node, _DEFS) and name in _params(node)
            ):
                continue
            if isinstance(node, ast.Name) and node.id == name:
                out.add(id(node))
            todo.extend(ast.iter_child_nodes(node))
        return out, name

    def class_valued(self, node: ast.AST) -> bool:
        """Whether ``node`` evaluates to a class of the program or ``type`` itself (as far as
        names tell), not counting ``super``."""
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            return node.id in self.classes or id(node) in self.class_params or node.id == "type"
        if isinstance(node, ast.Attribute):
            return node.attr in self.classes and isinstance(node.ctx, ast.Load)
        return _one_arg_type(node)

    def _class_super(self, call: ast.Call) -> bool:
        """Whether a ``super(...)`` call looks attributes up on a class, not an instance."""
        if call.args:
            return len(call.args) > 1 and id(call.args[1]) in self.class_params
        fn = self._enclosing_def(call)
        return fn is not None and self.kinds.get(id(fn)) == "class"

    def _enclosing_def(self, node: ast.AST) -> ast.AST | None:
        while (node := self.parent.get(id(node))) is not None:  # type: ignore[assignment]
            if isinstance(node, _DEFS | ast.ClassDef):
                return node
        return None

    def admits_class(self, node: ast.AST) -> bool:
        """Whether a class object at ``node`` is used in one of the admitted ways."""
        parent = self.parent.get(id(node))
        if isinstance(parent, ast.Tuple):  # isinstance(x, (A, B)), except (A, B)
            node, parent = parent, self.parent.get(id(parent))
            if isinstance(parent, ast.ExceptHandler):
                return True
            checks = isinstance(parent, ast.Call) and _name(parent.func) in _TYPE_CHECKS
            return checks and self.trusted(parent.func) and node in parent.args[1:]  # type: ignore[union-attr]
        if isinstance(parent, ast.Call):
            callee = _name(parent.func) if self.trusted(parent.func) else ""
            return (
                parent.func is node
                or (callee in _TYPE_CHECKS and node in parent.args[1:])
                or (callee in _CLASS_CONSUMERS and parent.args[:1] == [node])
                or (callee == "super" and parent.args[1:2] == [node] and id(node) in self.selves)
            )
        if isinstance(parent, ast.For | ast.comprehension):  # iterating an Enum
            return parent.iter is node
        if isinstance(parent, ast.Subscript):  # an Enum member by name, a generic base
            based = isinstance(self.parent.get(id(parent)), ast.ClassDef)
            return parent.value is node and (_name(node) in self.enums or based)
        if isinstance(parent, ast.keyword):
            grand = self.parent.get(id(parent))
            if isinstance(grand, ast.ClassDef):
                return parent.arg == "metaclass"
            if not (isinstance(grand, ast.Call) and _name(grand.func) == "field"):
                return False
            return parent.arg == "default_factory" and self.trusted(grand.func)
        if isinstance(parent, ast.Compare):
            return all(isinstance(op, ast.Is | ast.IsNot) for op in parent.ops)
        if isinstance(parent, ast.Attribute):
            return parent.value is node
        return isinstance(parent, ast.ClassDef | ast.ExceptHandler | ast.Raise | ast.MatchClass)


def object_model(tree: ast.Module) -> tuple[list[Issue], set[int]]:
    """Every object-model issue of a parsed program (module docstring), unsorted, and the ids
    of the Names through which a method may read private attributes (its own self or cls)."""
    program = _Program(tree)
    issues = program.issues
    annotations = _annotation_ids(tree)
    for node in ast.walk(tree):
        if isinstance(node, _FUNCTIONS) and node.name.startswith("__") and node.name.endswith("__"):
            if node.name not in ALLOWED_DUNDER_METHODS:
                problem = f"method '{node.name}' may not be defined"
                issues.append(("dunder-method", node.lineno, problem, _DUNDER_FIX))
        elif isinstance(node, ast.ClassDef):
            issues += _class_issues(program, node)
        elif isinstance(node, ast.Attribute) and node.attr in program.methods:
            receiver = node.value
            super_call = isinstance(receiver, ast.Call) and _name(receiver.func) == "super"
            if (super_call and program._class_super(receiver)) or (  # type: ignore[arg-type]
                not super_call and program.class_valued(receiver)
            ):
                shown = f"{ast.unparse(receiver)}.{node.attr}"[:60]
                problem = f"'{shown}' takes a method from its class, not an instance"
                issues.append(("unbound-method", node.lineno, problem, _UNBOUND_FIX))
        elif isinstance(node, ast.Call):
            issues += _call_issues(node)
        if (
            isinstance(node, ast.Name | ast.Attribute | ast.Call)
            and program.class_valued(node)
            and not (isinstance(node, ast.Name) and _is_callee(program, node))
            and id(node) not in annotations
            and not program.admits_class(node)
        ):
            shown, fix = ast.unparse(node)[:40], _VALUE_FIX
            problem = f"the class '{shown}' is used as a value"
            if shown == "type":
                fix = "rename a variable called type; call type(x) or compare it with 'is'"
            issues.append(("class-value", getattr(node, "lineno", 0), problem, fix))
        if isinstance(node, ast.Name) and node.id == "super" and isinstance(node.ctx, ast.Load):
            issues += _super_issues(program, node)
    return issues, program.selves


def _is_callee(program: _Program, node: ast.Name) -> bool:
    """``type(x)`` is judged as a whole; ``type`` alone, called, is that call."""
    parent = program.parent.get(id(node))
    return node.id == "type" and isinstance(parent, ast.Call) and parent.func is node


def _annotation_ids(tree: ast.Module) -> set[int]:
    roots = [getattr(n, "annotation", None) for n in ast.walk(tree)]
    roots += [n.returns for n in ast.walk(tree) if isinstance(n, _FUNCTIONS)]
    return {id(sub) for root in roots if root is not None for sub in ast.walk(root)}


def _class_issues(program: _Program, cls: ast.ClassDef) -> list[Issue]:
    """Decorators, bases, annotations and method references of one class statement."""
    issues: list[Issue] = []
    for deco in cls.decorator_list:
        callee = deco.func if isinstance(deco, ast.Call) else deco
        if not (_name(callee) in CLASS_DECORATORS and program.trusted(callee)):
            problem = f"class '{cls.name}' is decorated with '{ast.unparse(callee)[:40]}'"
            fix = "a decorator is given the class; use only @dataclass, @total_ordering, @unique"
            issues.append(("class-decorator", deco.lineno, problem, fix))
    metaclass = [(k.value, True) for k in cls.keywords if k.arg == "metaclass"]
    for base, is_meta in [*((b, False) for b in cls.bases), *metaclass]:
        while isinstance(base, ast.Subscript | ast.Attribute) and _name(base) not in METACLASSES:
            base = base.value  # Generic[T], abc.ABC
        bound = program.bindings.get(getattr(base, "id", ""), [])
        if _name(base) in METACLASSES and not is_meta:
            problem = f"class '{cls.name}' derives from the metaclass '{_name(base)}'"
            fix = "define ordinary classes; a metaclass gets classes as self"
            issues.append(("metaclass", cls.lineno, problem, fix))
        elif not isinstance(base, ast.Name | ast.Attribute) or any(
            not isinstance(b, ast.ClassDef | ast.alias) for b in bound
        ):
            problem = f"class '{cls.name}' has a computed or assigned base or metaclass"
            fix = "name a class statement or an imported class, such as object or abc.ABC"
            issues.append(("dynamic-base", cls.lineno, problem, fix))
    if cls.name in program.enums:
        for inner in (s for s in cls.body if isinstance(s, ast.ClassDef)):
            problem = f"the class '{inner.name}' defined in an Enum body is a member value"
            issues.append(("class-value", inner.lineno, problem, "define it at top level"))
    own = {m.name for m in cls.body if isinstance(m, _FUNCTIONS)}
    own = {n for n in own if n in program.methods}
    decorators = [d.func if isinstance(d, ast.Call) else d for d in cls.decorator_list]
    fields = any(_name(d) == "dataclass" and program.trusted(d) for d in decorators)
    for node in _class_scope(cls):
        if isinstance(node, ast.AnnAssign) and fields and not program.future_annotations:
            for sub in ast.walk(node.annotation):
                named = _name(sub) if isinstance(sub, ast.Name | ast.Attribute) else ""
                if isinstance(sub, ast.expr) and named in program.classes | {"type", "Type"}:
                    problem = f"dataclass field annotation names '{named}', evaluated into a value"
                    fix = "add 'from __future__ import annotations' or quote the annotation"
                    issues.append(("annotation-class", sub.lineno, problem, fix))
        if isinstance(node, ast.Name) and node.id in own and isinstance(node.ctx, ast.Load):
            parent = program.parent.get(id(node))
            accessor = isinstance(parent, ast.Attribute) and parent.attr in _ACCESSORS
            decorators = [d for f in cls.body for d in getattr(f, "decorator_list", ())]
            if not (accessor and any(parent is d for d in decorators)):
                problem = f"'{node.id}' in its own class body is the plain function"
                issues.append(("unbound-method", node.lineno, problem, _UNBOUND_FIX))
    return issues


def _super_issues(program: _Program, node: ast.Name) -> list[Issue]:
    call = program.parent.get(id(node))
    fix = "write super().method(...) or super(ThisClass, self).method(...) in a method"
    if not (isinstance(call, ast.Call) and call.func is node):
        return [("super-call", node.lineno, "'super' is used as a value", fix)]
    receiver = isinstance(program.parent.get(id(call)), ast.Attribute)
    fn = program._enclosing_def(call)
    in_method = program.kinds.get(id(fn)) in ("instance", "class")
    own_first = len(call.args) == 2 and id(call.args[1]) in program.selves
    if not receiver or call.keywords or not ((not call.args and in_method) or own_first):
        problem = "'super' is called other than as super().attr in a method"
        return [("super-call", node.lineno, problem, fix)]
    return []


def _call_issues(node: ast.Call) -> list[Issue]:
    callee, keywords = _name(node.func), {k.arg for k in node.keywords}
    if callee == "wraps" and (len(node.args) != 1 or node.keywords):
        problem = "'wraps' with assigned/updated copies attributes by name"
        fix = "use @functools.wraps(function) with the function alone"
        return [("attribute-by-name", node.lineno, problem, fix)]
    if (callee in ENUM_TYPES and (len(node.args) > 1 or "names" in keywords)) or (
        callee in METACLASSES - {"type"}  # ABCMeta(name, bases, namespace)
    ):
        problem = f"'{callee}(...)' creates a class at run time"
        return [("dynamic-type", node.lineno, problem, "define classes with a class statement")]
    return []
