"""Sandbox tier 1, a read-only retrieve: ``Memory.retrieve`` must leave the memory as it found it.

Owns :func:`retrieve_mutations`, which returns :data:`sandbox.statefulness.Issue` tuples (rule
``retrieve-mutation``) that :mod:`sandbox.static` turns into findings. Retrievals are cached
per (index state, query plan) (:mod:`evolve.evaluation.stepcache`), and a stored memory is restored
for
every question, so a retrieve whose answer depends on the retrieves before it would be scored
on what a cached or restored run never sees.

What is followed, from ``Memory.retrieve`` (or the one it inherits from a class the program
defines): every method it reaches through ``self.<name>`` (called, passed as a bound method,
or ``super().<name>``), and every function of the program it or they call with an argument
rooted at ``self``, whose parameter is then followed like ``self``. In that code, a name is an
alias of the memory's state when it is bound (assignment, ``:=``, ``for`` and comprehension
targets) to an expression rooted at ``self`` or another alias: ``c = self.cache``,
``x = self.d.get(k)``, ``for x in self.items``, ``for k, v in enumerate(self.items)``.

Objects the memory holds may be of any of the program's classes, and which one is not known
here, so a method called on an alias (``self.log.note(q)``, ``c.note(q)``) or named as a value
(``key=self.log.score``) is followed in every program class that defines one of that name,
with its ``self`` as an alias; a method or constructor of the program given an alias
(``box.fill(self.items)``, ``Box(self.items)``) is followed with that parameter as an alias.
So are the dunder methods Python calls for syntax or builtins applied to an alias: item reads
(``__getitem__``, ``__missing__``), iteration (``__iter__``, and ``__next__`` of a class whose
``__iter__`` returns ``self``), ``next()``, ``in``, comparisons, arithmetic, truth tests,
``len``, ``str``/``repr``/f-strings, ``hash``, calls (``__call__``), ``with``; and a call of a
library function or builtin given an alias may call any of them.

Rejected there: assignment, augmented assignment or ``del`` of an attribute or item of
``self`` or an alias (``self.n += 1``, ``self.cache[k] = v``, ``c[k] = v``); a call of a
mutating method (:data:`MUTATORS`) on one (``self.hits.append(q)``, ``x.sort()``); an
in-place function given one first or as ``out=`` (``heapq.heappush(self.heap, x)``); and a
draw from a random generator the class keeps on ``self`` (``self.rng.random()``), which
changes the generator's state.

Invariants: pure, deterministic, iterative; never runs the program. A filter, not a proof: a
method reached by name (``getattr(self.log, name)()``), a function or lambda kept in the state
and called from it, an object made in retrieve that keeps an alias (``Box(self.items).grow()``
or what a method returns), a copy whose elements are changed, and rebinding an alias with
``+=`` are not followed; the smoke tier (:mod:`sandbox.tiers`) compares everything reachable
from the memory before and after retrieves, and the answers to one query before and after
another.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from contract.spec import MEMORY
from sandbox.statefulness import (
    IN_PLACE_FUNCTIONS,
    MUTATING_METHODS,
    RNG_CONSTRUCTORS,
    Issue,
    root_of,
)

MUTATORS: frozenset[str] = MUTATING_METHODS | {
    "__setitem__", "__delitem__", "__iadd__", "__isub__", "__imul__", "__ior__", "__iand__",
}  # fmt: skip
# Calls whose value holds elements of their argument (for-loop targets over them are aliases).
_ELEMENT_VIEWS = frozenset({"enumerate", "zip", "reversed", "iter", "filter", "items", "values"})
_ALIAS_CALLS = frozenset({"get", "setdefault"})  # x.get(k) is an object inside x
_FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef
_Fn = ast.FunctionDef | ast.AsyncFunctionDef
# The dunder methods Python calls on an object for syntax or builtins applied to it.
_ITER = frozenset({"__iter__", "__next__"})  # __next__ only of a class iterating itself
_ITEMS = frozenset({"__getitem__", "__missing__"})
_COMPARE = frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__"})
_TEXT = frozenset({"__str__", "__repr__"})
_TRUTH = frozenset({"__bool__", "__len__"})
_UNARY = frozenset({"__neg__", "__pos__", "__invert__"})
_ARITH = frozenset(
    f"__{op}__"
    for name in "add sub mul truediv floordiv mod pow matmul and or xor".split()
    for op in (name, "r" + name)
)
_BUILTIN_DUNDERS: dict[str, frozenset[str]] = {
    "len": frozenset({"__len__"}), "bool": _TRUTH, "str": _TEXT, "repr": _TEXT,
    "print": _TEXT, "format": _TEXT, "hash": frozenset({"__hash__"}),
    "abs": frozenset({"__abs__"}), "next": frozenset({"__next__"}),
    "reversed": _ITER | {"__reversed__", "__len__", "__getitem__"},
    "sorted": _ITER | _COMPARE, "min": _ITER | _COMPARE, "max": _ITER | _COMPARE,
    "sum": _ITER | _ARITH, "isinstance": frozenset(), "id": frozenset(), "type": frozenset(),
    **dict.fromkeys("iter list tuple set frozenset dict enumerate zip map filter any all".split(),
                    _ITER),
}  # fmt: skip
# What a library function given an alias may call on it (a builtin not listed above too).
_ANY_PROTOCOL = _ITER | _ITEMS | _COMPARE | _TEXT | _TRUTH | _UNARY | _ARITH | {"__contains__"}
_FIX = (
    "retrieve must leave the memory as it found it (retrievals are cached per index and query): "
    "compute it in index(), or keep it in a local variable of retrieve"
)
_RNG_FIX = (
    "draw from a generator made inside retrieve (random.Random(seed)); one kept on self "
    "changes with every draw"
)


def _decorators(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
    out = set()
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        out.add(getattr(d, "id", getattr(d, "attr", "")))
    return out


def _is_name(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    return [*fn.args.posonlyargs, *fn.args.args]


def _names(target: ast.AST) -> Iterator[str]:
    """The plain names a binding target binds (``a``, ``a, (b, *c)``)."""
    todo = [target]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Tuple | ast.List):
            todo.extend(node.elts)
        elif isinstance(node, ast.Starred):
            todo.append(node.value)


def _targets(node: ast.AST) -> list[ast.expr]:
    """The attribute and item targets an assignment, augmented assignment or ``del`` stores."""
    if isinstance(node, ast.Assign | ast.Delete):
        raw = list(node.targets)
    elif isinstance(node, ast.AugAssign) or (isinstance(node, ast.AnnAssign) and node.value):
        raw = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    while raw:
        target = raw.pop()
        if isinstance(target, ast.Tuple | ast.List):
            raw.extend(target.elts)
        elif isinstance(target, ast.Starred):
            raw.append(target.value)
        elif isinstance(target, ast.Attribute | ast.Subscript):
            out.append(target)
    return out


class _Program:
    """The program's top-level classes and functions, and how ``self.<name>`` resolves."""

    def __init__(self, tree: ast.Module) -> None:
        self.classes = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
        self.functions = {s.name: s for s in tree.body if isinstance(s, _FUNCTIONS)}
        self.owner: dict[int, str] = {}  # id(method) -> the class defining it
        for cls in self.classes.values():
            for item in cls.body:
                if isinstance(item, _FUNCTIONS):
                    self.owner[id(item)] = cls.name
        self.mro = self._mro(MEMORY)
        self.rngs = {  # attributes of self bound to a random generator anywhere in the classes
            t.attr
            for cls in self.classes.values() for n in ast.walk(cls)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "id", getattr(n.value.func, "attr", "")) in RNG_CONSTRUCTORS
            for t in n.targets if isinstance(t, ast.Attribute)
        }  # fmt: skip
        self.methods: dict[str, list[_Fn]] = {}  # name -> the methods of that name, any class
        for cls in self.classes.values():
            for item in cls.body:
                if isinstance(item, _FUNCTIONS):
                    self.methods.setdefault(item.name, []).append(item)
        self.next_of_self_iterators: list[_Fn] = []  # __next__ of classes iterating themselves
        for it in self.methods.get("__iter__", []):
            if any(_is_name(n.value, _params(it)[0].arg if _params(it) else "")
                   for n in ast.walk(it) if isinstance(n, ast.Return)):  # fmt: skip
                self.next_of_self_iterators += [
                    fn for fn in self.methods.get("__next__", [])
                    if self.owner[id(fn)] == self.owner[id(it)]
                ]  # fmt: skip

    def dunders(self, names: frozenset[str], iterating: bool = False) -> list[_Fn]:
        """The program's methods Python may call for ``names`` (see the module docstring)."""
        found = [fn for name in sorted(names - {"__next__"}) for fn in self.methods.get(name, [])]
        if "__next__" in names:
            found += self.next_of_self_iterators if iterating else self.methods.get("__next__", [])
        return found

    def constructor(self, name: str) -> list[_Fn]:
        """What calling the program's class ``name`` runs of its code: ``__init__`` and
        ``__post_init__`` as its classes resolve them."""
        out = []
        for wanted in ("__init__", "__post_init__"):
            for cls in self._mro(name):
                found = [i for i in self.classes[cls].body if isinstance(i, _FUNCTIONS)
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

    def method(self, name: str, owner: str = MEMORY, after: bool = False) -> _Fn | None:
        """The method ``self.<name>`` runs in a method of ``owner`` (``super().<name>`` when
        ``after``)."""
        mro = self.mro if owner == MEMORY else self._mro(owner)
        classes = mro[1:] if after else mro
        for cls in classes:
            for item in self.classes[cls].body:
                if isinstance(item, _FUNCTIONS) and item.name == name:
                    return item
        return None


def retrieve_mutations(tree: ast.Module) -> list[Issue]:
    """Every change ``Memory.retrieve`` (and what it reaches) makes to the memory's state."""
    program = _Program(tree)
    start = program.method("retrieve")
    if start is None or not _params(start):
        return []
    issues: dict[tuple[int, str], Issue] = {}
    todo = [(start, frozenset({_params(start)[0].arg}))]
    seen: set[tuple[int, frozenset[str]]] = set()
    while todo:
        fn, tainted = todo.pop()
        if (id(fn), tainted) in seen:
            continue
        seen.add((id(fn), tainted))
        walk = _Walk(program, fn, tainted, entry=fn is start)
        for issue in walk.issues():
            issues.setdefault((issue[1], issue[2]), issue)
        walk.bound_methods()
        todo += walk.reached
    return sorted(issues.values(), key=lambda i: i[1])


class _Walk:
    """One function, with the names that alias the memory's state on entry (``tainted``)."""

    def __init__(
        self,
        program: _Program,
        fn: ast.FunctionDef | ast.AsyncFunctionDef,
        tainted: frozenset[str],
        entry: bool,
    ) -> None:
        self.program = program
        self.entry = entry
        self.fn = fn
        owner = program.owner.get(id(fn))
        self.owner = owner
        self.where = f"{owner}.{fn.name}" if owner else fn.name
        params = _params(fn)
        plain = owner is not None and not _decorators(fn) & {"staticmethod", "classmethod"}
        self.self_name = params[0].arg if plain and params else None
        self.nodes = [n for stmt in fn.body for n in ast.walk(stmt)]
        self.local_functions = {n.name: n for n in self.nodes if isinstance(n, _FUNCTIONS)}
        self.aliases = set(tainted)
        self.reached: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, frozenset[str]]] = []
        self._bind_aliases()

    def _bind_aliases(self) -> None:
        """Grow :attr:`aliases` to a fixed point over the function's bindings."""
        changed = True
        while changed:
            before = len(self.aliases)
            for node in self.nodes:
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                    if node.value is not None and self.alias(node.value):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        self.aliases.update(n for t in targets for n in _names(t))
                elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                    if self.alias(node.iter) or self._elements(node.iter):
                        self.aliases.update(_names(node.target))
            changed = len(self.aliases) != before

    def alias(self, expr: ast.expr) -> bool:
        """Whether ``expr`` is the memory's state or an object inside it."""
        while True:
            expr = root_of(expr)
            if isinstance(expr, ast.Starred | ast.NamedExpr):
                expr = expr.value
            elif isinstance(expr, ast.IfExp):
                return self.alias(expr.body) or self.alias(expr.orelse)
            elif isinstance(expr, ast.BoolOp):
                return any(self.alias(v) for v in expr.values)
            elif (
                isinstance(expr, ast.Call)
                and isinstance(expr.func, ast.Attribute)
                and expr.func.attr in _ALIAS_CALLS
            ):
                expr = expr.func.value
            else:
                return isinstance(expr, ast.Name) and expr.id in self.aliases

    def _elements(self, expr: ast.expr) -> bool:
        """Whether iterating ``expr`` yields objects inside the memory's state."""
        if not isinstance(expr, ast.Call):
            return False
        func = expr.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name not in _ELEMENT_VIEWS:
            return False
        if isinstance(func, ast.Attribute) and name in ("items", "values"):
            return self.alias(func.value)
        return any(self.alias(a) or self._elements(a) for a in expr.args)

    def issues(self) -> list[Issue]:
        out: list[Issue] = []
        suffix = "" if self.entry else f" ({self.where} is reached from retrieve)"
        for node in self.nodes:
            for target in _targets(node):
                if self.alias(target):
                    kind = "deleted" if isinstance(node, ast.Delete) else "assigned"
                    problem = f"retrieve changes the memory: '{_shown(target)}' is {kind}{suffix}"
                    out.append(("retrieve-mutation", target.lineno, problem, _FIX))
            if isinstance(node, ast.Call):
                out += self._call(node, suffix)
            else:
                self._implicit(node)
        return out

    def _call(self, node: ast.Call, suffix: str) -> list[Issue]:
        func, out = node.func, []
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if isinstance(func, ast.Attribute) and name in MUTATORS and self.alias(func.value):
            problem = f"retrieve changes the memory: '{_shown(func)}()' changes it in place"
            out.append(("retrieve-mutation", node.lineno, problem + suffix, _FIX))
        changed = [node.args[0]] if name in IN_PLACE_FUNCTIONS and node.args else []
        changed += [k.value for k in node.keywords if k.arg == "out"]
        if any(self.alias(arg) for arg in changed):
            problem = f"retrieve changes the memory: '{name}' changes it in place"
            out.append(("retrieve-mutation", node.lineno, problem + suffix, _FIX))
        if isinstance(func, ast.Attribute) and self._kept_rng(func.value):
            problem = f"retrieve changes the memory: '{_shown(func)}()' draws from its generator"
            out.append(("retrieve-mutation", node.lineno, problem + suffix, _RNG_FIX))
        self._follow(node)
        return out

    def _kept_rng(self, expr: ast.expr) -> bool:
        return (
            isinstance(expr, ast.Attribute)
            and isinstance(expr.value, ast.Name)
            and expr.value.id == self.self_name
            and expr.value.id in self.aliases
            and expr.attr in self.program.rngs
        )

    def _follow(self, call: ast.Call) -> None:
        """Queue what ``call`` runs with the memory's state (see the module docstring)."""
        func, resolved = call.func, False
        if isinstance(func, ast.Attribute):
            receiver = self._state(func.value)
            own = self._method(func) if self._on_self(func.value) else None
            targets = [own] if own is not None else self.program.methods.get(func.attr, [])
            for target in targets:
                kind = _decorators(target) & {"staticmethod", "classmethod"}
                if "classmethod" not in kind:  # the class-state rule covers a classmethod
                    self._queue(target, call, bound=not kind, receiver=receiver)
                    resolved = True
            if not resolved and receiver and not self._on_self(func.value):
                self._dunders(func.value, _COMPARE)  # a library method of the state: x.index(y)
        elif isinstance(func, ast.Name):
            function = self.local_functions.get(func.id) or self.program.functions.get(func.id)
            if function is not None:
                self._queue(function, call, bound=False, receiver=False)
            elif func.id in self.program.classes:
                for ctor in self.program.constructor(func.id):
                    self._queue(ctor, call, bound=True, receiver=False)
            else:  # a builtin or a library function
                names = _BUILTIN_DUNDERS.get(func.id, _ANY_PROTOCOL)
                for arg in _arguments(call):
                    self._dunders(arg, names, iterating=func.id != "next")
            resolved = True
        on_self = isinstance(func, ast.Attribute) and self._on_self(func.value)
        called = isinstance(func, ast.Subscript) or (on_self and self._state(func))
        # ^ an object of the state called: self.scorer(q), self.handlers[k](q)
        if not resolved and called:
            self._dunders(func, frozenset({"__call__"}))
        if not resolved and not isinstance(func, ast.Name):  # a library function: np.mean(x)
            for arg in _arguments(call):
                self._dunders(arg, _ANY_PROTOCOL)

    def _queue(self, target: _Fn, call: ast.Call, bound: bool, receiver: bool) -> None:
        """Queue ``target`` with the parameters ``call`` gives an alias (and its ``self`` when
        it is bound to an alias, ``receiver``)."""
        params = _params(target)[1:] if bound else _params(target)
        tainted = {_params(target)[0].arg} if bound and receiver and _params(target) else set()
        everything = {p.arg for p in (*params, *target.args.kwonlyargs)}
        everything |= {a.arg for a in (target.args.vararg, target.args.kwarg) if a}
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred) and self.alias(arg.value):
                tainted |= everything
            elif self.alias(arg):
                if i < len(params):
                    tainted.add(params[i].arg)
                elif target.args.vararg:
                    tainted.add(target.args.vararg.arg)
        for kw in call.keywords:
            if self.alias(kw.value):
                if kw.arg is None:
                    tainted |= everything
                elif kw.arg in everything:
                    tainted.add(kw.arg)
                elif target.args.kwarg:
                    tainted.add(target.args.kwarg.arg)
        if tainted:
            self.reached.append((target, frozenset(tainted)))

    def _dunders(self, expr: ast.expr, names: frozenset[str], iterating: bool = True) -> None:
        """Queue the program's dunder methods ``names`` when ``expr`` is an alias: Python may
        call them on it, with it as ``self``."""
        if self.alias(expr):
            for method in self.program.dunders(names, iterating):
                params = _params(method)
                if params:
                    self.reached.append((method, frozenset({params[0].arg})))

    def _implicit(self, node: ast.AST) -> None:
        """The dunder methods syntax calls on an alias (item reads, iteration, ``in``,
        comparisons, arithmetic, truth tests, f-strings, ``with``)."""
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            self._dunders(node.value, _ITEMS)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            self._dunders(node.iter, _ITER)
        elif isinstance(node, ast.Compare):
            lefts = [node.left, *node.comparators[:-1]]
            for op, left, right in zip(node.ops, lefts, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn):
                    self._dunders(right, _ITER | _COMPARE | {"__contains__"})
                else:
                    self._dunders(left, _COMPARE)
                    self._dunders(right, _COMPARE)
        elif isinstance(node, ast.BinOp):
            self._dunders(node.left, _ARITH)
            self._dunders(node.right, _ARITH)
        elif isinstance(node, ast.UnaryOp):
            self._dunders(node.operand, _TRUTH if isinstance(node.op, ast.Not) else _UNARY)
        elif isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            self._dunders(node.test, _TRUTH)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self._dunders(value, _TRUTH)
        elif isinstance(node, ast.FormattedValue):
            self._dunders(node.value, _TEXT)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self._dunders(item.context_expr, frozenset({"__enter__", "__exit__"}))

    def _state(self, expr: ast.expr) -> bool:
        """Whether ``expr`` is the memory's state: an alias, or ``super()`` of a tainted self."""
        return self.alias(expr) or (self._on_self(expr) and self.self_name in self.aliases)

    def _on_self(self, expr: ast.expr) -> bool:
        if isinstance(expr, ast.Name):
            return expr.id == self.self_name
        return (  # super().name
            isinstance(expr, ast.Call)
            and getattr(expr.func, "id", None) == "super"
            and self.self_name is not None
        )

    def _method(self, func: ast.Attribute) -> _Fn | None:
        """The method ``self.<name>`` (or ``super().<name>``) runs, as the class of the
        function walked resolves it."""
        return self.program.method(
            func.attr, self.owner or MEMORY, after=isinstance(func.value, ast.Call)
        )

    def bound_methods(self) -> None:
        """Queue the methods named as values (``key=self._score``, ``key=self.log.score``):
        they run with the object they were taken from as ``self``."""
        for node in self.nodes:
            if not isinstance(node, ast.Attribute):
                continue
            if not self._state(node.value):
                continue
            own = self._method(node) if self._on_self(node.value) else None
            for method in [own] if own is not None else self.program.methods.get(node.attr, []):
                params = _params(method)
                if params and not _decorators(method) & {"staticmethod", "classmethod"}:
                    self.reached.append((method, frozenset({params[0].arg})))


def _arguments(call: ast.Call) -> list[ast.expr]:
    """A call's argument expressions (a ``*x`` or ``**x`` as ``x``)."""
    args = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
    return args + [k.value for k in call.keywords]


def _shown(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."
