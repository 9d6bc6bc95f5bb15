"""Sandbox tier 1, module state: code whose effect outlives the call that made it.

Owns the part of the static check (:mod:`sandbox.static`) that keeps step reuse sound
(docs/design.md §2). A child program reuses its parent's stored outputs — the pickled ``Memory``
instance, the extracted units — without re-running ``index`` or the extraction hooks in its own
host, so the only state a step may hand to a later one is what it returns or keeps on
``self``. Everything else, module globals, class attributes, a mutable default, the
module-global RNG, is missing (or different) after a restore, and ``retrieve`` would read
what a fresh run would not.

Owns :func:`import_time_nodes` (what runs at import; the step fingerprints of
:mod:`sandbox.fingerprint` use it too), :func:`import_time_mutations` and
:func:`runtime_state_issues`. Both return :data:`Issue` tuples; :mod:`sandbox.static` turns them
into findings.

Rejected at import (module or class-body level), where the fingerprints could not attribute
the change to a component: an attribute or item assignment or ``del`` (``Memory.retrieve = f``,
``CFG["k"] = 9``), and a call of a method of an object the module binds (``CFG.update(k=9)``).

Rejected inside functions and methods (any depth), each with the repair "keep state on self":

- ``global`` and ``nonlocal`` statements (``module-state-rebind``);
- changing a module-level object in place (``module-state-mutation``): attribute or item
  assignment, augmented assignment or ``del`` rooted at a module-level name (``CACHE[k] = v``,
  ``STATE.x = 1``, ``ARR[...] = 0``); a call of a mutating method (:data:`MUTATING_METHODS`) on
  it, also through ``.get(...)``; an in-place function (:data:`IN_PLACE_FUNCTIONS`,
  ``heapq.heappush(HEAP, x)``, ``np.add.at(ARR, i, 1)``) given it first or as ``out=``;
  binding a mutable module-level object to another name or attribute (``self.c = CACHE``);
  a mutable default argument (``def f(x, seen=set())``), which lives as long as the function;
- changing class state (``class-state-mutation``): stores through ``cls`` or ``type(...)``, and
  in-place changes of ``self.N`` where ``N`` is a class-body attribute never assigned on
  ``self`` (pickling the instance drops it);
- reseeding or drawing from the module-global RNGs, ``random.*`` and ``numpy.random.*``
  (``global-rng``); ``random.Random(seed)`` / ``numpy.random.default_rng(seed)`` on ``self``
  is the repair.

Invariants: pure, deterministic and iterative over the parsed tree, like the rest of tier 1.
A filter, not a proof: an object reaching a function as an argument, or aliased through a
container, is not followed; the names a function binds (parameters, assignments) shadow
module names exactly as Python scopes them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

Issue = tuple[str, int, str, str]  # (rule, line, problem, repair)

DEFS = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef
_STORES = ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete
MUTATING_METHODS: frozenset[str] = frozenset(
    "append extend insert pop popitem clear setdefault update remove discard add sort reverse "
    "appendleft extendleft popleft rotate subtract intersection_update difference_update "
    "symmetric_difference_update fill put resize itemset partition byteswap setfield "
    "setflags".split()
)
IN_PLACE_FUNCTIONS: frozenset[str] = frozenset(
    "heappush heappop heapify heappushpop heapreplace insort insort_left insort_right copyto "
    "put place putmask fill_diagonal shuffle at".split()
)
# Calls that build a mutable object: bound at module level, such an object is module state.
MUTABLE_FACTORIES: frozenset[str] = frozenset(
    "list dict set bytearray defaultdict Counter deque OrderedDict array zeros ones empty full "
    "zeros_like ones_like empty_like full_like arange asarray Random default_rng RandomState "
    "Generator".split()
)
_MUTABLE_DISPLAYS = ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp
GLOBAL_RNGS = ("random", "numpy.random")
RNG_CONSTRUCTORS: frozenset[str] = frozenset(
    "Random SystemRandom default_rng Generator RandomState SeedSequence BitGenerator PCG64 "
    "PCG64DXSM MT19937 Philox SFC64".split()
)
_MUTATION_FIX = (
    "bind each module-level name once to a value built without changing other objects (define "
    "methods inside the class statement); do the rest inside Memory.__init__ or a function"
)
_STATE_FIX = (
    "keep state on self (set it in Memory.__init__ or index); a stored memory is restored "
    "without re-running index, so module-level state would be missing"
)
_RNG_FIX = (
    "keep a random.Random(seed) or numpy.random.default_rng(seed) on self and draw from it; "
    "the module-global generator's state does not survive a restored memory"
)


def import_time_nodes(node: ast.AST, annotations: bool = True) -> Iterator[ast.AST]:
    """Every node of a module- or class-level statement that runs when the module is imported.

    Function and lambda bodies do not run; their decorators and defaults do, and so do their
    annotations unless ``annotations`` is False (``from __future__ import annotations``).
    Class bodies run, statement by statement under the same rule. Iterative, like the walk."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        if isinstance(current, DEFS):
            todo += _definition_time(current, annotations)
        else:
            todo.extend(ast.iter_child_nodes(current))


