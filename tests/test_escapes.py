"""The classes of escapes that passed tier 1 (or the state codec) in red-team exercises: for
each, the smallest program that shows it, refused now with a rule id and a line.

1. annotations evaluated by ``typing.get_type_hints``; 2. attributes got or set by a name given
as data to a library helper, with dunder hooks (``__getattr__``, ``__reduce__``); 3. another
object smuggled in as ``self`` through ``Class.method(obj)``; 4. the memory-state codec, fed
hostile bytes or a program state naming a dotted path; 5. public library entry points that run
test runners, import modules or open paths (checked against a fresh survey of the allowed
modules, ``tests/surface_survey.py``).

Then the same end as 3 by receivers its rule did not see (``sandbox.objects``), which reached
``typing._eval_type`` with the real builtins: 6. a method reached as a plain function (inside
its class body, through a decorator, a classmethod's first parameter or ``super()`` there, a
library hook calling it through the class, a dataclass's generated ``__init__``); 7. a class
carried as a value past the class rules (returned ``cls``, calls and comparisons that hand it
back or to program code, ``type``, generic aliases, nested classes, field factories and
annotations, singledispatch registries, class decorators, metaclasses); 8. ``self`` bound by
something other than a call on an instance (an import, a nested parameter, a pattern).
"""

from __future__ import annotations

import builtins
import io
import json
import pickle
import textwrap
from dataclasses import make_dataclass
from typing import Any

import numpy as np
import pytest
from conftest import MINIMAL
from surface_survey import survey

from contract.program import load_program
from contract.records import field_specs
from contract.state import MAX_STATE_BYTES, StateError, dump_state, load_state
from contract.types import ContractError
from sandbox import static
from sandbox.static import REVIEWED_MEMBERS, Finding, check_source


def program(head: str = "", tail: str = "", unit: str = "") -> str:
    """MINIMAL with ``head`` before it, ``unit`` lines in MemoryUnit and ``tail`` after it."""
    source = MINIMAL.replace("    content: str\n", "    content: str\n" + unit, 1)
    return textwrap.dedent(head) + source + textwrap.dedent(tail)


def line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def findings(source: str, rule: str) -> list[Finding]:
    return [f for f in check_source(source) if f.rule == rule]


def test_base_program_passes() -> None:
    assert check_source(program()) == []


# -- 1. annotation evaluation -----------------------------------------------------------------

# Each fragment is harmless alone (no whole dunder, does not parse); get_type_hints evaluated
# their sum, a dunder chain, with the program's namespace.
SUMMED_ANNOTATION = '    extra: "int if (1).__cla" + "ss__ else int" = 0\n'


def test_summed_annotation_is_refused() -> None:
    source = program(unit=SUMMED_ANNOTATION)
    found, line = findings(source, "annotation-shape"), line_of(source, "extra:")
    assert [f.line for f in found] == [line]
    assert f"is not a plain type (line {line})" in found[0].message


@pytest.mark.parametrize(
    "annotation",
    ["X + Y", "f()", "'str' if True else int", "[str][0]", "'open(0)'", "lambda: str", "x[0]()"],
)
def test_computed_annotations_are_refused(annotation: str) -> None:
    source = program(head="X = Y = None\n\n", unit=f"    extra: {annotation} = 0\n")
    assert findings(source, "annotation-shape"), annotation


@pytest.mark.parametrize(
    "annotation",
    ["str | None", "list[str]", "Optional[str]", "typing.Optional[str]", "'Fact'",
     "dict[tuple[int, int], str]", "Callable[[int], str]", "Literal['a b', 1]", "tuple[int, ...]",
     "'list[\"str\"] | None'"],
)  # fmt: skip
def test_plain_annotations_pass(annotation: str) -> None:
    head = "import typing\nfrom typing import Callable, Literal, Optional\n\n"
    assert (
        findings(program(head=head, unit=f"    extra: {annotation} = None\n"), "annotation-shape")
        == []
    )


