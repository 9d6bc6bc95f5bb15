"""A retrieve that changes the memory is refused: by tier 1 (sandbox/readonly.py) for each form
it can see, methods of the program's other classes included, and by the smoke tier for what
static analysis cannot see: it compares the memory's stored state (or, for a memory that cannot
be stored, the digest of everything reachable from it) before and after retrieves, and the
answer to a query before and after another."""

from __future__ import annotations

import textwrap

import pytest
from conftest import MINIMAL

from sandbox.check import check_program
from sandbox.static import check_source

RETRIEVE = (
    "    def retrieve(self, query):\n"
    '        return "\\n".join(u.content for u in self.units)[:16000]\n'
)


def program(retrieve: str, init: str = "", top: str = "", methods: str = "") -> str:
    """MINIMAL with ``retrieve``'s body before its return, ``init`` lines in ``__init__``,
    ``top`` after the imports and ``methods`` after retrieve."""
    assert RETRIEVE in MINIMAL
    body = textwrap.indent(textwrap.dedent(retrieve).strip("\n") + "\n", " " * 8)
    extra = textwrap.indent(textwrap.dedent(methods).strip("\n") + "\n", " " * 4)
    source = MINIMAL.replace(
        RETRIEVE,
        RETRIEVE.replace("query):\n", "query):\n" + body) + ("\n" + extra if methods else ""),
    )
    if init:
        anchor = "        self.units = []\n"
        source = source.replace(anchor, anchor + textwrap.indent(init.strip("\n") + "\n", " " * 8))
    if top:
        anchor = "from dataclasses import dataclass\n"
        source = source.replace(anchor, anchor + textwrap.dedent(top).strip("\n") + "\n")
    return source


def mutations(source: str) -> list[tuple[int | None, str]]:
    return [(f.line, f.message) for f in check_source(source) if f.rule == "retrieve-mutation"]


def line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


INIT = "self.cache = {}\nself.count = 0\nself.heap = []\nself.stats = Stats()\n"
STATS = "class Stats:\n    hits = 0\n"  # a plain holder: an int class attribute is not class state
# Another class whose objects the memory holds (self.log): each method changes the object.
LOG = """
class Log:
    def __init__(self):
        self.seen = []
        self.reads = 0

    def note(self, text):
        self.seen.append(text)

    def score(self, unit):
        self.reads += 1
        return len(unit.content)

    def __getitem__(self, key):
        self.seen.append(key)
        return key

    def __iter__(self):
        self.reads += 2
        return iter(self.seen)

    def __call__(self, text):
        self.seen.append(text + "!")


def remember(log, text):
    log.note(text)
"""

