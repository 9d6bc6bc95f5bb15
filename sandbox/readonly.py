"""Sandbox tier 1, a read-only retrieve: ``Memory.retrieve`` must leave the memory as it found it.

Owns :func:`retrieve_mutations`, which returns :data:`sandbox.statefulness.Issue` tuples (rule
``retrieve-mutation``) that :mod:`sandbox.static` turns into findings; which code a call or
syntax runs is :mod:`sandbox.methods`' resolution. Retrievals are cached per (index state,
query plan) (:mod:`evolve.evaluation.stepcache`), and a stored memory is restored for every
question, so a retrieve whose answer depends on the retrieves before it would be scored on what
a cached or restored run never sees.

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
from sandbox.methods import (
    ANY_PROTOCOL,
    ARITH,
    BUILTIN_DUNDERS,
    COMPARE,
    FUNCTIONS,
    ITEMS,
    ITER,
    TEXT,
    TRUTH,
    UNARY,
    Fn,
    ProgramClasses,
    decorators,
    positional,
)
from sandbox.statefulness import IN_PLACE_FUNCTIONS, MUTATING_METHODS, Issue, root_of

MUTATORS: frozenset[str] = MUTATING_METHODS | {
    "__setitem__", "__delitem__", "__iadd__", "__isub__", "__imul__", "__ior__", "__iand__",
}  # fmt: skip
# Calls whose value holds elements of their argument (for-loop targets over them are aliases).
_ELEMENT_VIEWS = frozenset({"enumerate", "zip", "reversed", "iter", "filter", "items", "values"})
_ALIAS_CALLS = frozenset({"get", "setdefault"})  # x.get(k) is an object inside x
_FIX = (
    "retrieve must leave the memory as it found it (retrievals are cached per index and query): "
    "compute it in index(), or keep it in a local variable of retrieve"
)
_RNG_FIX = (
    "draw from a generator made inside retrieve (random.Random(seed)); one kept on self "
    "changes with every draw"
)


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


def retrieve_mutations(tree: ast.Module) -> list[Issue]:
    """Every change ``Memory.retrieve`` (and what it reaches) makes to the memory's state."""
    program = ProgramClasses(tree)
    start = program.method("retrieve")
    if start is None or not positional(start):
        return []
    issues: dict[tuple[int, str], Issue] = {}
    todo = [(start, frozenset({positional(start)[0].arg}))]
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
        program: ProgramClasses,
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
        params = positional(fn)
        plain = owner is not None and not decorators(fn) & {"staticmethod", "classmethod"}
        self.self_name = params[0].arg if plain and params else None
        self.nodes = [n for stmt in fn.body for n in ast.walk(stmt)]
        self.local_functions = {n.name: n for n in self.nodes if isinstance(n, FUNCTIONS)}
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
                kind = decorators(target) & {"staticmethod", "classmethod"}
                if "classmethod" not in kind:  # the class-state rule covers a classmethod
                    self._queue(target, call, bound=not kind, receiver=receiver)
                    resolved = True
            if not resolved and receiver and not self._on_self(func.value):
                self._dunders(func.value, COMPARE)  # a library method of the state: x.index(y)
        elif isinstance(func, ast.Name):
            function = self.local_functions.get(func.id) or self.program.functions.get(func.id)
            if function is not None:
                self._queue(function, call, bound=False, receiver=False)
            elif func.id in self.program.classes:
                for ctor in self.program.constructor(func.id):
                    self._queue(ctor, call, bound=True, receiver=False)
            else:  # a builtin or a library function
                names = BUILTIN_DUNDERS.get(func.id, ANY_PROTOCOL)
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
                self._dunders(arg, ANY_PROTOCOL)

    def _queue(self, target: Fn, call: ast.Call, bound: bool, receiver: bool) -> None:
        """Queue ``target`` with the parameters ``call`` gives an alias (and its ``self`` when
        it is bound to an alias, ``receiver``)."""
        every = positional(target)
        params = every[1:] if bound else every
        tainted = {every[0].arg} if bound and receiver and every else set()
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
                params = positional(method)
                if params:
                    self.reached.append((method, frozenset({params[0].arg})))

    def _implicit(self, node: ast.AST) -> None:
        """The dunder methods syntax calls on an alias (item reads, iteration, ``in``,
        comparisons, arithmetic, truth tests, f-strings, ``with``)."""
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            self._dunders(node.value, ITEMS)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            self._dunders(node.iter, ITER)
        elif isinstance(node, ast.Compare):
            lefts = [node.left, *node.comparators[:-1]]
            for op, left, right in zip(node.ops, lefts, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn):
                    self._dunders(right, ITER | COMPARE | {"__contains__"})
                else:
                    self._dunders(left, COMPARE)
                    self._dunders(right, COMPARE)
        elif isinstance(node, ast.BinOp):
            self._dunders(node.left, ARITH)
            self._dunders(node.right, ARITH)
        elif isinstance(node, ast.UnaryOp):
            self._dunders(node.operand, TRUTH if isinstance(node.op, ast.Not) else UNARY)
        elif isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            self._dunders(node.test, TRUTH)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self._dunders(value, TRUTH)
        elif isinstance(node, ast.FormattedValue):
            self._dunders(node.value, TEXT)
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

    def _method(self, func: ast.Attribute) -> Fn | None:
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
                params = positional(method)
                if params and not decorators(method) & {"staticmethod", "classmethod"}:
                    self.reached.append((method, frozenset({params[0].arg})))


def _arguments(call: ast.Call) -> list[ast.expr]:
    """A call's argument expressions (a ``*x`` or ``**x`` as ``x``)."""
    args = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
    return args + [k.value for k in call.keywords]


def _shown(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."