def test_field_types_are_resolved_without_evaluating_the_annotation() -> None:
    evaluated: list[int] = []
    namespace = {"SIDE": evaluated, "__name__": "prog"}
    unit = make_dataclass("MemoryUnit", [("content", "SIDE.append(1) or str")])
    with pytest.raises(ContractError, match="unsupported type"):
        field_specs(unit, namespace)
    assert evaluated == []  # typing.get_type_hints appended here, and answered str


def test_evaluated_annotations_are_classified_by_identity() -> None:
    unit = make_dataclass("U", [("a", str), ("b", list[str] | None), ("c", float), ("d", dict)])
    with pytest.raises(ContractError, match="U.d: unsupported type"):
        field_specs(unit, {})
    specs = field_specs(make_dataclass("U", [("a", str), ("b", list[str] | None)]), {})
    assert [(s.kind, s.optional) for s in specs] == [("string", False), ("string_list", True)]


def test_the_resolver_reads_names_by_exact_text_only() -> None:
    namespace = {"__name__": "prog", "Text": "str", "Alias": str}
    unit = make_dataclass("U", [("a", "Text"), ("b", "Alias | None")])
    with pytest.raises(ContractError, match="U.a: unsupported type"):
        field_specs(unit, namespace)  # a string bound to a name is not read as a type
    unit = make_dataclass("U", [("b", "Alias | None"), ("c", "typing.List[Alias]")])
    import typing

    specs = field_specs(unit, {**namespace, "typing": typing})
    assert [(s.kind, s.optional) for s in specs] == [("string", True), ("string_list", False)]


# -- 2. attributes by a computed name, with dunder hooks -------------------------------------

GETATTR_SINK = """
import functools
import textwrap

G = "_" * 2 + "globals" + "_" * 2


class Sink:
    def __init__(self):
        self.got = {}

    def __getattr__(self, name):
        return self.got


def grab():
    sink = Sink()
    functools.update_wrapper(sink, textwrap.dedent, assigned=(), updated=(G,))
    return sink.got
"""


def test_getattr_hook_with_update_wrapper_is_refused() -> None:
    source = program(tail=GETATTR_SINK)
    assert [f.line for f in findings(source, "dunder-method")] == [line_of(source, "__getattr__")]
    update = line_of(source, "update_wrapper")
    assert [f.line for f in findings(source, "forbidden-attribute")] == [update]


@pytest.mark.parametrize(
    "method",
    ["__getattr__", "__getattribute__", "__reduce__", "__reduce_ex__", "__getstate__",
     "__setstate__", "__copy__", "__deepcopy__", "__set_name__", "__init_subclass__",
     "__class_getitem__", "__del__", "__format__", "__index__", "__fspath__", "__array_ufunc__",
     "__get__", "__new__", "__setattr__", "__dir__"],
)  # fmt: skip
def test_hook_methods_are_refused(method: str) -> None:
    tail = f"\n\nclass Box:\n    def {method}(self, *args):\n        return None\n"
    found = findings(program(tail=tail), "dunder-method")
    assert len(found) == 1 and f"'{method}'" in found[0].message


def test_usual_dunder_methods_pass() -> None:
    methods = "init repr eq hash lt len iter getitem contains bool call enter exit".split()
    methods = [f"__{m}__" for m in methods]
    body = "".join(f"    def {m}(self, *args):\n        return 0\n\n" for m in methods)
    assert check_source(program(tail=f"\n\nclass Box:\n{body}")) == []


@pytest.mark.parametrize(
    ("snippet", "rule"),
    [
        ("import functools\n\ndef f(g):\n    return functools.wraps(g, assigned=('x',))\n",
         "attribute-by-name"),
        ("from functools import wraps\n\ndef f(g, h):\n    return wraps(g, h)\n",
         "attribute-by-name"),
        ("from functools import update_wrapper\n", "import-not-allowed"),
        ("import enum\n\nE = enum.Enum('E', ['a', 'b'])\n", "dynamic-type"),
        ("import typing\n\n@typing.no_type_check\ndef f():\n    pass\n", "forbidden-attribute"),
    ],
)  # fmt: skip
def test_attribute_by_name_helpers_are_refused(snippet: str, rule: str) -> None:
    assert findings(program(tail="\n\n" + snippet), rule), snippet