# (retrieve body, extra methods, top of module, the line the finding must point at)
REFUSED = {
    "augmented assignment": ("self.count += 1", "", "", "self.count += 1"),
    "item assignment": ("self.cache[query.text] = 1", "", "", "self.cache[query.text] = 1"),
    "nested attribute": ("self.stats.hits = 1", "", "", "self.stats.hits = 1"),
    "del": ("del self.cache['x']", "", "", "del self.cache"),
    "mutating method": ("self.units.append(query)", "", "", "self.units.append"),
    "sort in place": ("self.units.sort(key=len)", "", "", "self.units.sort"),
    "alias": ("c = self.cache\nc[query.text] = 1", "", "", "c[query.text] = 1"),
    "alias from get": ("x = self.cache.get('k')\nx.append(1)", "", "", "x.append(1)"),
    "loop element": (
        "for item in self.units:\n    item.content = item.content.strip()",
        "",
        "",
        "item.content = item.content.strip()",
    ),
    "comprehension element": ("[x.tags.clear() for x in self.units]", "", "", "x.tags.clear()"),
    "enumerate element": (
        "for i, item in enumerate(self.units):\n    item.rank = i",
        "",
        "",
        "item.rank = i",
    ),
    "in-place function": (
        "heapq.heappush(self.heap, 1)",
        "",
        "import heapq",
        "heapq.heappush",
    ),
    "out= argument": (
        "np.add(self.vec, 1, out=self.vec)",
        "",
        "import numpy as np",
        "out=self.vec",
    ),
    "reached method": (
        "self._note(query)",
        "def _note(self, query):\n    self.cache[query.text] = True",
        "",
        "self.cache[query.text] = True",
    ),
    "method given an alias": (
        "self._grow(self.cache)",
        "@staticmethod\ndef _grow(table):\n    table['k'] = 1",
        "",
        "table['k'] = 1",
    ),
    "bound method as a value": (
        "sorted(self.units, key=self._key)",
        "def _key(self, unit):\n    self.count += 1\n    return unit.content",
        "",
        "self.count += 1",
    ),
    "module function given self": (
        "remember(self, query)",
        "",
        "def remember(memory, query):\n    memory.cache[query.text] = 1",
        "memory.cache[query.text] = 1",
    ),
    "generator kept on self": (
        "self.rng.random()",
        "",
        "import random",
        "self.rng.random()",
    ),
    "method of another class": ("self.log.note(query.text)", "", LOG, "self.seen.append(text)"),
    "another class through an alias": (
        "log = self.log\nlog.note(query.text)",
        "",
        LOG,
        "self.seen.append(text)",
    ),
    "another class's method as a value": (
        "sorted(self.units, key=self.log.score)",
        "",
        LOG,
        "self.reads += 1",
    ),
    "another class's item read": ("self.log[query.text]", "", LOG, "self.seen.append(key)"),
    "another class's iteration": ("for x in self.log:\n    pass", "", LOG, "self.reads += 2"),
    "another class called": ("self.log(query.text)", "", LOG, 'self.seen.append(text + "!")'),
    "function given another class": (
        "remember(self.log, query.text)",
        "",
        LOG,
        "self.seen.append(text)",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=str)
def test_each_change_to_the_memory_in_retrieve_is_refused_with_a_repair(case: str) -> None:
    body, methods, top, where = REFUSED[case]
    init = INIT + ("self.rng = random.Random(0)\n" if "random" in top else "")
    init += "self.log = Log()\n" if "class Log" in top else ""
    source = program(body, init=init, top=top + "\n" + STATS, methods=methods)
    found = mutations(source)
    assert found, case
    line = line_of(source, where)
    assert any(at == line for at, _ in found), (case, line, found)
    message = next(m for at, m in found if at == line)
    assert "retrieve" in message and ("index()" in message or "inside retrieve" in message)


ALLOWED = {
    "reads only": ("best = max(self.units, key=len, default=None)", "", ""),
    "a copy changed": (
        "units = list(self.units)\nunits.append(query)\nunits.sort(key=len)",
        "",
        "",
    ),
    "a local table": ("seen = {}\nfor u in self.units:\n    seen[u.content] = 1", "", ""),
    "a reading helper": ("n = self._size()", "def _size(self):\n    return len(self.units)", ""),
    "a local generator": ("rng = random.Random(0)\nrng.random()", "", "import random"),
    "arithmetic on state": ("v = self.vec * 2\nv[0] = 1.0", "", ""),
    # objects of other classes made in retrieve change themselves, not the memory
    "a helper made with the memory": (
        "walk = Walk(self)\nfor unit in self.units:\n    walk.visit(unit)",
        "",
        "class Walk:\n    def __init__(self, memory):\n        self.memory = memory\n"
        "        self.seen = []\n\n    def visit(self, unit):\n        self.seen.append(unit)\n",
    ),
    "a counter made from state": (
        "budget = Budget(self.count)\nbudget.spend()",
        "",
        "class Budget:\n    def __init__(self, left):\n        self.left = left\n\n"
        "    def spend(self):\n        self.left -= 1\n",
    ),
}


@pytest.mark.parametrize("case", ALLOWED, ids=str)
def test_a_retrieve_that_only_reads_the_memory_passes(case: str) -> None:
    body, methods, top = ALLOWED[case]
    init = INIT + "self.vec = [0.0]\n"
    source = program(body, init=init, top=top + "\n" + STATS, methods=methods)
    assert check_source(source) == []


def test_index_may_change_the_memory_and_share_helpers_that_do_not() -> None:
    methods = "def _store(self, units):\n    self.cache['n'] = len(units)"
    source = program("", init=INIT, top=STATS, methods=methods).replace(
        "        self.units.extend(units)\n",
        "        self.units.extend(units)\n        self._store(units)\n",
    )
    assert check_source(source) == []


# Changes static analysis cannot see. HIDDEN: a lambda kept on self calls another class's
# method (a memory holding a lambda cannot be stored: its reachable state is compared);
# STORED: a top-level function kept on self does (a storable memory: its stored state is
# compared); OUTSIDE: the state is a module-level table handed to a function, outside the
# memory, and the answer depends on it (the repeated query catches it).
NOTES = """
class Notes:
    def __init__(self):
        self.seen = []

    def note(self, text):
        self.seen.append(text)


def remember(log, text):
    log.note(text)
"""
HIDDEN = program(
    "self.hook(query.text)",
    init="self.log = Notes()\nself.hook = lambda text: self.log.note(text)",
    top=NOTES,
)
STORED = program(
    "self.keep(self.log, query.text)",
    init="self.log = Notes()\nself.keep = remember",
    top=NOTES,
)
OUTSIDE = program(
    "if tally(SEEN, 'asked') > 1:\n    return 'asked before'",
    top="SEEN = {}\n\n\ndef tally(table, key):\n    table[key] = table.get(key, 0) + 1\n"
    "    return table[key]\n",
)
HIDDEN_ROUTES = {
    "lambda kept on self": (HIDDEN, "changed the memory's state", "reachable"),
    "function kept on self": (STORED, "changed the memory's state", "stored"),
    "state outside the memory": (OUTSIDE, "answered the same query differently", "stored"),
}


@pytest.mark.parametrize("route", HIDDEN_ROUTES, ids=str)
def test_a_change_hidden_from_tier_1_is_caught_by_the_smoke_tier(route: str) -> None:
    source, error, _ = HIDDEN_ROUTES[route]
    assert check_source(source) == []  # tier 1 cannot see it
    report = check_program(source, "hidden.py")
    failure = report.failure
    assert failure is not None and (failure.tier, failure.rule) == (3, "smoke"), report.tiers
    assert error in (failure.error or ""), failure.error
    assert "retrievals are cached per index and query" in report.repair_text()


def test_the_smoke_tier_compares_what_each_route_changes_when_retrieve_leaves_it_alone() -> None:
    """Without the change, each program passes, its state compared as the route needs."""
    for route, (source, _, compared) in HIDDEN_ROUTES.items():
        calm = (
            source.replace("self.log.note(text)", "len(text)")
            .replace("self.keep(self.log, query.text)", "self.log.seen.count(query.text)")
            .replace("if tally(SEEN, 'asked') > 1:", "if len(SEEN) > 1:")
        )
        smoke = check_program(calm, "calm.py").tiers[2]
        assert smoke.passed and smoke.details["state_compared"] == compared, (route, smoke)


def test_the_smoke_tier_compares_the_state_of_a_retrieve_that_leaves_it_alone() -> None:
    report = check_program(MINIMAL, "minimal.py")
    smoke = report.tiers[2]
    assert smoke.passed and smoke.details["retrieve_state_checked"] is True, report.tiers
