"""Sandbox tier 1, a read-only retrieve: ``Memory.retrieve`` must leave the memory as it found it.

Owns :func:`retrieve_mutations`, which returns :data:`sandbox.statefulness.Issue` tuples (rule
``retrieve-mutation``) that :mod:`sandbox.static` turns into findings. Retrievals are cached
per (index state, query plan) (:mod:`evolve.stepcache`), and a stored memory is restored for
every question, so a retrieve whose answer depends on the retrieves before it would be scored
on what a cached or restored run never sees.

What is followed, from ``Memory.retrieve`` (or the one it inherits from a class the program
defines): every method it reaches through ``self.<name>`` (called, passed as a bound method,
or ``super().<name>``), and every function of the program it or they call with an argument
rooted at ``self``, whose parameter is then followed like ``self``. In that code, a name is an
alias of the memory's state when it is bound (assignment, ``:=``, ``for`` and comprehension
targets) to an expression rooted at ``self`` or another alias: ``c = self.cache``,
``x = self.d.get(k)``, ``for x in self.items``, ``for k, v in enumerate(self.items)``.

Rejected there: assignment, augmented assignment or ``del`` of an attribute or item of
``self`` or an alias (``self.n += 1``, ``self.cache[k] = v``, ``c[k] = v``); a call of a
mutating method (:data:`MUTATORS`) on one (``self.hits.append(q)``, ``x.sort()``); an
in-place function given one first or as ``out=`` (``heapq.heappush(self.heap, x)``); and a
draw from a random generator the class keeps on ``self`` (``self.rng.random()``), which
changes the generator's state.

Invariants: pure, deterministic, iterative; never runs the program. A filter, not a proof: a
method of another class reached through ``self`` (``self.layer.stack()``), a copy whose
elements are changed, and rebinding an alias with ``+=`` are not followed; the smoke tier
(:mod:`sandbox.tiers`) compares the memory's stored state before and after a retrieve.
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
_FIX = (
    "retrieve must leave the memory as it found it (retrievals are cached per index and query): "
    "compute it in index(), or keep it in a local variable of retrieve"
)
_RNG_FIX = (
    "draw from a generator made inside retrieve (random.Random(seed)); one kept on self "
    "changes with every draw"
)


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {getattr(d, "id", getattr(d, "attr", "")) for d in fn.decorator_list}


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
            for cls in self.mro for n in ast.walk(self.classes[cls])
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "id", getattr(n.value.func, "attr", "")) in RNG_CONSTRUCTORS
            for t in n.targets if isinstance(t, ast.Attribute)
        }  # fmt: skip

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

    def method(
        self, name: str, after: str | None = None
    ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The method ``self.<name>`` runs (``super().<name>`` when ``after`` is the class
        whose method asks)."""
        classes = self.mro[self.mro.index(after) + 1 :] if after in self.mro else self.mro
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
            and expr.attr in self.program.rngs
        )

    def _follow(self, call: ast.Call) -> None:
        """Queue what ``call`` runs with the memory's state: a method of self, or a function of
        the program given an alias."""
        func = call.func
        target, bound = None, False
        if isinstance(func, ast.Attribute) and self._on_self(func.value):
            target = self._method(func)
            bound = target is not None and not _decorators(target) & {"staticmethod"}
        elif isinstance(func, ast.Name):
            target = self.local_functions.get(func.id) or self.program.functions.get(func.id)
        if target is None:
            return
        params = _params(target)[1:] if bound else _params(target)
        tainted = {_params(target)[0].arg} if bound and _params(target) else set()
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

    def _on_self(self, expr: ast.expr) -> bool:
        if isinstance(expr, ast.Name):
            return expr.id == self.self_name
        return (  # super().name
            isinstance(expr, ast.Call)
            and getattr(expr.func, "id", None) == "super"
            and self.self_name is not None
        )

    def _method(self, func: ast.Attribute) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        after = self.owner if isinstance(func.value, ast.Call) else None
        method = self.program.method(func.attr, after)
        if method is not None and _decorators(method) & {"classmethod"}:
            return None  # its first parameter is the class: the class-state rule covers it
        return method

    def bound_methods(self) -> None:
        """Queue the methods named as values (``key=self._score``): they run with self."""
        for node in self.nodes:
            if isinstance(node, ast.Attribute) and self._on_self(node.value):
                method = self._method(node)
                if method is not None and not _decorators(method) & {"staticmethod"}:
                    params = _params(method)
                    if params:
                        self.reached.append((method, frozenset({params[0].arg})))


def _shown(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."