def test_wraps_with_the_function_alone_passes() -> None:
    tail = "\n\nimport functools\n\n\ndef deco(fn):\n    @functools.wraps(fn)\n"
    tail += "    def inner(*a):\n        return fn(*a)\n\n    return inner\n"
    assert check_source(program(tail=tail)) == []


# -- 3. another object as self ----------------------------------------------------------------

PEEK = """
from numpy import lib


class Peek:
    def datasource(self):
        return self._datasource

    def openers(self):
        return self._file_openers


def opener():
    return Peek.openers(Peek.datasource(lib))[None]
"""


def test_class_method_called_with_a_foreign_self_is_refused() -> None:
    source = program(tail=PEEK)
    found = findings(source, "unbound-method")
    assert {f.line for f in found} == {line_of(source, "Peek.openers(")} and len(found) == 2


@pytest.mark.parametrize(
    ("snippet", "rule"),
    [
        ("P = Peek\n\ndef f(x):\n    return P.datasource(x)\n", "class-value"),
        ("def f(x):\n    return [Peek][0]\n", "class-value"),
        ("def f(x):\n    return type(Peek()).datasource(x)\n", "unbound-method"),
        ("def f(x):\n    t = type(x)\n    return t\n", "class-value"),
        ("class Sub(Peek):\n    @classmethod\n    def f(cls, x):\n        return cls.openers(x)\n",
         "unbound-method"),
        ("class S:\n    @staticmethod\n    def f(self):\n        return self._datasource\n",
         "private-attribute"),
    ],
)  # fmt: skip
def test_routes_to_a_class_method_are_refused(snippet: str, rule: str) -> None:
    tail = PEEK.replace(
        "\n\ndef opener():\n    return Peek.openers(Peek.datasource(lib))[None]\n", ""
    )
    assert findings(program(tail=tail + "\n\n" + snippet), rule), snippet


def test_instances_super_static_and_class_methods_pass() -> None:
    tail = """

class Base:
    LIMIT = 3

    def __init__(self, n):
        self._n = n

    def size(self):
        return self._n

    @staticmethod
    def helper(x):
        return x + Base.LIMIT

    @classmethod
    def make(cls, n):
        return cls(n)


class Child(Base):
    def __init__(self, n):
        super().__init__(n)

    def size(self):
        return super().size() + Base.helper(1) + Child.make(2).size()


def build(items):
    if isinstance(items, (Base, Child)) or type(items) is Base:
        return Child(len(items))
    return Base.make(0)


class Kind(enum.Enum):
    A = 1


class Late(Base):
    def __init__(self, n):
        super(Late, self).__init__(n)


def kinds():
    names = [f.name for f in dataclasses.fields(MemoryUnit)]
    return [k.name for k in Kind] + [Kind["A"].name] + names + list(Kind)
"""
    assert check_source(program(head="import dataclasses\nimport enum\n\n", tail=tail)) == []


# -- 4. the memory-state codec ----------------------------------------------------------------


class _Marker:
    pass


def _blob_with_persistent_id(pid: Any) -> bytes:
    marker = _Marker()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return pid if obj is marker else None

    buf = io.BytesIO()
    Pickler(buf, protocol=5).dump({"x": marker})
    return buf.getvalue()


def _stack_global_blob(module: str, name: str) -> bytes:
    """{'s': <module.name>} as a hand-written protocol-4 pickle (what an escaped host stores)."""

    def text(s: str) -> bytes:
        return pickle.SHORT_BINUNICODE + bytes([len(s)]) + s.encode()

    body = text("s") + text(module) + text(name) + pickle.STACK_GLOBAL + pickle.SETITEM
    return pickle.PROTO + b"\x04" + pickle.EMPTY_DICT + body + pickle.STOP


class _Memory:
    pass