def _definition_time(fn: ast.AST, annotations: bool = True) -> list[ast.AST]:
    """What a ``def`` or ``lambda`` evaluates where it is defined: decorators and defaults, and
    its annotations when ``annotations``."""
    assert isinstance(fn, DEFS)
    out: list[ast.AST] = [*getattr(fn, "decorator_list", ()), *fn.args.defaults]
    out += [d for d in fn.args.kw_defaults if d is not None]
    if annotations and not isinstance(fn, ast.Lambda):
        out += def_annotations(fn)
    return out


def def_annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    """A function's parameter and return annotations."""
    params = _params(fn)
    out = [p.annotation for p in params if p.annotation is not None]
    return out + ([fn.returns] if fn.returns else [])


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return [p for p in params if p is not None]


def root_of(node: ast.expr) -> ast.expr:
    """The object an attribute or item chain starts from (``a`` in ``a.b[0].c``)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _imports(nodes: list[ast.AST]) -> list[ast.alias]:
    return [a for n in nodes if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names]


def import_time_mutations(tree: ast.Module) -> list[Issue]:
    """Import-time code that changes an object in place rather than binding a plain name."""
    nodes = [n for stmt in tree.body for n in import_time_nodes(stmt)]
    own = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    own |= {n.name for n in nodes if isinstance(n, ast.ClassDef | DEFS) and hasattr(n, "name")}
    own -= {a.asname or a.name.split(".")[0] for a in _imports(nodes)}
    out = []
    for node in nodes:
        if isinstance(node, _STORES):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in (t for t in targets if isinstance(t, ast.Attribute | ast.Subscript)):
                root = root_of(target)
                what = f"'{root.id}'" if isinstance(root, ast.Name) else "an object"
                problem = f"module-level assignment to an attribute or item of {what}"
                out.append(("import-time-mutation", node.lineno, problem, _MUTATION_FIX))
        called = [node.func] if isinstance(node, ast.Call) else []  # decorators are called too
        called += getattr(node, "decorator_list", [])
        for func in (f for f in called if isinstance(f, ast.Attribute)):
            root = root_of(func)
            if isinstance(root, ast.Name) and root.id in own:
                problem = f"module-level call of a method of '{root.id}' ('{func.attr}')"
                out.append(("import-time-call", func.lineno, problem, _MUTATION_FIX))
    return out


# --- run time: inside functions and methods ------------------------------------------------


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """The names a function binds in its own scope (parameters, stores, defs, imports)."""
    names = {p.arg for p in _params(fn)}
    todo: list[ast.AST] = list(fn.body) if isinstance(fn.body, list) else [fn.body]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        if isinstance(node, _FUNCTIONS | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, DEFS):
            todo += _definition_time(node)  # its body is its own scope
        else:
            todo.extend(ast.iter_child_nodes(node))
    return names


def function_code(tree: ast.Module) -> Iterator[tuple[ast.AST, frozenset[str]]]:
    """Every node that runs when a function or method is called, with the names that the
    enclosing functions bind (which shadow module-level names there)."""
    todo: list[tuple[ast.AST, frozenset[str] | None]] = [(s, None) for s in tree.body]
    while todo:
        node, shadow = todo.pop()
        if isinstance(node, DEFS):
            inner = (shadow or frozenset()) | _local_names(node)
            todo += [(n, shadow) for n in _definition_time(node)]
            body = node.body if isinstance(node.body, list) else [node.body]
            todo += [(n, inner) for n in body]
            continue
        if shadow is not None:
            yield node, shadow
        todo += [(child, shadow) for child in ast.iter_child_nodes(node)]


def runtime_state_issues(tree: ast.Module) -> list[Issue]:
    """Code in functions and methods that leaves state outside ``self`` and the return value."""
    return _RuntimeState(tree).run()


class _RuntimeState:
    """One pass over :func:`function_code`; :meth:`run` returns its issues."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        top = [n for stmt in tree.body if not isinstance(stmt, ast.ClassDef)
               for n in import_time_nodes(stmt)]  # fmt: skip
        imports = _imports(list(ast.walk(tree)))
        self.modules = {  # local alias -> dotted path, for every import in the program
            a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
            for a in imports
        }
        self.modules |= {
            a.asname or a.name: f"{n.module}.{a.name}"
            for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
            for a in n.names
        }  # fmt: skip
        stores = {n.id for n in top if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        defined = {s.name for s in tree.body if isinstance(s, _FUNCTIONS | ast.ClassDef)}
        self.module_names = (stores | defined) - set(self.modules)
        self.classes = {s.name for s in tree.body if isinstance(s, ast.ClassDef)}
        self.mutable = {
            t.id for n in top if isinstance(n, ast.Assign | ast.AnnAssign)
            and n.value is not None and self._builds_mutable(n.value)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Name)
        }  # fmt: skip
        self.rngs = {
            t.id for n in top if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and self._makes_rng(n.value.func) for t in n.targets if isinstance(t, ast.Name)
        }  # fmt: skip
        self.class_state = _class_state(tree)
        self.issues: list[Issue] = []

    def run(self) -> list[Issue]:
        for node, shadow in function_code(self.tree):
            self._node(node, shadow)
        for fn in (n for n in ast.walk(self.tree) if isinstance(n, DEFS)):
            for default in [*fn.args.defaults, *(d for d in fn.args.kw_defaults if d)]:
                if self._builds_mutable(default):
                    problem = "a mutable default argument keeps its state between calls"
                    self._add("module-state-mutation", default, problem, _STATE_FIX)
        return self.issues

    def _add(self, rule: str, node: ast.AST, problem: str, fix: str = _STATE_FIX) -> None:
        self.issues.append((rule, getattr(node, "lineno", 0), problem, fix))

    def _builds_mutable(self, value: ast.expr) -> bool:
        if isinstance(value, _MUTABLE_DISPLAYS):
            return True
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name in MUTABLE_FACTORIES or name in self.classes

    def _makes_rng(self, func: ast.expr) -> bool:
        path = self._dotted(func, frozenset()) or ""
        return path.rpartition(".")[0] in GLOBAL_RNGS or getattr(func, "id", "") in RNG_CONSTRUCTORS

    def _module_object(self, expr: ast.expr, shadow: frozenset[str]) -> str | None:
        """The module-level name an expression's object belongs to (through attributes, items
        and ``.get(...)``), unless a function binds that name."""
        expr = root_of(expr)
        while (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "get"
        ):
            expr = root_of(expr.func.value)
        if isinstance(expr, ast.Name) and expr.id in self.module_names - shadow:
            return expr.id
        return None

    def _node(self, node: ast.AST, shadow: frozenset[str]) -> None:
        if isinstance(node, ast.Global | ast.Nonlocal):
            kind = "global" if isinstance(node, ast.Global) else "nonlocal"
            problem = f"'{kind} {', '.join(node.names)}' inside a function"
            self._add("module-state-rebind", node, problem)
        elif isinstance(node, ast.Attribute | ast.Subscript):
            if not isinstance(node.ctx, ast.Load):
                self._store(node, shadow)
        elif isinstance(node, ast.Call):
            self._call(node, shadow)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in self.mutable - shadow:
                problem = f"module-level object '{value.id}' is bound to another name"
                fix = f"copy it (list({value.id}), dict({value.id})) or build it in __init__"
                self._add("module-state-mutation", node, problem, fix)

    def _store(self, target: ast.Attribute | ast.Subscript, shadow: frozenset[str]) -> None:
        name = self._module_object(target, shadow)
        if name is not None:
            problem = f"assignment to an attribute or item of module-level '{name}'"
            self._add("module-state-mutation", target, problem)
        elif self._class_object(target.value):
            self._add("class-state-mutation", target, "assignment to class state")

    def _class_object(self, expr: ast.expr) -> bool:
        """Whether ``expr`` is class state or inside it: ``cls``, ``type(...)``, or ``self.N``
        for a class-body attribute ``N`` never assigned on ``self``."""
        root = root_of(expr)
        if isinstance(root, ast.Call):
            return getattr(root.func, "id", None) == "type"
        if not isinstance(root, ast.Name) or root.id not in ("self", "cls"):
            return False
        hop = expr
        while isinstance(hop, ast.Attribute | ast.Subscript) and hop.value is not root:
            hop = hop.value
        first = hop.attr if isinstance(hop, ast.Attribute) else None
        return root.id == "cls" or first in self.class_state

    def _call(self, node: ast.Call, shadow: frozenset[str]) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATING_METHODS:
            if name := self._module_object(func.value, shadow):
                problem = f"'{name}' (module level) is changed in place by '.{func.attr}()'"
                self._add("module-state-mutation", node, problem)
            elif self._class_object(func.value):
                self._add("class-state-mutation", node, f"class state changed by '.{func.attr}()'")
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        changed = [node.args[0]] if name in IN_PLACE_FUNCTIONS and node.args else []
        changed += [k.value for k in node.keywords if k.arg == "out"]
        for arg in changed:
            if owner := self._module_object(arg, shadow):
                problem = f"'{name}' changes module-level '{owner}' in place"
                self._add("module-state-mutation", node, problem)
        path = self._dotted(func, shadow)
        receiver = isinstance(func, ast.Attribute) and self._module_object(func.value, shadow)
        if receiver in self.rngs:
            self._add("global-rng", node, f"module-level generator '{receiver}' is used", _RNG_FIX)
        elif path and self._global_rng(path):
            self._add("global-rng", node, f"'{path}' uses the module-global RNG", _RNG_FIX)

    @staticmethod
    def _global_rng(path: str) -> bool:
        """``random.seed``, ``numpy.random.normal`` and the like: not a generator's constructor."""
        parent, _, last = path.rpartition(".")
        return parent in GLOBAL_RNGS and last not in RNG_CONSTRUCTORS

    def _dotted(self, func: ast.expr, shadow: frozenset[str]) -> str | None:
        """``func`` as a dotted path through an imported module (``numpy.random.seed``)."""
        parts = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id in shadow or func.id not in self.modules:
            return None
        return ".".join([self.modules[func.id], *reversed(parts)])


def _class_state(tree: ast.Module) -> set[str]:
    """Attributes some class body binds to a mutable value that no method assigns on ``self``
    (dataclass fields are instance attributes)."""
    out: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        dataclass = any("dataclass" in ast.dump(d) for d in cls.decorator_list)
        bound = {
            t.id for s in cls.body if isinstance(s, ast.Assign | ast.AnnAssign)
            and s.value is not None and isinstance(s.value, _MUTABLE_DISPLAYS | ast.Call)
            and not (dataclass and isinstance(s, ast.AnnAssign))
            for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
            if isinstance(t, ast.Name)
        }  # fmt: skip
        on_self = {
            n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
            and n.value.id == "self"
        }  # fmt: skip
        out |= bound - on_self
    return out
