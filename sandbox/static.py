"""Sandbox tier 1, static: reject a candidate memory program from its source text alone.

Owns :func:`check_source`: it reads a program (LLM-written, so hostile) with :mod:`ast` and
returns every :class:`Finding`, each a one-line repair hint for the proposing model
(:func:`read_source` returns the tree it parsed too). The rules on
names, attributes, imports and strings are checked here against the lists of
:mod:`sandbox.surface`; the rules on state, the object model, annotations and a read-only
``retrieve`` live in :mod:`sandbox.statefulness`, :mod:`sandbox.objects`,
:mod:`sandbox.annotations` and :mod:`sandbox.readonly`, and are reported here.

Invariants:
- The candidate is never executed, compiled or imported; only ``ast.parse`` runs, and the walk
  is iterative, so hostile nesting cannot crash the checker. Pure and deterministic.
- A filter, not the security boundary: static analysis cannot prove Python safe. It stops the
  known routes and explains them before any model call is spent; containment is the isolated
  worker process (resource limits, hard kill, no network, scratch-only writes).

Rejected, and why:
- Control and bidirectional-format characters anywhere in the source (ESC, BEL, U+202E, ...;
  rule ``control-character``): ``evolve show`` and ``diff`` print a program's source, and such
  a character would steer the operator's terminal or reorder what a reviewer reads.
- Imports outside :data:`ALLOWED_IMPORTS` (numerics, text); relative, star and private imports;
  corners of allowed packages that do I/O or run code (:data:`FORBIDDEN_MODULES`, and any
  submodule with a part named like a forbidden attribute).
- :data:`FORBIDDEN_NAMES` (builtins that run code, do I/O or open scopes) and dunder names but
  ``__name__``, ``__slots__``, ``__all__``.
- Attribute escape hatches: dunders but ``__init__``/``__post_init__`` (for ``super()``) and
  ``__name__``; underscore attributes except on a method's own ``self``/``cls``, the Names
  :func:`sandbox.objects.object_model` returns (allowed modules hide ``os`` and code runners
  there: ``random._os``, ``dataclasses._create_fn``), which may not be rebound, by an
  assignment, a pattern or an ``import ... as self`` either; and
  :data:`FORBIDDEN_ATTRIBUTES` (file loaders/savers, frames, code objects, module handles such
  as ``enum.bltns``). Load/save/dump are allowed on ``json`` when only ``import json`` binds
  it: they work on strings, and nothing here can open a file. A module bound by ``import`` is
  usable only as ``module.attr``, so it cannot be aliased past that or smuggled in as ``self``.
- Strings naming dunders (getattr/format tricks; docstrings are exempt, reachable only through
  the forbidden ``__doc__``); ``.format`` on a non-literal template, or with fields that look
  up ``.attr`` or ``[key]``. Builtin ``format(value, spec)`` does no lookups, so it is allowed.
- Annotations that are not plain types (:mod:`sandbox.annotations`, rule ``annotation-shape``):
  only names, dotted names, subscripts, ``None`` and ``|``, strings parsed by the same rule
  (nothing evaluates them: :mod:`contract.records` resolves field types without ``eval``);
  strings in them are also checked as code, and names assigned a value anywhere
  (``X = "code"; field: X``) may not appear in them.
- The object-model routes of :mod:`sandbox.objects`, which keep a method's ``self`` an
  instance of its class: dunder methods outside an allow-list, methods reached other than
  through an instance (``Cls.method(obj)``, in the class body, through ``super()`` in a
  classmethod), classes used as values (aliases, returns, comparisons, generic aliases, class
  decorators, metaclasses, dataclass field annotations), ``super`` other than as
  ``super().attr`` in a method, ``functools.wraps`` with name lists, functional ``Enum``.
- Library entry points that open paths, run test runners, import modules or get attributes by
  a name given as data, as a fresh survey of the allowed modules finds them
  (``tests/surface_survey.py``; ``tests/test_escapes.py`` checks each is refused here or listed
  in :data:`REVIEWED_MEMBERS` with the reason it is harmless): by attribute name
  (:data:`FORBIDDEN_ATTRIBUTES`: ``test``, ``update_wrapper``, ``add_newdoc``, ``tqdm``,
  ``default_factory``, ...; ``info`` and ``registry`` only on a method's own ``self``,
  :data:`SELF_ONLY_ATTRIBUTES`), and submodules with such a name part (``numpy.testing``,
  ``numpy.conftest``, ``json.tool``).
- Classes made at run time (3-argument ``type``, ``make_dataclass``, functional ``NamedTuple``
  or ``TypedDict``; metaclass calls and computed bases are :mod:`sandbox.objects`').
- Names, attributes or strings naming the evaluation side (``evolve``, ``sandbox``, scorers,
  splits, rubrics, gold labels, evidence ids, benchmark question files, the run store): a
  program uses only what its ``Memory`` is given, never labels, scorers or earlier results.
- State that outlives the call or import that made it (:mod:`sandbox.statefulness`, which
  the step fingerprints rely on): in-place changes at import, and inside functions and
  methods ``global``/``nonlocal``, changes to module-level or class-level objects, mutable
  defaults and the module-global RNGs — a restored memory would not see them.
- A ``retrieve`` that changes the memory (:mod:`sandbox.readonly`): writes to state rooted at
  ``self``, directly, through aliases or in the methods and functions it reaches. Retrievals
  are cached per index state and query.
- A patch equal to its parent up to comments and layout; a module not binding the required
  names at top level (whether they load with the right shapes is for the later tiers).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from string import Formatter

from contract.parsing import parse
from contract.spec import DATACLASSES, INSTRUCTIONS, MEMORY, REQUIRED_NAMES
from sandbox.annotations import annotation_shape, shown
from sandbox.objects import object_model
from sandbox.readonly import retrieve_mutations
from sandbox.statefulness import import_time_mutations, root_of, runtime_state_issues
from sandbox.surface import (
    ALLOWED_DUNDER_ATTRIBUTES,
    ALLOWED_DUNDER_NAMES,
    ALLOWED_DUNDER_STRINGS,
    ALLOWED_IMPORTS,
    CLASS_FACTORIES,
    EVALUATION_NAMES,
    EVALUATION_STRINGS,
    FORBIDDEN_NAMES,
    LOAD_SAVE,
    NAMEDTUPLE_API,
    REVIEWED_MEMBERS,
    SELF_ONLY_ATTRIBUTES,
    TYPE_FACTORIES,
    bad_attribute,
    forbidden_module,
    import_allowed,
)

# The lists and the import rule live in sandbox.surface; these names stay importable from here.
__all__ = [
    "ALLOWED_IMPORTS", "REVIEWED_MEMBERS", "Finding", "check_source", "import_allowed",
    "imported_modules", "read_source",
]  # fmt: skip


@dataclass(frozen=True)
class Finding:
    """One reason to reject a program: a stable rule id, a repair hint for the model, a line."""

    rule: str
    message: str
    line: int | None


_DUNDER = re.compile(r"__\w+__")
_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError)

_NAME_HINTS = {"open": "programs cannot read or write files; keep state in Memory attributes"}
_NAME_HINTS |= dict.fromkeys(("getattr", "setattr", "delattr"), "use obj.field or a dict")
_NAME_HINTS |= dict.fromkeys(("exec", "eval", "compile"), "write the code (re.compile is fine)")
_NAME_HINT = "it runs code, does I/O or exposes interpreter internals; remove it"
_ATTR_HINT = "it gives file, process, introspection or code-execution access; remove it"
_ATTR_HINTS = {  # attributes refused for another reason than _ATTR_HINT's
    "default_factory": "it hands back the class a field was given; call the factory you named",
    "registry": "it hands back the classes registered by annotation; keep your own dict",
    "info": "a library helper of that name imports or opens by name; use another name",
}
_SAVE_HINT = "programs may not load or save files; keep data in Memory (json.loads/dumps is fine)"
_EVAL_HINT = "programs may not touch the scorers, labels, splits or run store; remove it"


def imported_modules(program: str | ast.AST) -> frozenset[str]:
    """The top-level names of every module a program imports, anywhere in it; ``program`` is
    its source (empty when it does not parse: such a program never loads) or its tree."""
    if isinstance(program, str):
        try:
            tree = parse(program)
        except SyntaxError:
            return frozenset()
    else:
        tree = program
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return frozenset(names)


def check_source(source: str, parent_source: str | None = None) -> list[Finding]:
    """Every static finding for ``source``, sorted by line; an empty list means it passes.

    A candidate equal to ``parent_source`` (what it was patched from) up to comments and
    layout is ``unchanged``."""
    return read_source(source, parent_source)[1]


def read_source(
    source: str, parent_source: str | None = None
) -> tuple[ast.Module | None, list[Finding]]:
    """The one parse of ``source`` (None when it is empty or does not parse) and
    :func:`check_source`'s findings on it; the tree is left as parsed (nothing here changes
    it), so the sandbox check reads the imports and fingerprints from it too."""
    if not source.strip():
        fix = f"write a complete memory program defining {', '.join(REQUIRED_NAMES)}"
        return None, [Finding("empty", _say("the program is empty", None, fix), None)]
    try:
        tree = parse(source)
    except SyntaxError as exc:
        fix = "fix it so the file parses as Python 3.11"
        problem = f"syntax error: {exc.msg}"
        return None, [Finding("syntax", _say(problem, exc.lineno, fix), exc.lineno)]
    except _PARSE_ERRORS as exc:
        problem = f"the source cannot be parsed ({type(exc).__name__})"
        fix = "remove null bytes and very deeply nested expressions"
        return None, [Finding("syntax", _say(problem, None, fix), None)]
    findings: list[Finding] = list(_control_characters(source))
    if parent_source is not None and _unchanged(source, tree, parent_source):
        problem = "the program is unchanged from its parent (at most comments or layout differ)"
        fix = "a patched candidate must differ from its parent; make the intended change"
        findings.append(Finding("unchanged", _say(problem, None, fix), None))
    findings += _missing_definitions(tree)
    objects, selves = object_model(tree)
    state = import_time_mutations(tree) + runtime_state_issues(tree) + objects
    state += retrieve_mutations(tree)
    findings += [Finding(r, _say(problem, line, fix), line) for r, line, problem, fix in state]
    findings += _Checker(tree, selves).run()
    return tree, sorted(dict.fromkeys(findings), key=lambda f: (f.line is not None, f.line or 0))


# Characters that steer a terminal or reorder what a reader sees (ESC, BEL, bidi overrides):
# a program's source is printed by `evolve show` and `diff`, so none may appear in it.
_CONTROL = re.compile(
    "[\x00-\x08\x0b\x0d-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)


def _control_characters(source: str) -> Iterator[Finding]:
    """One finding per line holding a control or bidirectional-format character (a carriage
    return only before its line's end: CRLF files are fine)."""
    for number, text in enumerate(source.split("\n"), 1):
        text = text.removesuffix("\r")
        if found := _CONTROL.search(text):
            problem = f"control character U+{ord(found.group()):04X} in the source"
            fix = "remove it; write escapes such as '\\x1b' in strings if you need one"
            yield Finding("control-character", _say(problem, number, fix), number)


def _say(problem: str, line: int | None, fix: str) -> str:
    return f"{problem} (line {line}): {fix}" if line is not None else f"{problem}: {fix}"


def _unchanged(source: str, tree: ast.Module, parent_source: str) -> bool:
    try:
        return source == parent_source or ast.dump(tree) == ast.dump(parse(parent_source))
    except _PARSE_ERRORS:
        return False


def _missing_definitions(tree: ast.Module) -> list[Finding]:
    classes = {stmt.name for stmt in tree.body if isinstance(stmt, ast.ClassDef)}
    targets = [t for stmt in tree.body if isinstance(stmt, ast.Assign) for t in stmt.targets]
    targets += [s.target for s in tree.body if isinstance(s, ast.AnnAssign) and s.value]
    names = {e.id for t in targets for e in getattr(t, "elts", [t]) if isinstance(e, ast.Name)}
    missing = [(n, "a string assignment") for n in INSTRUCTIONS.values() if n not in names]
    classes_needed = (*DATACLASSES.values(), MEMORY)
    missing += [(n, "a class statement") for n in classes_needed if n not in classes]
    return [
        Finding("missing-definition", f"'{n}' is not defined at top level: add {kind}", None)
        for n, kind in missing
    ]


def _bindings(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every (name, node) binding a name other than through an ``ast.Name`` target."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, node
        elif isinstance(node, ast.arg):
            yield node.arg, node
        elif isinstance(node, ast.alias) and node.name != "*":
            yield node.asname or node.name.split(".")[0], node
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            yield node.name, node
        elif isinstance(node, ast.MatchMapping) and node.rest:
            yield node.rest, node


def _format_lookup(template: str, depth: int = 0) -> str | None:
    """The first field that looks up an attribute or item (format specs nest two levels)."""
    try:
        for _, name, spec, _ in Formatter().parse(template):
            if name and ("." in name or "[" in name):
                return name
            if spec and depth < 2 and (nested := _format_lookup(spec, depth + 1)):
                return nested
    except ValueError:
        return "(malformed template)"
    return None


def _assigned_names(nodes: list[ast.AST]) -> set[str]:
    """Names and attributes bound somewhere to a value that may be a string."""
    typed: set[int] = set()  # targets of 'x: T = None', 'T = TypeVar("T")' and the like
    for node in nodes:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            value = node.value
            if (
                value is None
                or (isinstance(value, ast.Constant) and not isinstance(value.value, str | bytes))
                or (isinstance(value, ast.Call) and getattr(value.func, "id", "") in TYPE_FACTORIES)
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                typed.update(id(t) for t in targets)
    stores = [n for n in nodes if isinstance(n, ast.Name | ast.Attribute) and id(n) not in typed]
    names = {
        getattr(n, "id", getattr(n, "attr", "")) for n in stores if type(n.ctx) is not ast.Load
    }
    return names | {n.name for n in nodes if isinstance(n, ast.MatchAs | ast.MatchStar) and n.name}


class _Checker:
    """One pass over a parsed program; :meth:`run` returns its findings, unsorted."""

    def __init__(self, tree: ast.Module, method_selves: set[int]) -> None:
        self.tree = tree
        self.findings: list[Finding] = []
        self.receivers: set[int] = set()  # ids of Names used as 'name.attribute'
        nodes = list(ast.walk(tree))
        scopes = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        self.docstrings = {  # a leading string statement, reachable only through __doc__
            id(n.body[0].value) for n in nodes if isinstance(n, scopes) and n.body
            and isinstance(n.body[0], ast.Expr)
        }  # fmt: skip
        imported = [alias for node in nodes if isinstance(node, ast.Import) for alias in node.names]
        self.modules = {alias.asname or alias.name.split(".")[0] for alias in imported}
        self.import_bound = self.modules | {  # every name an import binds, modules or not
            alias.asname or alias.name
            for node in nodes if isinstance(node, ast.ImportFrom) for alias in node.names
        }  # fmt: skip
        self.method_selves = method_selves  # Names that are a method's own self or cls
        self.assigned = _assigned_names(nodes)
        json_binders = [node for name, node in _bindings(tree) if name == "json"]
        self.json_is_module = "json" not in self.assigned and all(
            any(node is alias and not alias.asname for alias in imported) for node in json_binders
        )

    def run(self) -> list[Finding]:
        for name, node in _bindings(self.tree):
            if not isinstance(node, ast.alias):  # imported names are checked with the import
                self._name(name, node, binding=True)
            elif name in ("self", "cls"):  # 'import numpy.lib as self'
                self._rebound_self(name, node)
        self._dispatch(ast.walk(self.tree))
        return self.findings

    def _dispatch(self, nodes: Iterable[ast.AST]) -> None:
        nodes = list(nodes)
        self.receivers.update(id(n.value) for n in nodes if isinstance(n, ast.Attribute))
        for node in nodes:
            handler = getattr(self, f"_{type(node).__name__}", None)
            if handler is not None:
                handler(node)

    def _add(self, rule: str, node: ast.AST, problem: str, fix: str) -> None:
        line = getattr(node, "lineno", None)
        self.findings.append(Finding(rule, _say(problem, line, fix), line))

    def _Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module(alias.name, node)

    def _ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            fix = "a memory program is one file; define what you need in it"
            self._add("relative-import", node, "relative import is not allowed", fix)
            return
        if not self._module(node.module, node) or node.module == "__future__":
            return
        for alias in node.names:
            path = f"{node.module}.{alias.name}"
            if alias.name == "*":
                problem = f"'from {node.module} import *' is not allowed"
                self._add("star-import", node, problem, "import the names you use explicitly")
            elif (
                forbidden_module(path)
                or bad_attribute(alias.name, node.module == "json")
                or alias.name in SELF_ONLY_ATTRIBUTES
            ):
                fix = _SAVE_HINT if LOAD_SAVE.fullmatch(alias.name) else _ATTR_HINT
                self._add("import-not-allowed", node, f"import of '{path}' is not allowed", fix)

    def _module(self, path: str, node: ast.AST) -> bool:
        """Check one dotted module path; report it and return False when it is not allowed."""
        top = path.split(".")[0]
        if top not in ALLOWED_IMPORTS:
            fix = f"memory programs may import only {', '.join(sorted(ALLOWED_IMPORTS))}; remove it"
            self._add("import-not-allowed", node, f"import of '{top}' is not allowed", fix)
            return False
        if forbidden_module(path):
            fix = f"it is private or gives file, process or code access; use {top}'s public API"
            self._add("import-not-allowed", node, f"import of '{path}' is not allowed", fix)
            return False
        return True

    def _Name(self, node: ast.Name) -> None:
        self._name(node.id, node, binding=False)
        if node.id in ("self", "cls") and isinstance(node.ctx, ast.Store | ast.Del):
            self._rebound_self(node.id, node)
        if node.id in self.modules and id(node) not in self.receivers:
            fix = f"use the module only as '{node.id}.attribute'; do not assign, pass or rebind it"
            self._add("module-value", node, f"module '{node.id}' is used as a value", fix)

    def _name(self, name: str, node: ast.AST, binding: bool) -> None:
        if binding and name in ("self", "cls") and not isinstance(node, ast.arg):
            self._rebound_self(name, node)
        if name in EVALUATION_NAMES:
            self._add("evaluation-access", node, f"'{name}' names evaluation-side code", _EVAL_HINT)
        elif name in FORBIDDEN_NAMES or (
            not binding and _DUNDER.fullmatch(name) and name not in ALLOWED_DUNDER_NAMES
        ):
            fix = _NAME_HINTS.get(name, _NAME_HINT)
            self._add("forbidden-name", node, f"name '{name}' is not allowed", fix)

    def _rebound_self(self, name: str, node: ast.AST) -> None:
        fix = "self and cls must keep naming the method's own object; use another name"
        self._add("rebind-self", node, f"'{name}' is rebound", fix)

    def _Attribute(self, node: ast.Attribute) -> None:
        receiver = node.value.id if isinstance(node.value, ast.Name) else None
        if isinstance(node.ctx, ast.Store | ast.Del):
            root = root_of(node)
            if isinstance(root, ast.Name) and root.id in self.import_bound:
                fix = "imported modules and names are shared with the host's code; leave them alone"
                self._add("module-mutation", node, f"assignment to '{root.id}.{node.attr}'", fix)
        self._attribute(node.attr, node, receiver)
        if node.attr == "format":  # also flags str.format(template, ...): the receiver is 'str'
            self._format(node.value, node)

    def _MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:  # 'case C(attr=x)' reads the subject's attribute 'attr'
            self._attribute(attr, node, None)

    def _attribute(self, attr: str, node: ast.AST, receiver: str | None) -> None:
        on_self = isinstance(node, ast.Attribute) and id(node.value) in self.method_selves
        if attr in EVALUATION_NAMES:
            self._add("evaluation-access", node, f"'{attr}' names evaluation-side code", _EVAL_HINT)
        elif _DUNDER.fullmatch(attr):
            if attr not in ALLOWED_DUNDER_ATTRIBUTES:
                fix = "dunder attributes are escape hatches; use the object's public API"
                self._add("dunder-attribute", node, f"attribute '{attr}' is not allowed", fix)
        elif bad_attribute(attr, receiver == "json" and self.json_is_module):
            fix = _SAVE_HINT if LOAD_SAVE.fullmatch(attr) else _ATTR_HINTS.get(attr, _ATTR_HINT)
            self._add("forbidden-attribute", node, f"attribute '{attr}' is not allowed", fix)
        elif attr in SELF_ONLY_ATTRIBUTES and not on_self:
            fix = _ATTR_HINTS[attr]
            self._add("forbidden-attribute", node, f"attribute '{attr}' is not allowed here", fix)
        elif attr.startswith("_") and not on_self and attr not in NAMEDTUPLE_API:
            fix = "use underscore attributes only on a method's own self or cls"
            self._add("private-attribute", node, f"attribute '{attr}' is not allowed here", fix)

    def _Constant(self, node: ast.Constant) -> None:
        if id(node) in self.docstrings or not isinstance(node.value, str | bytes):
            return
        text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
        dunders = [m for m in _DUNDER.findall(text) if m not in ALLOWED_DUNDER_STRINGS]
        if dunders:
            fix = "strings naming dunders feed getattr and format tricks; remove it"
            self._add("dunder-string", node, f"string containing '{dunders[0]}'", fix)
        marker = next((m for m in EVALUATION_STRINGS if m in text), None)
        if marker:
            self._add("evaluation-access", node, f"string mentioning '{marker}'", _EVAL_HINT)

    def _format(self, template: ast.expr, node: ast.AST) -> None:
        if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
            problem = "'.format' on a template that is not a string literal"
            fix = "call .format directly on a string literal, or use an f-string"
            self._add("dynamic-format", node, problem, fix)
        elif field := _format_lookup(template.value):
            fix = "use plain fields such as {0} or {name} and pass the value itself"
            self._add("format-attribute", node, f"format field '{field}' looks up a value", fix)

    def _annotation(self, annotation: ast.expr | None) -> None:
        """Check an annotation's shape (:func:`_annotation_shape`), then, as code, strings in it
        and names that could hold a string (``X = "code"; field: X``)."""
        if annotation is not None and (bad := annotation_shape(annotation)) is not None:
            problem = f"annotation {shown(bad)} is not a plain type"
            fix = "annotate with names, dotted names, subscripts such as list[str], None and |"
            self._add("annotation-shape", bad, problem, fix)
        for node in ast.walk(annotation) if annotation is not None else ():
            owner = getattr(node, "value", None)
            name = getattr(node, "id", getattr(node, "attr", None))
            if name in self.assigned and getattr(owner, "id", None) not in self.modules:
                fix = "annotate with classes, imported types or TypeVars, not assigned names"
                self._add("annotation-alias", node, f"annotation names assigned '{name}'", fix)
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            try:
                parsed = parse(node.value.strip(), mode="eval")
            except _PARSE_ERRORS:
                continue  # not an expression: typing raises before evaluating anything
            body = ast.increment_lineno(parsed, node.lineno - 1).body
            self._dispatch(ast.walk(body))
            self._annotation(body)

    def _annotated(self, node: ast.AST) -> None:
        self._annotation(getattr(node, "returns", None) or getattr(node, "annotation", None))

    _AnnAssign = _arg = _FunctionDef = _AsyncFunctionDef = _annotated

    def _Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        three_arg_type = isinstance(func, ast.Name) and name == "type" and len(node.args) == 3
        if three_arg_type or name in CLASS_FACTORIES:
            fix = "define classes with a class statement"
            self._add("dynamic-type", node, f"'{name}(...)' creates a class at run time", fix)