def test_hostile_program_path_in_a_stored_state_is_refused() -> None:
    blob = _blob_with_persistent_id(("program", "json.dumps.__globals__"))
    with pytest.raises(StateError, match="not a top-level class or function") as info:
        load_state(_Memory, blob, {"json": json, "__name__": "prog"}, None)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("module", "name"),
    [("collections", "_sys"), ("collections", "OrderedDict.__init__"),
     ("copyreg", "_reconstructor"), ("_codecs", "encode"), ("numpy", "load"),
     ("builtins", "getattr"), ("datetime", "sys")],
)  # fmt: skip
def test_hostile_globals_in_a_stored_state_are_refused(module: str, name: str) -> None:
    with pytest.raises(StateError, match="not allowed"):
        load_state(_Memory, _stack_global_blob(module, name), {}, None)


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage", b"\x80\x05N.", pickle.dumps(["not", "a", "dict"]), pickle.dumps({1: 2}),
     b"\x80\x05(" * 100_000],
)  # fmt: skip
def test_damaged_states_fail_with_one_line(data: bytes) -> None:
    with pytest.raises(StateError, match="^memory state cannot be restored") as info:
        load_state(_Memory, data, {}, None)
    assert "\n" not in str(info.value)


def test_oversized_state_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("contract.state.MAX_STATE_BYTES", 10)
    with pytest.raises(StateError, match="at most"):
        load_state(_Memory, pickle.dumps({"a": "x" * 20}), {}, None)
    assert MAX_STATE_BYTES >= 1 << 20


STATE_TAIL = """

class Node:
    def __init__(self, unit):
        self.unit = unit


def score(x):
    return x
"""


def test_program_state_naming_a_method_or_import_is_refused_at_dump() -> None:
    loaded = load_program(program(head="import numpy as np\n\n", tail=STATE_TAIL), "<p>")
    memory = loaded.get("Memory")(None)
    name = loaded.module.__name__
    memory.fn = loaded.get("Memory").index  # qualname 'Memory.index': not a plain name
    with pytest.raises(pickle.PicklingError, match="Memory.index"):
        dump_state(memory, name, None)
    memory.fn = np.load  # a library function outside the exact allow-list
    with pytest.raises(pickle.PicklingError, match="not allowed"):
        dump_state(memory, name, None)
    memory.fn = builtins.open
    with pytest.raises(pickle.PicklingError, match="not allowed"):
        dump_state(memory, name, None)
    memory.fn = loaded.get("score")
    memory.nodes = [loaded.get("Node")(1)]
    restored = load_state(
        loaded.get("Memory"), dump_state(memory, name, None), vars(loaded.module), None
    )
    assert restored.fn is loaded.get("score") and type(restored.nodes[0]) is loaded.get("Node")


def test_a_program_reference_must_be_defined_by_the_program() -> None:
    loaded = load_program(program(tail=STATE_TAIL), "<p>")
    namespace = dict(vars(loaded.module), dataclass=np.load)  # an imported name, rebound
    for pid in [("program", "dataclass"), ("program", "__builtins__"), ("program", "np.load")]:
        with pytest.raises(StateError):
            load_state(loaded.get("Memory"), _blob_with_persistent_id(pid), namespace, None)


# -- 5. public library entry points that run tools or open paths ------------------------------


def test_test_runner_entry_point_is_refused() -> None:
    tail = "\n\nimport numpy as np\n\n\ndef run():\n    return np.test(extra_argv=['-p', 'x'])\n"
    source = program(tail=tail)
    assert [f.line for f in findings(source, "forbidden-attribute")] == [line_of(source, "np.test")]


@pytest.mark.parametrize(
    "snippet",
    ["import numpy.conftest\n", "import json.tool\n", "import numpy.tests\n",
     "from numpy import info\n", "import numpy as np\n\nX = np.info\n",
     "from numpy.lib import add_newdoc\n", "import bm25s\n\nT = bm25s.tqdm\n"],
)  # fmt: skip
def test_tool_and_import_entry_points_are_refused(snippet: str) -> None:
    assert check_source(program(tail="\n\n" + snippet)), snippet


