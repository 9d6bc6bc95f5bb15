"""Sandbox tier 1 (static): seeds pass; each rule fires with its id and line; hostile snippets
are rejected; ordinary memory-program code is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import MINIMAL

from sandbox.static import ALLOWED_IMPORTS, check_source

SEEDS = sorted((Path(__file__).resolve().parents[1] / "seeds").glob("[!_]*.py"))

BASE = MINIMAL  # snippets are appended after it
BASE_LINES = BASE.count("\n")


def check(snippet: str) -> list[tuple[str, int | None]]:
    """(rule, line within the snippet) of every finding for BASE + snippet."""
    findings = check_source(BASE + snippet)
    return [(f.rule, None if f.line is None else f.line - BASE_LINES) for f in findings]


def rules(snippet: str) -> set[str]:
    return {rule for rule, _ in check(snippet)}


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_seeds_pass(path: Path) -> None:
    assert check_source(path.read_text()) == []


def test_base_program_passes() -> None:
    assert check_source(BASE) == []


# --- one failing example per rule, with its line -------------------------------------------


def test_empty() -> None:
    assert [f.rule for f in check_source("  \n\t\n")] == ["empty"]


def test_syntax_stops_with_the_line() -> None:
    findings = check_source("import os\nx = (\n")
    assert [(f.rule, f.line) for f in findings] == [("syntax", 2)]
    assert "syntax error" in findings[0].message


def test_unchanged_and_comment_only_change() -> None:
    assert [f.rule for f in check_source(BASE, BASE)] == ["unchanged"]
    reformatted = "# a comment\n" + BASE.replace('"Answer."', "'Answer.'") + "\n\n# end\n"
    assert [f.rule for f in check_source(reformatted, BASE)] == ["unchanged"]
    changed = BASE.replace('"Answer."', '"Answer briefly."')
    assert check_source(changed, BASE) == []
    assert check_source(BASE, "def broken(:\n") == []  # an unparsable parent is simply different


def test_missing_definition() -> None:
    source = BASE.replace("class Query:", "class Queries:").replace("ANSWER_INSTRUCTION =", "A =")
    findings = check_source(source)
    assert [(f.rule, f.line) for f in findings] == [("missing-definition", None)] * 2
    assert "ANSWER_INSTRUCTION" in findings[0].message and "Query" in findings[1].message


@pytest.mark.parametrize(
    "snippet, rule, line",
    [
        ("x = 1\nimport os\n", "import-not-allowed", 2),
        ("from . import helpers\n", "relative-import", 1),
        ("from math import *\n", "star-import", 1),
        ("\n\nf = open('notes.txt')\n", "forbidden-name", 3),
        ("x = 1\ny = x.__class__\n", "dunder-attribute", 2),
        ("import random\nr = random._inst\n", "private-attribute", 2),
        ("import numpy as np\nnp.save('x.npy', np.zeros(2))\n", "forbidden-attribute", 2),
        ("import numpy\nxp = numpy\n", "module-value", 2),
        ("name = '__class__'\n", "dunder-string", 1),
        ("gold = 1\n", "evaluation-access", 1),
        ("s = '{0.real}'.format(1)\n", "format-attribute", 1),
        ("t = 'x'\ns = t.upper().format(1)\n", "dynamic-format", 2),
        ("class X(object if True else int):\n    pass\n", "dynamic-base", 1),
        ("X = type('X', (), {})\n", "dynamic-type", 1),
        ("X = 'str'\n\ndef f(a: X):\n    pass\n", "annotation-alias", 3),
        (
            "def chosen(self, query):\n    return ''\n\nMemory.retrieve = chosen\n",
            "import-time-mutation",
            4,
        ),
        ("CFG = {'k': 3}\nZZ = CFG.update(k=9)\n", "import-time-call", 2),
    ],
)
def test_each_rule_reports_its_id_and_line(snippet: str, rule: str, line: int) -> None:
    assert (rule, line) in check(snippet)
    for finding in check_source(BASE + snippet):
        assert "\n" not in finding.message and f"(line {finding.line})" in finding.message


def test_messages_are_one_line_repair_hints_with_the_line() -> None:
    findings = check_source(BASE + "import os\nimport socket\n")
    assert [f.line for f in findings] == [BASE_LINES + 1, BASE_LINES + 2]
    message = findings[0].message
    assert "\n" not in message and f"(line {BASE_LINES + 1})" in message
    assert "'os'" in message and "numpy" in message and "remove it" in message


def test_findings_are_sorted_by_line_with_global_ones_first() -> None:
    source = "import socket\nimport os\n" + BASE.replace("class Memory:", "class Mem:")
    findings = check_source(source, parent_source=source)
    assert [f.rule for f in findings][:2] == ["unchanged", "missing-definition"]
    lines = [f.line for f in findings[2:]]
    assert lines == sorted(lines) == [1, 2]


# --- hostile snippets -----------------------------------------------------------------------

HOSTILE = [
    ("import os", "import-not-allowed"),
    ("import sys", "import-not-allowed"),
    ("import socket", "import-not-allowed"),
    ("import ctypes", "import-not-allowed"),
    ("import pickle", "import-not-allowed"),
    ("import threading", "import-not-allowed"),
    ("import multiprocessing", "import-not-allowed"),
    ("import importlib", "import-not-allowed"),
    ("from subprocess import run", "import-not-allowed"),
    ("import evolve.scoring", "import-not-allowed"),
    ("from sandbox import static", "import-not-allowed"),
    ("import numpy.testing", "import-not-allowed"),
    ("from numpy.testing._private.utils import runstring", "import-not-allowed"),
    ("from numpy.lib import format", "import-not-allowed"),
    ("from numpy import load", "import-not-allowed"),
    ("from numpy import f2py", "import-not-allowed"),
    ("import bm25s.hf", "import-not-allowed"),
    ("from random import _os", "import-not-allowed"),
    ("from operator import attrgetter", "import-not-allowed"),
    ("from typing import get_type_hints", "import-not-allowed"),
    ("from . import x", "relative-import"),
    ("from numpy import *", "star-import"),
    ("__import__('os')", "forbidden-name"),
    ("open('/etc/passwd')", "forbidden-name"),
    ("eval('1')", "forbidden-name"),
    ("exec('x = 1')", "forbidden-name"),
    ("c = compile('1', 'f', 'eval')", "forbidden-name"),
    ("getattr(object, 'mro')", "forbidden-name"),
    ("x = 1\ngetattr(x, '__class__')", "forbidden-name"),
    ("vars(object)", "forbidden-name"),
    ("b = __builtins__['open']", "forbidden-name"),
    ("g = globals()['__builtins__']", "forbidden-name"),
    ("def f(open=None):\n    return open", "forbidden-name"),
    ("def getattr(x):\n    return x", "forbidden-name"),
    ("x = __file__", "forbidden-name"),
    ("().__class__.__bases__[0].__subclasses__()", "dunder-attribute"),
    ("def f():\n    pass\nf.__globals__", "dunder-attribute"),
    ("c = (lambda: 0).__code__", "dunder-attribute"),
    ("e = Exception()\nt = e.__traceback__", "dunder-attribute"),
    ("match 1:\n    case object(__class__=c):\n        pass", "dunder-attribute"),
    ("g = (i for i in [])\nf = g.gi_frame.f_globals", "forbidden-attribute"),
    ("import numpy as np\nnp.load('x', allow_pickle=True)", "forbidden-attribute"),
    ("import numpy as np\nnp.save('x', np.zeros(1))", "forbidden-attribute"),
    ("import numpy as np\na = np.fromfile('x')", "forbidden-attribute"),
    ("import numpy as np\nnp.zeros(1).tofile('x')", "forbidden-attribute"),
    ("import numpy as np\nm = np.memmap('x')", "forbidden-attribute"),
    ("import numpy as np\nnp.testing.assert_equal(1, 1)", "forbidden-attribute"),
    ("import numpy as np\nnp.zeros(1).dump('x')", "forbidden-attribute"),
    ("import bm25s\nbm25s.BM25.load('dir')", "forbidden-attribute"),
    ("import bm25s\nt = bm25s.Path('/etc/passwd').read_text()", "forbidden-attribute"),
    ("import dataclasses\ns = dataclasses.sys", "forbidden-attribute"),
    ("import enum\nenum.bltns.eval('1')", "forbidden-attribute"),
    ("import random\nrandom._os.system('ls')", "forbidden-attribute"),
    ("import operator\nf = operator.attrgetter('x')", "forbidden-attribute"),
    ("import typing\ntyping.get_type_hints(Memory)", "forbidden-attribute"),
    ("x = object.mro()", "forbidden-attribute"),
    ("import dataclasses\nf = dataclasses._create_fn", "private-attribute"),
    ("import numpy as json\njson.load('x.npy')", "forbidden-attribute"),
    ("import json\ndef f(json):\n    return json.load('x')", "forbidden-attribute"),
    (
        "import dataclasses\nclass C:\n    def m(self):\n        pass\nC.m(dataclasses)",
        "module-value",
    ),
    ("import numpy as np\nnp = None", "module-value"),
    ("s = '{0.__class__}'.format(1)", "format-attribute"),
    ("s = '{0.f_globals}'.format(1)", "format-attribute"),
    ("s = '{0[key]}'.format({'key': 1})", "format-attribute"),
    ("s = '{0:{1.real}}'.format(1, 2)", "format-attribute"),
    ("s = str.format('{0.real}', 1)", "dynamic-format"),
    ("t = '{0.' + 'real}'\ns = t.format(1)", "dynamic-format"),
    ("n = '__class__'", "dunder-string"),
    ("ok = hasattr(Memory, '__globals__')", "dunder-string"),
    ("p = '/work/shared/data/beam/probing_questions.json'", "evaluation-access"),
    ("p = 'runs/store.sqlite'", "evaluation-access"),
    ("x = Memory.scoring", "evaluation-access"),
    ("source_chat_ids = []", "evaluation-access"),
    ("class X(type('A', (), {})):\n    pass", "dynamic-base"),
    ("class X(metaclass=type('M', (type,), {})):\n    pass", "dynamic-base"),
    ("X = type('X', (object,), {})", "dynamic-type"),
    (
        "from dataclasses import make_dataclass\nM = make_dataclass('M', [('a', 'int')])",
        "dynamic-type",
    ),
    ("import typing\nN = typing.NamedTuple('N', [('a', 'open(0).read()')])", "dynamic-type"),
    # string annotations are code to typing.get_type_hints (the executor calls it)
    ("@dataclass\nclass Leak:\n    content: \"open('/etc/passwd').read()\"", "forbidden-name"),
    ("def f(x: 'list[\"eval(1)\"]'):\n    pass", "forbidden-name"),
    ("async def f() -> 'open(0).read()':\n    pass", "forbidden-name"),
    (
        "X = \"open('/etc/passwd').read()\"\n@dataclass\nclass Leak:\n    content: X",
        "annotation-alias",
    ),
    ("class Leak:\n    X = 'open(0)'\n    content: list[X]", "annotation-alias"),
    ("class Leak:\n    content: 'Leak.X'\nLeak.X = 'open(0)'", "annotation-alias"),
    # import-time changes the stage fingerprints cannot attribute to a component
    ("def chosen(self, query):\n    return ''\nMemory.retrieve = chosen", "import-time-mutation"),
    ("CFG = {'k': 3}\nCFG['k'] = 9", "import-time-mutation"),
    ("del Memory.index", "import-time-mutation"),
    ("MemoryUnit.weight = 2", "import-time-mutation"),
    ("import decimal\ndecimal.getcontext().prec = 5", "import-time-mutation"),
    ("class K:\n    L = []\n    L[0:0] = [1]", "import-time-mutation"),
    ("CFG = {'k': 3}\nZZ = CFG.update(k=9)", "import-time-call"),
    ("LIST = []\nLIST.append(1)", "import-time-call"),
    ("REG = {'a': []}\nREG['a'].append(1)", "import-time-call"),
    ("LIST = []\ndef f(x=LIST.append(1)):\n    return x", "import-time-call"),
    ("LIST = []\n@LIST.append\ndef f():\n    pass", "import-time-call"),
    ("LIST = []\nclass K:\n    n = LIST.append(1)", "import-time-call"),
    ("x = Memory.register(int)", "import-time-call"),
]


@pytest.mark.parametrize("snippet, rule", HOSTILE, ids=[s for s, _ in HOSTILE])
def test_hostile_snippets_are_rejected(snippet: str, rule: str) -> None:
    assert rule in rules(snippet + "\n")


def test_at_least_25_distinct_hostile_snippets() -> None:
    assert len({s for s, _ in HOSTILE}) >= 25


# --- run-time module state: what a restored memory would not see ---------------------------

INDEX_FILLS_MODULE_DICT = (
    BASE.replace("class Memory:", "SEEN = {}\n\n\nclass Memory:")
    .replace(
        "        self.units.extend(units)\n",
        "        self.units.extend(units)\n        SEEN[segment] = len(units)\n",
    )
    .replace('return "\\n".join(', 'return str(len(SEEN)) + "\\n".join(')
)


def test_index_filling_a_module_dict_that_retrieve_reads_is_rejected() -> None:
    """A child reusing the stored memory never runs index, so SEEN would be empty there."""
    findings = check_source(INDEX_FILLS_MODULE_DICT)
    assert [f.rule for f in findings] == ["module-state-mutation"]
    line = INDEX_FILLS_MODULE_DICT.splitlines().index("        SEEN[segment] = len(units)") + 1
    assert findings[0].line == line
    assert "'SEEN'" in findings[0].message and "keep state on self" in findings[0].message


@pytest.mark.parametrize(
    "snippet, rule, line",
    [
        ("N = 0\ndef bump():\n    global N\n    N = 1\n", "module-state-rebind", 3),
        (
            "def f():\n    x = 0\n    def g():\n        nonlocal x\n        x += 1\n    return g\n",
            "module-state-rebind",
            4,
        ),
        (
            "class S:\n    pass\nSTATE = S()\ndef f():\n    STATE.x = 1\n",
            "module-state-mutation",
            5,
        ),
        ("C = {'n': 0}\ndef f():\n    C['n'] += 1\n", "module-state-mutation", 3),
        ("C = {'n': 0}\ndef f():\n    del C['n']\n", "module-state-mutation", 3),
        ("L = []\ndef f(x):\n    L.append(x)\n", "module-state-mutation", 3),
        ("S = set()\nf = lambda x: S.add(x)\n", "module-state-mutation", 2),
        ("D = {}\ndef f(x):\n    D.get('a').append(x)\n", "module-state-mutation", 3),
        ("import heapq\nH = []\ndef f(x):\n    heapq.heappush(H, x)\n", "module-state-mutation", 4),
        (
            "import numpy as np\nA = np.zeros(3)\ndef f():\n    A.fill(1)\n",
            "module-state-mutation",
            4,
        ),
        (
            "import numpy as np\nA = np.zeros(3)\ndef f():\n    A[...] = 0\n",
            "module-state-mutation",
            4,
        ),
        (
            "import numpy as np\nA = np.zeros(3)\ndef f():\n    np.add(A, 1, out=A)\n",
            "module-state-mutation",
            4,
        ),
        (
            "import numpy as np\nA = np.zeros(3)\ndef f():\n    np.add.at(A, [0], 1)\n",
            "module-state-mutation",
            4,
        ),
        (
            "C = {}\nclass K:\n    def __init__(self):\n        self.c = C\n",
            "module-state-mutation",
            4,
        ),
        ("def f(x, seen=set()):\n    return x\n", "module-state-mutation", 1),
        (
            "def postprocess_units(units, segment):\n    Memory.last = units\n    return units\n",
            "module-state-mutation",
            2,
        ),
        (
            "class K:\n    cache = {}\n    def f(self, x):\n        self.cache[x] = 1\n",
            "class-state-mutation",
            4,
        ),
        (
            "class K:\n    seen = []\n    def f(self, x):\n        self.seen.append(x)\n",
            "class-state-mutation",
            4,
        ),
        (
            "class K:\n    n = 0\n    @classmethod\n    def f(cls):\n        cls.n = 1\n",
            "class-state-mutation",
            5,
        ),
        ("class K:\n    def f(self):\n        type(self).n = 1\n", "class-state-mutation", 3),
        ("import random\ndef f():\n    random.seed(1)\n", "global-rng", 3),
        ("import numpy as np\ndef f():\n    np.random.seed(1)\n", "global-rng", 3),
        ("import numpy\ndef f():\n    return numpy.random.rand()\n", "global-rng", 3),
        ("from random import shuffle\ndef f(xs):\n    shuffle(xs)\n", "global-rng", 3),
        ("import random\ndef f():\n    return random.random()\n", "global-rng", 3),
        (
            "import random\nRNG = random.Random(0)\ndef f():\n    return RNG.random()\n",
            "global-rng",
            4,
        ),
    ],
)
def test_run_time_state_outside_self_is_rejected(snippet: str, rule: str, line: int) -> None:
    assert (rule, line) in check(snippet)
    for finding in check_source(BASE + snippet):
        assert "\n" not in finding.message and f"(line {finding.line})" in finding.message
        assert "on self" in finding.message or "copy it" in finding.message


# --- benign code must pass ------------------------------------------------------------------

BENIGN = [
    "import json\ns = json.dumps({'a': 1})\nd = json.loads(s)",
    "from json import dumps, loads\nd = loads(dumps([1]))",
    "class A(Memory):\n    def __init__(self, backend):\n        super().__init__(backend)",
    'def f():\n    """Calls __init__ and reads __dict__ in prose only."""\n    return 1',
    "x = 2.5\ns = f'{x!r:>10} {x:.2f} {x}'",
    "from dataclasses import dataclass, field",
    "@dataclass\nclass Hit:\n    score: float = 0.0\n"
    "    tags: list[str] = field(default_factory=list)",
    "import numpy as np\nv = np.zeros((2, 3), dtype=np.float32)\nk = np.argpartition(-v[0], 1)",
    "from collections import defaultdict, Counter\nd = defaultdict(list)\nc = Counter('aab')",
    "import bm25s\ntokens = bm25s.tokenize(['a b'], stopwords='en', show_progress=False)",
    "import Stemmer\nstemmer = Stemmer.Stemmer('english')",
    "if __name__ == '__main__':\n    print('hi')",
    "s = '{} and {name:>5}'.format(1, name='x')\nt = '{0:{1}}'.format(3.14159, '.2f')",
    "from collections import namedtuple\nP = namedtuple('P', 'a b')\np = P(1, 2)._replace(a=3)",
    "from typing import Generic, TypeVar\nT = TypeVar('T')\nclass Box(Generic[T]):\n    pass",
    "import abc\nclass Base(abc.ABC):\n    @abc.abstractmethod\n    def run(self):\n        ...",
    "import re\nWORD = re.compile(r'\\w+')\ndef words(text):\n    return WORD.findall(text)",
    "import datetime\nd = datetime.date.fromisoformat('2024-01-02')",
    "import math\ndef f(x: float) -> float:\n    return math.exp(x)",
    "def f(x: 'MemoryUnit') -> 'list[MemoryUnit]':\n    return [x]",
    "import heapq, itertools, functools\nbest = heapq.nlargest(2, [3, 1, 2])",
    "import hashlib\nh = hashlib.sha256(b'x').hexdigest()",
    "class Node:\n    __slots__ = ('a',)\n\n"
    "    def __eq__(self, other):\n        return self.a == other.a",
    "lines = [u for u in range(3)]\ntry:\n    pass\nexcept ValueError as exc:\n    msg = str(exc)",
    "key = lambda u: (u.content, len(u.content))",
    "LIST = [1]\ndef grow(x=len(LIST)):\n    out = list(LIST)\n    out.append(x)\n    return out",
    "CACHE = {}\ndef f():\n    CACHE = {}\n    CACHE['a'] = 1\n    return CACHE",
    "def f(CACHE, heap):\n    CACHE['a'] = 1\n    heap.append(1)",
    "import heapq\nclass Box:\n    def __init__(self):\n        self.heap = []\n"
    "    def put(self, x):\n        heapq.heappush(self.heap, x)",
    "STOP = {'a'}\nTOP_K = 3\nclass K:\n    def __init__(self):\n        self.k = TOP_K\n"
    "        self.stop = set(STOP)\n    def has(self, w):\n        return w in STOP",
    "import random\nimport numpy as np\nrandom.seed(0)\nclass K:\n    def __init__(self):\n"
    "        self.r = random.Random(1)\n        self.g = np.random.default_rng(2)\n"
    "    def draw(self):\n        return self.r.random() + self.g.normal()",
    "class K:\n    LIMIT = 3\n    seen: list\n    def __init__(self):\n        self.seen = []\n"
    "    def add(self, x):\n        self.seen.append(x)\n        return self.LIMIT",
    "class Box:\n    def put(self, x):\n        self.items = [x]\n        self.items.append(x)",
    "from typing import TypeVar\nT = TypeVar('T')\ndef first(xs: list[T]) -> T:\n    return xs[0]",
    "from datetime import date\n@dataclass\nclass Dated:\n    date: str | None = None\n"
    "def parse(text: str) -> date:\n    return date.fromisoformat(text)",
    "import numpy as np\nclass Index:\n    def __init__(self) -> None:\n"
    "        self.ndarray: np.ndarray | None = None\n    def get(self) -> np.ndarray: ...",
]


@pytest.mark.parametrize("snippet", BENIGN, ids=range(len(BENIGN)))
def test_benign_programs_pass(snippet: str) -> None:
    assert check(snippet + "\n") == []


# --- the checker itself -------------------------------------------------------------------


def test_allow_list() -> None:
    assert {"numpy", "bm25s", "Stemmer", "json", "re", "dataclasses"} <= ALLOWED_IMPORTS
    assert not {"os", "sys", "subprocess", "pickle", "evolve", "sandbox"} & ALLOWED_IMPORTS


def test_never_executes_or_imports_the_candidate(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    source = BASE + f"import prismem_never_imported_xyz\nopen({str(marker)!r}, 'w')\n"
    before = set(sys.modules)
    assert "import-not-allowed" in {f.rule for f in check_source(source)}
    assert not marker.exists() and "prismem_never_imported_xyz" not in sys.modules
    assert set(sys.modules) - before == set()


@pytest.mark.parametrize(
    "source",
    ["x = " + "+".join(["a"] * 5000), "x = " + "-" * 50_000 + "1", "x = '\0'\n\0", "x = [" * 300],
)
def test_hostile_nesting_and_bytes_do_not_crash(source: str) -> None:
    assert [f.rule for f in check_source(source)] == ["syntax"]


def test_deep_but_parsable_tree_is_walked_without_recursion() -> None:
    source = BASE + "x = " + " + ".join(["1"] * 900) + " + eval('1')\n"
    assert "forbidden-name" in {f.rule for f in check_source(source, parent_source=BASE)}