def _refused(module: str, chain: str) -> bool:
    probe = f"\n\ndef probe():\n    return {module}.{chain}\n"
    return bool(check_source(f"import {module}\n" + program(tail=probe)))


def test_every_surveyed_opener_runner_and_attribute_helper_is_refused_or_reviewed() -> None:
    """A fresh survey of the allowed modules: each flagged callable is refused by tier 1 or
    reviewed (sandbox.static.REVIEWED_MEMBERS); allowing a module with a file opener, or a
    library upgrade adding one, fails here until it is decided."""
    flagged = survey()
    assert len(flagged) > 100  # numpy's loaders, bm25s's savers, numpy.test, ... are found
    paths = {f.path for f in flagged}
    for expected in ("numpy.test", "numpy.load", "bm25s.BM25.save", "functools.update_wrapper"):
        assert expected in paths, expected
    open_ = [f"{f.path} ({', '.join(sorted(f.reasons))})" for f in flagged
             if f.path not in REVIEWED_MEMBERS and not _refused(f.module, f.chain)]  # fmt: skip
    assert open_ == [], f"flagged callables tier 1 allows: {open_}"
    assert set(REVIEWED_MEMBERS) <= paths, "a reviewed member is no longer flagged: drop it"


def test_the_survey_fails_when_a_module_with_file_openers_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    added = frozenset({"gzip", "zipfile", "shelve"})
    monkeypatch.setattr("sandbox.static.ALLOWED_IMPORTS", static.ALLOWED_IMPORTS | added)
    flagged = survey(added)
    open_ = {f.path for f in flagged if not _refused(f.module, f.chain)} - set(REVIEWED_MEMBERS)
    assert {"gzip.GzipFile", "zipfile.ZipFile", "shelve.DbfilenameShelf"} <= open_


# -- 6. a method reached as a plain function --------------------------------------------------

# A program-defined method whose first parameter gets private access, given the typing module
# (exposed by bm25s) as self: ForwardRef evaluation with the real builtins, then os. This ran
# to the end inside the confined host while it passed all four tiers.
EVAL_TYPE = """
from bm25s import tokenization

U = "_" * 2
CODE = U + "import" + U + "('os')"


class Box:
    def run(self, code):
        return self._eval_type(self._type_convert(code), {}, {})

    @classmethod
    def kind(cls):
        return cls


class Sub(Box):
    @classmethod
    def go(cls, module, code):
        return super().run(module, code)


def escape():
    return Box.kind().run(tokenization.typing, CODE) or Sub.go(tokenization.typing, CODE)
"""


def test_foreign_self_reaching_real_builtins_is_refused() -> None:
    source = program(tail=EVAL_TYPE)
    assert {(f.rule, f.line) for f in check_source(source)} == {
        ("class-value", line_of(source, "return cls")),
        ("unbound-method", line_of(source, "return super().run")),
    }


# Each form hands Peek.datasource, or another method reading a private attribute of its self,
# an object that is not an instance of its class (numpy.lib: its _datasource opens files).
FOREIGN = """\
from numpy import lib


class Peek:
    def datasource(self):
        return self._datasource


"""


def refused_at(snippet: str, rule: str, marker: str) -> None:
    source = FOREIGN + textwrap.dedent(snippet)
    found = findings(source, rule)
    assert [f.line for f in found] == [line_of(source, marker)], check_source(source)
    assert f"(line {found[0].line})" in found[0].message and "\n" not in found[0].message


@pytest.mark.parametrize(
    ("snippet", "rule", "marker"),
    [
        # inside its class body a method is the plain function: called, aliased, a default
        ("class P:\n    def ds(self):\n        return self._x\n\n    got = ds(lib)\n",
         "unbound-method", "got ="),
        ("class P:\n    def ds(self):\n        return self._x\n\n    alias = ds\n",
         "unbound-method", "alias ="),
        ("class P:\n    def ds(self):\n        return self._x\n\n"
         "    def use(self, f=ds):\n        return f(lib)\n", "unbound-method", "f=ds"),
        ("class P:\n    @property\n    def ds(self):\n        return self._x\n\n"
         "    g = ds.fget\n", "unbound-method", "g ="),
        # a decorator named like a builtin, or an accessor of something that is not a property
        ("def property(f):\n    return f(lib)\n\n\nclass P:\n    @property\n"
         "    def ds(self):\n        return self._x\n", "rebound-builtin", "    @property"),
        ("def classmethod(f):\n    return f\n\n\nclass P:\n    @classmethod\n"
         "    def ds(cls):\n        return cls._x\n", "rebound-builtin", "    @classmethod"),
        ("def make(d):\n    class P:\n        @d.getter\n        def ds(self):\n"
         "            return self._x\n", "private-attribute", "return self._x"),
        ("class D:\n    def getter(self, f):\n        return f(lib)\n\n\nclass P:\n"
         "    @property\n    def ds(self):\n        return self._x\n\n    ds = D()\n\n"
         "    @ds.getter\n    def ds(self):\n        return self._y\n", "private-attribute",
         "return self._y"),
        # a classmethod's first parameter is the class, whatever its name; so is its super()
        ("class P(Peek):\n    @classmethod\n    def go(klass, x):\n"
         "        return klass.datasource(x)\n", "unbound-method", "klass.datasource"),
        ("class P(Peek):\n    @classmethod\n    def go(cls, x):\n"
         "        return super().datasource(x)\n", "unbound-method", "super()"),
        ("class P(Peek):\n    @classmethod\n    def go(cls, x):\n"
         "        return super(P, cls).datasource(x)\n", "unbound-method", "super(P"),
        # super() takes the first argument of the function it is in; a super object is not kept
        ("class P(Peek):\n    def go(self):\n        def inner(c):\n"
         "            return super().datasource\n        return inner\n",
         "super-call", "super()"),
        ("class P(Peek):\n    def go(self):\n        s = super()\n        return s\n",
         "super-call", "s = super()"),
        ("class P(Peek):\n    def go(self):\n        s = super\n        return s\n",
         "super-call", "s = super"),
        # library hooks call sunder methods through the class: Enum calls _missing_(value)
        ("import enum\n\n\nclass K(enum.Enum):\n    A = 1\n\n    def _missing_(self):\n"
         "        return self._x\n", "private-attribute", "return self._x"),
        # a dataclass's generated __init__ sets its fields on whatever it is given
        ("import dataclasses\n\n\n@dataclasses.dataclass\nclass H:\n    x: int = 0\n\n\n"
         "def f():\n    H.__init__(lib, 1)\n", "unbound-method", "H.__init__"),
    ],
)  # fmt: skip
def test_methods_reached_as_plain_functions_are_refused(
    snippet: str, rule: str, marker: str
) -> None:
    refused_at(snippet, rule, marker)


# -- 7. a class carried as a value past the class rules -----------------------------------------


@pytest.mark.parametrize(
    ("snippet", "rule", "marker"),
    [
        ("class P:\n    @classmethod\n    def me(cls):\n        return cls\n", "class-value",
         "return cls"),
        # calls that hand the class back, or hand it to program code
        ("import collections\n\n\ndef f():\n    return collections.defaultdict(Peek)\n",
         "class-value", "defaultdict"),
        ("class G:\n    def sorted(self, c):\n        return c\n\n\ndef f():\n"
         "    return G().sorted(Peek).datasource(lib)\n", "class-value", "G().sorted"),
        ("def sorted(c):\n    return c\n\n\ndef f():\n    return sorted(Peek).datasource(lib)\n",
         "class-value", "sorted(Peek)"),
        ("def isinstance(a, c):\n    return c\n\n\ndef f():\n"
         "    return isinstance(0, Peek).datasource(lib)\n", "class-value", "isinstance(0"),
        ("class G:\n    def take(self, default_factory):\n        return default_factory\n\n\n"
         "def f():\n    return G().take(default_factory=Peek)\n", "class-value", "G().take"),
        ("def field(default_factory):\n    return default_factory\n\n\ndef f():\n"
         "    return field(default_factory=Peek)\n", "class-value", "return field("),
        # comparisons other than 'is' run the other operand's __eq__, __lt__, __contains__
        ("class G:\n    def __lt__(self, other):\n        return other\n\n\ndef f():\n"
         "    return (G() < Peek).datasource(lib)\n", "class-value", "G() < Peek"),
        ("def f(g):\n    return Peek in g\n", "class-value", "Peek in g"),
        # type itself, a subscripted class (its alias forwards attributes), a nested class
        ("def f():\n    return list(map(type, [Peek()]))[0].datasource(lib)\n", "class-value",
         "map(type"),
        ("T = type\n", "class-value", "T = type"),
        ("def f():\n    for c in (Peek,):\n        return c.datasource(lib)\n", "class-value",
         "(Peek,)"),
        ("def f():\n    return sorted((Peek,))[0].datasource(lib)\n", "class-value",
         "sorted((Peek,))"),
        ("from typing import Generic, TypeVar\n\nT = TypeVar('T')\n\n\nclass P(Generic[T]):\n"
         "    def ds(self):\n        return self._x\n\n\ndef f():\n    return P[int].ds(lib)\n",
         "class-value", "P[int]"),
        ("class P:\n    class Inner(Peek):\n        pass\n\n\ndef f():\n    k = P.Inner\n"
         "    return k.datasource(lib)\n", "class-value", "k = P.Inner"),
        ("class G:\n    def __eq__(self, other):\n        return True\n\n\nclass P:\n"
         "    class Inner:\n        pass\n\n\ndef f():\n    match G():\n        case P.Inner:\n"
         "            return 1\n", "class-value", "case P.Inner"),
        ("import enum\n\n\nclass K(enum.Enum):\n    A = 1\n\n    class Inner(Peek):\n"
         "        pass\n", "class-value", "class Inner"),
        # library data that hands a class back: field factories, annotations, registries
        ("import dataclasses\n\n\n@dataclasses.dataclass\nclass H:\n"
         "    p: object = dataclasses.field(default_factory=Peek)\n\n\ndef f():\n"
         "    return dataclasses.fields(H)[0].default_factory.datasource(lib)\n",
         "forbidden-attribute", "default_factory.datasource"),
        ("import dataclasses\n\n\n@dataclasses.dataclass\nclass H:\n    p: Peek = None\n\n\n"
         "def f():\n    return dataclasses.fields(H)[0].type.datasource(lib)\n",
         "annotation-class", "p: Peek"),
        ("import dataclasses\n\n\n@dataclasses.dataclass\nclass H:\n    p: type = None\n",
         "annotation-class", "p: type"),
        ("import functools\n\n\ndef f():\n    @functools.singledispatch\n    def g(x):\n"
         "        return 0\n\n    @g.register\n    def _(x: Peek):\n        return 1\n\n"
         "    return list(g.registry)[-1].datasource(lib)\n", "forbidden-attribute",
         "g.registry"),
        # a class decorator is given the class; a metaclass's methods are given classes
        ("def deco(c):\n    return c.datasource(lib)\n\n\n@deco\nclass P(Peek):\n    pass\n",
         "class-decorator", "@deco"),
        ("class M(type):\n    def __call__(self):\n        return self\n", "metaclass",
         "class M(type)"),
        ("import abc\n\nM = abc.ABCMeta\n\n\nclass MM(M):\n    pass\n", "dynamic-base",
         "class MM(M)"),
        ("import abc\n\nN = abc.ABCMeta('N', (), {})\n", "dynamic-type", "N = abc"),
    ],
)  # fmt: skip
def test_classes_carried_as_values_are_refused(snippet: str, rule: str, marker: str) -> None:
    refused_at(snippet, rule, marker)


def test_every_library_metaclass_is_refused_as_a_base() -> None:
    """Metaclasses among the public attributes of the allowed modules (a survey, like
    tests/surface_survey.py's): a program class deriving from one is a metaclass."""
    found = []
    for name in sorted(static.ALLOWED_IMPORTS - {"__future__"}):
        module = __import__(name)
        for attr in (a for a in dir(module) if not a.startswith("_")):
            value = getattr(module, attr, None)
            entries = getattr(value, "__mro_entries__", None)
            try:  # what 'class M(value)' would derive from: typing.Type stands for type
                bases = entries((value,)) if callable(entries) else (value,)
            except (TypeError, ValueError):
                bases = ()
            if any(isinstance(b, type) and issubclass(b, type) for b in bases):
                found.append((name, attr))
    assert ("abc", "ABCMeta") in found and ("enum", "EnumType") in found
    for name, attr in found:
        source = f"import {name}\n\n\nclass M({name}.{attr}):\n    pass\n"
        assert findings(source, "metaclass"), f"{name}.{attr}"


# -- 8. self bound by something other than a call on an instance -------------------------------


@pytest.mark.parametrize(
    ("snippet", "rule", "marker"),
    [
        ("class P:\n    def ds(self):\n        from numpy import lib as self\n"
         "        return self._x\n", "rebind-self", "import lib as self"),
        ("class P:\n    def ds(self):\n        def inner(self, /):\n            return self._x\n\n"
         "        return inner(lib)\n", "private-attribute", "return self._x"),
        ("class P:\n    def ds(self):\n        def inner(*, self):\n            return self._x\n\n"
         "        return inner(self=lib)\n", "private-attribute", "return self._x"),
        ("class P:\n    def ds(self):\n        return (lambda self, /: self._x)(lib)\n",
         "private-attribute", "lambda self"),
        ("class P:\n    def ds(self, x):\n        match x:\n            case {**self}:\n"
         "                return self\n", "rebind-self", "case {**self}"),
    ],
)  # fmt: skip
def test_self_bound_otherwise_is_refused(snippet: str, rule: str, marker: str) -> None:
    refused_at(snippet, rule, marker)


def test_instance_forms_of_the_object_model_pass() -> None:
    tail = """

class Shape(abc.ABC):
    @abc.abstractmethod
    def area(self):
        ...


@functools.total_ordering
@dataclasses.dataclass(frozen=True)
class Point:
    x: float = 0.0
    tags: list[str] = dataclasses.field(default_factory=list)

    def __lt__(self, other):
        return self.x < other.x


class Kind(enum.Enum):
    A = 1

    @classmethod
    def _missing_(cls, value):
        return cls.A


class Box(Shape):
    SCALE = 2

    def __init__(self, size):
        self._size = size

    @property
    def size(self):
        return self._size

    @functools.cached_property
    def doubled(self):
        return self._size * self.SCALE

    def area(self):
        return self._size**2

    @classmethod
    def unit(cls):
        return cls(cls.SCALE - 1)

    @staticmethod
    def clamp(x):
        return max(0, x)


class Pair(typing.Generic[T]):
    def first(self):
        return self._first


class IntPair(Pair[int]):
    pass


class Shelf:
    boxes: list[Box]


class Big(Box):
    @classmethod
    def unit(cls):
        return super().unit()

    def area(self):
        return super().area() + super(Big, self).area()


def use(items):
    box = Box.unit()
    same = type(box) is Box or isinstance(box, (Box, Big))
    kinds = [k.name for k in Kind] + [Kind["A"].name, Kind(2).name]
    names = [f.name for f in dataclasses.fields(Point)]
    return same, kinds, names, box.size, box.doubled, Box.clamp(-1), sorted(items, key=len)
"""
    head = "import abc\nimport dataclasses\nimport enum\nimport functools\nimport typing\n\n"
    head += "T = typing.TypeVar('T')\n\n"
    assert check_source(program(head=head, tail=tail)) == []


def test_annotations_naming_classes_pass_when_they_stay_strings() -> None:
    unit = "    parts: list[Part] = None\n    kind: type = None\n"
    head = "from __future__ import annotations\n\n\nclass Part:\n    pass\n\n"
    assert check_source(program(head=head, unit=unit)) == []
    assert findings(program(head=head.split("\n", 3)[-1], unit=unit), "annotation-class")
