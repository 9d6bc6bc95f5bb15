"""Step reuse: component fingerprints (sandbox/fingerprint.py), step keys and the store
(evolve/evaluation/stepcache.py), memory-state pickling (contract/state.py)."""

from __future__ import annotations

import io
import os
import pickle
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.program import load_program
from contract.spec import COMPONENTS
from contract.state import dump_state, load_state
from evolve.evaluation import identity, prompts
from evolve.evaluation.stepcache import StepKeys, StepStore
from sandbox.fingerprint import changed_components, fingerprints

BASE = textwrap.dedent(
    '''\
    """A compact program for fingerprint tests."""

    import math
    from dataclasses import dataclass

    TOP_K = 3  # used by retrieve only
    SEP = "\\n\\n"  # used by index only

    EXTRACTION_INSTRUCTION = "Extract facts."
    PLANNING_INSTRUCTION = "Plan a query."
    ANSWER_INSTRUCTION = "Answer briefly."


    @dataclass
    class MemoryUnit:
        content: str


    @dataclass
    class Query:
        text: str


    def tokens(text):
        return text.lower().split()


    def norm(text):
        return text.strip()


    def rank(scores):
        return sorted(scores, key=lambda s: -math.log1p(s[0]))[:TOP_K]


    class Memory:
        def __init__(self, backend):
            self.backend = backend
            self.units = []
            self.words = []

        def index(self, units, segment):
            for unit in units:
                self.units.append(norm(unit.content) + SEP)
                self.words.append(set(tokens(unit.content)))

        def retrieve(self, query):
            scores = [(self._score(query.text, w), i) for i, w in enumerate(self.words)]
            return "".join(self.units[i] for _, i in rank(scores))

        def _score(self, text, words):
            return len(set(norm(text).split()) & words)

        def _debug(self):
            return len(self.units)
    '''
)


def _sub(old: str, new: str, source: str = BASE) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


def _changed(new: str) -> list[str]:
    return changed_components(BASE, new)


# --- fingerprints -------------------------------------------------------------------------


def test_fingerprints_cover_every_component_and_differ() -> None:
    fp = fingerprints(BASE)
    assert list(fp) == list(COMPONENTS)
    assert len(set(fp.values())) == len(COMPONENTS)
    assert all(len(v) == 64 for v in fp.values())
    assert fingerprints(BASE) == fp  # deterministic


def test_base_program_is_a_valid_program() -> None:
    load_program(BASE, "<base>")


def test_identical_source_changes_nothing() -> None:
    assert _changed(BASE) == []


def test_retrieve_change_only_retrieve() -> None:
    new = _sub('return "".join(self.units[i]', 'return "\\n".join(self.units[i]')
    assert _changed(new) == ["retrieve"]


def test_extraction_instruction_only_extract() -> None:
    new = _sub('"Extract facts."', '"Extract every fact."')
    assert _changed(new) == ["extract"]


def test_memory_unit_change_only_extract() -> None:
    new = _sub(
        "class MemoryUnit:\n    content: str", "class MemoryUnit:\n    content: str\n    x: int = 0"
    )
    assert _changed(new) == ["extract"]


def test_postprocess_units_hook_is_extract() -> None:
    hook = "\n\ndef postprocess_units(units, segment):\n    return units\n"
    with_hook = BASE + hook
    assert changed_components(BASE, with_hook) == ["extract"]
    edited = with_hook.replace("return units\n", "return units[:10]\n")
    assert changed_components(with_hook, edited) == ["extract"]


def test_answer_instruction_only_answer() -> None:
    new = _sub('"Answer briefly."', '"Answer in one word."')
    assert _changed(new) == ["answer"]


def test_planning_instruction_only_plan() -> None:
    new = _sub('"Plan a query."', '"Plan two queries."')
    assert _changed(new) == ["plan"]


def test_query_change_only_plan() -> None:
    new = _sub("class Query:\n    text: str", "class Query:\n    text: str\n    k: int = 5")
    assert _changed(new) == ["plan"]


def test_postprocess_query_hook_is_plan() -> None:
    with_hook = BASE + "\n\ndef postprocess_query(query, question):\n    return query\n"
    assert changed_components(BASE, with_hook) == ["plan"]


def test_helper_used_only_by_index() -> None:
    new = _sub("return text.lower().split()", "return text.split()")
    assert _changed(new) == ["index"]


def test_helper_used_by_index_and_retrieve() -> None:
    new = _sub("return text.strip()", "return text.strip().lower()")
    assert _changed(new) == ["index", "retrieve"]


def test_constant_used_only_by_retrieve() -> None:
    assert _changed(_sub("TOP_K = 3", "TOP_K = 4")) == ["retrieve"]


def test_constant_used_only_by_index() -> None:
    assert _changed(_sub('SEP = "\\n\\n"', 'SEP = "\\n"')) == ["index"]


def test_transitive_helper_of_retrieve() -> None:
    # rank() is called by retrieve and itself uses math and TOP_K
    assert _changed(_sub("-math.log1p(s[0])", "-s[0]")) == ["retrieve"]


def test_memory_method_via_self_from_retrieve() -> None:
    new = _sub("return len(set(norm(text).split()) & words)", "return len(words)")
    assert _changed(new) == ["retrieve"]


def test_unreached_memory_method_counts_as_index() -> None:
    new = _sub("return len(self.units)", "return len(self.words)")
    assert _changed(new) == ["index"]


def test_new_memory_method_counts_as_index() -> None:
    new = _sub(
        "    def _debug(self):", "    def _other(self):\n        return 1\n\n    def _debug(self):"
    )
    assert _changed(new) == ["index"]


def test_memory_init_is_index() -> None:
    new = _sub("self.words = []", "self.words = list()")
    assert _changed(new) == ["index"]


def test_memory_base_class_changes_index_and_retrieve() -> None:
    new = _sub("class Memory:", "class Memory(object):")
    assert _changed(new) == ["index", "retrieve"]


def test_import_used_by_retrieve() -> None:
    assert _changed(_sub("import math\n", "import cmath as math\n")) == ["retrieve"]


def test_new_unused_import_changes_nothing() -> None:
    assert _changed(_sub("import math\n", "import math\nimport json\n")) == []


def test_unused_new_helper_changes_nothing() -> None:
    assert _changed(BASE + "\n\ndef unused(x):\n    return x\n") == []


@pytest.mark.parametrize(
    "loose",
    ["print('loaded')", "if TOP_K > 2:\n    pass", "for _i in range(2):\n    pass", "assert True"],
)
def test_loose_top_level_statement_changes_all(loose: str) -> None:
    assert _changed(BASE + "\n" + loose + "\n") == list(COMPONENTS)


def test_star_import_is_loose_code() -> None:
    star = _sub("-math.log1p(s[0])", "-log1p(s[0])", _sub("import math\n", "from math import *\n"))
    assert changed_components(star, star.replace("from math", "from cmath")) == list(COMPONENTS)


def test_memory_class_body_code_changes_index_and_retrieve() -> None:
    block = (
        "    if TOP_K > 1:\n        def extra(self):\n            return 1\n\n    def _debug(self):"
    )
    with_block = _sub("    def _debug(self):", block)
    assert _changed(with_block) == ["index", "retrieve"]
    edited = with_block.replace("return 1\n", "return 2\n")
    assert changed_components(with_block, edited) == ["index", "retrieve"]


def test_memory_class_docstring_changes_nothing() -> None:
    new = _sub("class Memory:\n", 'class Memory:\n    """Units in input order."""\n\n')
    assert _changed(new) == []


def test_comments_blank_lines_and_formatting_change_nothing() -> None:
    new = BASE.replace("\n\n\n", "\n\n\n\n# a comment between definitions\n")
    new = _sub("TOP_K = 3  # used by retrieve only", "TOP_K = (3)  # another comment", new)
    new = _sub('"Extract facts."', "'Extract facts.'", new)
    new = _sub(
        "return len(set(norm(text).split()) & words)",
        "return len(\n            set(norm(text).split())  # c\n            & words\n        )",
        new,
    )
    new = _sub("def index(self, units, segment):", "def index(self, units,segment) :", new)
    assert new != BASE
    assert fingerprints(new) == fingerprints(BASE)


def test_module_docstring_changes_nothing() -> None:
    new = _sub('"""A compact program for fingerprint tests."""', '"""Another docstring."""')
    assert _changed(new) == []


def test_function_docstring_counts() -> None:
    new = _sub("def rank(scores):\n", 'def rank(scores):\n    """Best first."""\n')
    assert _changed(new) == ["retrieve"]


def test_changed_components_keeps_component_order() -> None:
    new = _sub('"Answer briefly."', '"Answer."', _sub('"Extract facts."', '"Extract."'))
    new = _sub("TOP_K = 3", "TOP_K = 9", new)
    assert _changed(new) == ["extract", "retrieve", "answer"]


# --- import-time code: what the issue's stale-reuse programs do ----------------------------

PATCHED = BASE + textwrap.dedent(
    """
    def chosen_retrieve(self, query):
        return "a"


    Memory.retrieve = chosen_retrieve
    """
)
CFG_BASE = _sub("[:TOP_K]", "[:CFG['k']]", _sub("TOP_K = 3", "CFG = {'k': 3}"))


def test_method_patched_in_after_the_class_is_retrieval_code() -> None:
    edited = PATCHED.replace('return "a"', 'return "b"')
    assert "retrieve" in changed_components(PATCHED, edited)
    assert "retrieve" in changed_components(BASE, PATCHED)


def test_rebinding_memory_after_the_class_is_memory_code() -> None:
    other = CFG_BASE + "\n\nclass Other(Memory):\n    pass\n\n\nMemory = Other\n"
    edited = other.replace("    pass\n", "    def retrieve(self, query):\n        return ''\n")
    assert {"index", "retrieve"} <= set(changed_components(other, edited))


@pytest.mark.parametrize(
    "effect",
    [
        "ZZ = CFG.update(k=9)",  # a method call filed under the name it binds
        "ZZ = helper(9)",  # a helper that changes CFG when the module runs it
        "ZZ = [CFG.update(k=n) for n in (9,)]",
        "def ZZ(x=CFG.update(k=9)):\n    return x",  # a default argument runs at definition
        "class ZZ:\n    n = CFG.update(k=9)",  # a class body runs at definition
        "ZZ = (YY := CFG).update(k=9)",
    ],
)
def test_import_time_side_effect_belongs_to_the_components_that_read_it(effect: str) -> None:
    base = CFG_BASE + "\n\ndef helper(n):\n    CFG.update(k=n)\n    return n\n\n\n"
    program = base + effect + "\n"
    assert changed_components(base, program) == ["retrieve"]
    assert changed_components(program, program.replace("9", "8")) == ["retrieve"]


def test_walrus_at_module_level_binds_its_name() -> None:
    program = _sub("TOP_K = 3", "LIMIT = (TOP_K := 3)")
    assert changed_components(program, program.replace("(TOP_K := 3)", "(TOP_K := 4)")) == [
        "retrieve"
    ]


def test_call_into_a_stateful_module_reaches_its_users() -> None:
    program = _sub("import math\n", "import math\nimport random\n")
    program = _sub("-math.log1p(s[0])", "-math.log1p(s[0]) * random.random()", program)
    seeded = program + "\nZZ = random.seed(1)\n"
    assert changed_components(program, seeded) == ["retrieve"]
    # a stateless module's calls (re.compile, dataclasses) are not effects on other users
    pure = _sub("import math\n", "import math\nimport re\n") + "\nWORD = re.compile('x')\n"
    assert changed_components(pure, pure.replace("'x'", "'y'")) == []


def test_annotations_do_not_tie_a_helper_to_the_classes_it_names() -> None:
    typed = _sub("def rank(scores):", "def rank(scores: list[MemoryUnit]) -> list[Query]:")
    assert changed_components(typed, typed.replace("-math.log1p(s[0])", "-s[0]")) == ["retrieve"]


def test_syntax_error_raises() -> None:
    with pytest.raises(SyntaxError):
        fingerprints("def broken(:\n")


# --- StepKeys ----------------------------------------------------------------------------


def _keys(
    source: str = BASE, model: str = "offline", embed: str = "hashing-384", pipeline: str = "v1"
) -> StepKeys:
    return StepKeys(fingerprints(source), model, embed, pipeline)


def _every_key(keys: StepKeys) -> list[str]:
    extract = keys.extract("seg-a")
    index, plan = keys.index([extract]), keys.plan("Where?", None)
    retrieve = keys.retrieve(index, plan)
    return [extract, index, plan, retrieve, keys.answer(retrieve, "Where?")]


def test_every_key_carries_the_pipeline_version() -> None:
    base = _every_key(_keys())
    assert _every_key(_keys()) == base
    assert not set(_every_key(_keys(pipeline="v2"))) & set(base)


@pytest.mark.parametrize(
    "change",
    [
        (identity, "PIPELINE_VERSION", "2"),
        (prompts, "EXTRACT_PROMPT", "{instruction}\n{schema}\n{window}"),
        (prompts, "PLAN_PROMPT", "{instruction}{schema}Q: {question}{when}"),
        (prompts, "ANSWER_PROMPT", "{instruction}{retrieved}{today}{question}"),
        (prompts, "EXTRACT_WINDOW_CHARS", 12_000),
        (identity, "OUT_CHAR_BUDGET", 8_000),
        (identity, "TRUNCATION", "suffix"),
    ],
)
def test_pipeline_version_follows_what_shapes_outputs(
    monkeypatch: pytest.MonkeyPatch, change: tuple[Any, str, Any]
) -> None:
    base = identity.pipeline_version()
    monkeypatch.setattr(*change)
    assert identity.pipeline_version() != base


@pytest.mark.parametrize("library", ["numpy", "bm25s", "sentence-transformers", "torch"])
def test_pipeline_version_follows_library_versions(
    other_version: Callable[[str], None], library: str
) -> None:
    base = identity.pipeline_version()
    other_version(library)
    assert identity.pipeline_version() != base


def test_pipeline_version_follows_the_embedding_model(monkeypatch: pytest.MonkeyPatch) -> None:
    base = identity.pipeline_version()
    monkeypatch.setattr(identity.Embedder, "name", "all-MiniLM-L12-v2")
    assert identity.pipeline_version() != base


def test_stage_keys_extract() -> None:
    keys = _keys()
    assert keys.extract("seg-a") == _keys().extract("seg-a")
    assert keys.extract("seg-a") != keys.extract("seg-b")
    assert keys.extract("seg-a") != _keys(model="gpt-x").extract("seg-a")
    new = _sub('"Extract facts."', '"Extract."')
    assert keys.extract("seg-a") != _keys(new).extract("seg-a")
    # a retrieval-only change keeps extraction keys
    assert keys.extract("seg-a") == _keys(_sub("TOP_K = 3", "TOP_K = 4")).extract("seg-a")


def test_index_key_changes_with_any_extract_key() -> None:
    keys = _keys()
    base = keys.index(["e1", "e2", "e3"])
    assert keys.index(["e1", "e2", "e3"]) == base
    assert keys.index(["e1", "eX", "e3"]) != base
    assert keys.index(["e1", "e2"]) != base
    assert keys.index(["e2", "e1", "e3"]) != base  # order matters
    assert _keys(embed="minilm").index(["e1", "e2", "e3"]) != base
    assert _keys(_sub('SEP = "\\n\\n"', 'SEP = ""')).index(["e1", "e2", "e3"]) != base


def test_retrieve_key_depends_on_index_and_plan_keys() -> None:
    keys = _keys()
    base = keys.retrieve("i1", "p1")
    assert keys.retrieve("i1", "p1") == base
    assert keys.retrieve("i2", "p1") != base
    assert keys.retrieve("i1", "p2") != base
    assert _keys(_sub("TOP_K = 3", "TOP_K = 4")).retrieve("i1", "p1") != base
    # an answer-only change keeps retrieval keys
    assert _keys(_sub('"Answer briefly."', '"Answer."')).retrieve("i1", "p1") == base


def test_plan_and_answer_keys() -> None:
    keys = _keys()
    plan = keys.plan("Where?", "2024-01-01")
    assert keys.plan("Where?", None) != plan
    assert keys.plan("When?", "2024-01-01") != plan
    assert _keys(model="m2").plan("Where?", "2024-01-01") != plan
    answer = keys.answer("r1", "Where?")
    assert keys.answer("r2", "Where?") != answer
    assert keys.answer("r1", "When?") != answer
    assert _keys(_sub('"Answer briefly."', '"Answer."')).answer("r1", "Where?") != answer


def test_keys_of_different_stages_differ() -> None:
    keys = _keys()
    assert len({keys.extract("x"), keys.index(["x"]), keys.plan("x", None)}) == 3


# --- StepStore ---------------------------------------------------------------------------


def test_store_json_round_trip(tmp_path: Path) -> None:
    store = StepStore(tmp_path)
    value = [{"content": "a", "date": None, "n": 2, "ok": True}]  # extract: a list of units
    assert store.get_json("extract", "ab" * 32) is None
    assert not store.has("extract", "ab" * 32)
    store.put_json("extract", "ab" * 32, value)
    assert store.has("extract", "ab" * 32)
    assert store.get_json("extract", "ab" * 32) == value
    assert not store.has("index", "ab" * 32)  # stages are separate


def test_store_bytes_round_trip(tmp_path: Path) -> None:
    store = StepStore(tmp_path)
    data = pickle.dumps(bytes(range(256)) * 10)  # index: a pickled state
    assert store.get_bytes("index", "cd" * 32) is None
    store.put_bytes("index", "cd" * 32, data)
    assert store.get_bytes("index", "cd" * 32) == data
    assert store.has("index", "cd" * 32)
    assert store.get_json("index", "cd" * 32) is None  # bytes are not json


def test_store_overwrite(tmp_path: Path) -> None:
    store = StepStore(tmp_path)
    store.put_json("plan", "k1", {"q": 1})
    store.put_json("plan", "k1", {"q": 2})
    assert store.get_json("plan", "k1") == {"q": 2}


def test_store_layout_and_no_temp_files(tmp_path: Path) -> None:
    store = StepStore(tmp_path)
    for i in range(5):
        store.put_json("retrieve", f"{i:02d}key", {"i": i})
        store.put_bytes("index", f"{i:02d}key", b"x" * i)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == 10
    assert "retrieve/00/00key.json" in files and "index/04/04key.bin" in files
    assert not [f for f in files if ".tmp" in f]


def test_store_failed_write_leaves_nothing(tmp_path: Path) -> None:
    store = StepStore(tmp_path)
    with pytest.raises(TypeError):
        store.put_json("answer", "k2", {"bad": object()})
    assert not store.has("answer", "k2")
    with pytest.raises(TypeError):
        store.put_bytes("answer", "k3", "not bytes")  # type: ignore[arg-type]
    assert not store.has("answer", "k3")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_store_corrupt_json_is_a_miss(tmp_path: Path) -> None:
    store = StepStore(tmp_path)
    store.put_json("plan", "k4", {"ok": 1})
    path = tmp_path / "plan" / "k4" / "k4.json"
    path.write_text("{not json")
    assert store.get_json("plan", "k4") is None


# --- dump_state / load_state --------------------------------------------------------------

STATE_PROGRAM = textwrap.dedent(
    """\
    from dataclasses import dataclass

    import numpy as np

    EXTRACTION_INSTRUCTION = "Extract."
    PLANNING_INSTRUCTION = "Plan."
    ANSWER_INSTRUCTION = "Answer."


    @dataclass
    class MemoryUnit:
        content: str
        tags: list[str] | None = None


    @dataclass
    class Query:
        text: str


    class Node:
        def __init__(self, unit):
            self.unit = unit


    def score(a, b):
        return float(a @ b)


    class Memory:
        def __init__(self, backend):
            self.backend = backend
            self.units = []
            self.nodes = {}
            self.matrix = np.zeros((0, backend.dim), dtype=np.float32)
            self.scorer = score

        def index(self, units, segment):
            self.units.extend(units)
            for unit in units:
                self.nodes[unit.content] = Node(unit)
            self.matrix = np.vstack([self.matrix, self.backend.embed([u.content for u in units])])

        def retrieve(self, query):
            q = self.backend.embed([query.text])[0]
            best = sorted(range(len(self.units)), key=lambda i: -self.scorer(self.matrix[i], q))
            return "\\n".join(self.units[i].content for i in best)
    """
)


class FakeBackend:
    dim = 8
    max_complete_calls = 0

    def __init__(self, name: str) -> None:
        self.name = name

    def embed(self, texts: list[str]) -> np.ndarray:
        rng = np.random.default_rng(len(texts))
        rows = rng.normal(size=(len(texts), self.dim)).astype(np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        raise RuntimeError("no LLM")


def _built_memory() -> tuple[Any, Any, FakeBackend]:
    program = load_program(STATE_PROGRAM, "<parent>")
    backend = FakeBackend("parent")
    memory = program.get("Memory")(backend)
    unit_cls = program.memory_unit
    memory.index([unit_cls("alpha", ["t"]), unit_cls("beta")], None)
    memory.index([unit_cls("gamma")], None)
    return program, memory, backend


def test_state_round_trips_into_another_program_module() -> None:
    parent, memory, backend = _built_memory()
    data = dump_state(memory, parent.module.__name__, backend)
    assert isinstance(data, bytes)

    child = load_program(STATE_PROGRAM + "\n# a child revision\n", "<child>")
    assert child.module.__name__ != parent.module.__name__
    new_backend = FakeBackend("child")
    restored = load_state(child.get("Memory"), data, vars(child.module), new_backend)

    assert type(restored) is child.get("Memory")
    assert restored.backend is new_backend
    assert [u.content for u in restored.units] == ["alpha", "beta", "gamma"]
    assert restored.units[0].tags == ["t"]
    for unit in restored.units:
        assert type(unit) is child.memory_unit
        assert not isinstance(unit, parent.memory_unit)
    node = restored.nodes["beta"]
    assert type(node) is child.get("Node")
    assert node.unit is restored.units[1]  # shared references survive
    assert restored.scorer is child.get("score")
    np.testing.assert_array_equal(restored.matrix, memory.matrix)
    assert restored.matrix is not memory.matrix
    assert restored.matrix.dtype == np.float32
    # the restored memory works with the new program and backend
    assert restored.retrieve(child.query("alpha")).count("\n") == 2


def test_each_load_is_a_fresh_copy() -> None:
    parent, memory, backend = _built_memory()
    data = dump_state(memory, parent.module.__name__, backend)
    ns = vars(parent.module)
    first = load_state(parent.get("Memory"), data, ns, backend)
    second = load_state(parent.get("Memory"), data, ns, backend)
    assert first is not second
    assert first.units is not second.units and first.units[0] is not second.units[0]
    first.units.append(parent.memory_unit("delta"))
    first.matrix[0, 0] = 42.0
    assert len(second.units) == 3 and len(memory.units) == 3
    assert second.matrix[0, 0] != 42.0 and memory.matrix[0, 0] != 42.0


def test_load_state_does_not_call_init() -> None:
    parent, memory, backend = _built_memory()
    data = dump_state(memory, parent.module.__name__, backend)
    calls: list[str] = []

    class Recording(parent.get("Memory")):  # type: ignore[misc]
        def __init__(self, backend: Any) -> None:
            calls.append("init")

    restored = load_state(Recording, data, vars(parent.module), backend)
    assert calls == [] and len(restored.units) == 3


class _SystemCall:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("echo pwned",))


def _crafted_state(payload: Any) -> bytes:
    return pickle.dumps({"units": [], "evil": payload}, protocol=pickle.HIGHEST_PROTOCOL)


def test_unsafe_global_refused() -> None:
    parent, _, backend = _built_memory()
    data = _crafted_state(_SystemCall())
    assert b"system" in data
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        load_state(parent.get("Memory"), data, vars(parent.module), backend)


def test_raw_pickle_global_refused() -> None:
    parent, _, backend = _built_memory()
    # protocol 0: GLOBAL builtins.eval, then call it with a string
    data = b"cbuiltins\neval\n(S'1+1'\ntR."
    with pytest.raises(pickle.UnpicklingError, match="builtins.eval"):
        load_state(parent.get("Memory"), data, vars(parent.module), backend)


def test_memory_with_unsafe_reduce_is_refused_at_dump() -> None:
    parent, memory, backend = _built_memory()
    memory.evil = _SystemCall()
    with pytest.raises(pickle.PicklingError, match="system"):  # what load would refuse
        dump_state(memory, parent.module.__name__, backend)


def test_unknown_persistent_id_refused() -> None:
    parent, _, backend = _built_memory()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return ("something", "else") if obj == "marker" else None

    buf = io.BytesIO()
    Pickler(buf).dump({"x": "marker"})
    with pytest.raises(pickle.UnpicklingError, match="unknown persistent id"):
        load_state(parent.get("Memory"), buf.getvalue(), vars(parent.module), backend)


def test_safe_builtins_and_numpy_allowed() -> None:
    parent, _, backend = _built_memory()

    class Holder:
        pass

    holder = Holder()
    holder.__dict__.update(
        {"s": {1, 2}, "f": frozenset({"a"}), "b": bytearray(b"xy"), "c": complex(1, 2),
         "r": range(3), "arr": np.arange(5, dtype=np.int64), "scalar": np.float32(1.5)}
    )  # fmt: skip
    data = dump_state(holder, parent.module.__name__, backend)
    restored = load_state(Holder, data, vars(parent.module), backend)
    assert restored.s == {1, 2} and restored.f == frozenset({"a"})
    assert restored.b == bytearray(b"xy") and restored.c == complex(1, 2)
    assert restored.r == range(3) and restored.scalar == np.float32(1.5)
    np.testing.assert_array_equal(restored.arr, np.arange(5))


def test_unpicklable_state_raises_on_dump() -> None:
    parent, memory, backend = _built_memory()
    memory.handle = open(os.devnull)
    try:
        with pytest.raises(TypeError):
            dump_state(memory, parent.module.__name__, backend)
    finally:
        memory.handle.close()


def _refused(data: bytes) -> pickle.UnpicklingError:
    parent, _, backend = _built_memory()
    with pytest.raises(pickle.UnpicklingError) as info:
        load_state(parent.get("Memory"), data, vars(parent.module), backend)
    return info.value


def test_code_runner_inside_an_allowed_library_refused() -> None:
    # numpy.testing's runstring execs its argument: the numpy prefix alone must not allow it
    call = b"cnumpy.testing._private.utils\nrunstring\n(S'raise SystemExit(3)'\n(dtR"
    error = _refused(b"(dS'x'\n" + call + b"s.")
    assert "numpy.testing._private.utils.runstring" in str(error)


def test_library_function_and_memmap_refused() -> None:
    assert "numpy.load" in str(_refused(b"cnumpy\nload\n."))
    assert "numpy.memmap" in str(_refused(b"cnumpy\nmemmap\n."))
    assert "numpyx.thing" in str(_refused(b"cnumpyx\nthing\n."))  # a package, not a prefix


def test_library_objects_round_trip() -> None:
    import collections
    import datetime

    import scipy.sparse as sp

    parent, _, backend = _built_memory()
    values: dict[str, Any] = {
        "strided": np.arange(12).reshape(3, 4)[:, ::2],
        "fortran": np.asfortranarray(np.ones((2, 3))),
        "objects": np.array([{"a": 1}, None], dtype=object),
        "structured": np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
        "scalars": [np.float32(1.5), np.int64(3), np.bool_(True), np.datetime64("2024-01-01")],
        "masked": np.ma.masked_array([1, 2], [0, 1]),
        "rng": np.random.default_rng(0),
        "legacy_rng": np.random.RandomState(0),
        "sparse": sp.csr_matrix(np.eye(3)),
        "ufunc": np.add,
        "ordered": collections.OrderedDict(a=1),
        "counts": collections.Counter("abca"),
        "default": collections.defaultdict(list, {"k": [1]}),
        "queue": collections.deque([1, 2]),
        "when": datetime.datetime(2024, 1, 2, 3, 4),
    }

    class Holder:
        pass

    holder = Holder()
    holder.__dict__.update(values)
    for protocol in (4, pickle.HIGHEST_PROTOCOL):
        data = pickle.dumps(vars(holder), protocol=protocol)
        restored = load_state(Holder, data, vars(parent.module), backend)
        for name in ("strided", "fortran", "structured", "masked"):
            np.testing.assert_array_equal(restored.__dict__[name], values[name])
        assert list(restored.objects) == [{"a": 1}, None]
        assert restored.scalars == values["scalars"]
        assert restored.rng.random() == np.random.default_rng(0).random()
        assert restored.legacy_rng.rand() == np.random.RandomState(0).rand()
        assert (restored.sparse != values["sparse"]).nnz == 0
        assert restored.ufunc is np.add
        assert restored.ordered == values["ordered"] and restored.counts == values["counts"]
        assert restored.default["new"] == [] and restored.queue == values["queue"]
        assert restored.when == values["when"]


def test_hybrid_seed_state_round_trip() -> None:
    from contract.types import Message, Segment
    from evolve.models.testing import HashingEmbedder

    class Backend:
        dim = 64
        max_complete_calls = 0

        def __init__(self) -> None:
            self.embedder = HashingEmbedder(dim=64)

        def embed(self, texts: list[str]) -> np.ndarray:
            return self.embedder.embed(list(texts))

        def complete(self, prompt: str, max_tokens: int = 256) -> str:
            raise RuntimeError("no LLM")

    source = (Path(__file__).resolve().parents[1] / "seeds" / "hybrid.py").read_text()
    parent = load_program(source, "hybrid.py")
    backend = Backend()
    memory = parent.get("Memory")(backend)
    unit = parent.memory_unit
    segment = Segment("s1", "2024-01-01", (Message("m1", "user", "hi"),))
    facts = ["I adopted a cat named Miso", "My sister lives in Lisbon", "I run every Sunday"]
    memory.index([unit(f, "2024-01-01", "user", [f"m{i}"]) for i, f in enumerate(facts)], segment)
    query = parent.query("Where does my sister live?")
    expected = memory.retrieve(query)  # builds the lexical index, so the state holds BM25
    assert "Lisbon" in expected
    data = dump_state(memory, parent.module.__name__, backend)

    child = load_program(source + "\n# child\n", "hybrid-child.py")
    new_backend = Backend()
    restored = load_state(child.get("Memory"), data, vars(child.module), new_backend)
    assert restored.backend is new_backend
    assert all(type(u) is child.memory_unit for u in restored.units)
    assert restored.retrieve(child.query("Where does my sister live?")) == expected


# --- property: an edit that changes what retrieve returns changes its fingerprint ------------

_HELPERS = (
    '    D{d}["v"] += #\n    return #',  # changes a dict when it runs
    '    return D{d}["v"] + #',
)
_EFFECTS = ("Z{i} = f{h}()", "Z{i} = D{d}.update(v=#)", 'Z{i} = D{d}["v"] * #')


@st.composite
def _generated(draw: st.DrawFn) -> tuple[list[str], list[int]]:
    """A program as source lines with integer holes (``#``), and the integers that fill them."""
    dicts = draw(st.integers(1, 3))
    lines = [f'D{d} = {{"v": #}}' for d in range(dicts)]
    helpers = draw(st.lists(st.tuples(st.sampled_from(_HELPERS), st.integers(0, dicts - 1)),
                            max_size=3))  # fmt: skip
    for h, (body, d) in enumerate(helpers):
        lines += [f"def f{h}():", body.format(d=d)]
    kinds = [k for k in _EFFECTS if helpers or not k.startswith("Z{i} = f")]
    effects = draw(st.lists(st.sampled_from(kinds), max_size=3))
    for i, kind in enumerate(effects):
        h = draw(st.integers(0, max(len(helpers) - 1, 0)))
        lines.append(kind.format(i=i, h=h, d=draw(st.integers(0, dicts - 1))))
    read = [f'D{d}["v"]' for d in range(dicts)] + [f"Z{i}" for i in range(len(effects))]
    shown = draw(st.lists(st.sampled_from(read), min_size=1, max_size=3))
    lines += [
        "class Memory:",
        "    def index(self, units, segment):",
        "        return None",
        "    def retrieve(self, query):",
        f"        return str([{', '.join(shown)}, #])",
    ]
    if draw(st.booleans()):  # patched in after the class, as in the issue
        lines += ["def chosen(self, query):", "    return str(#)", "Memory.retrieve = chosen"]
    holes = sum(line.count("#") for line in lines)
    return lines, draw(st.lists(st.integers(1, 9), min_size=holes, max_size=holes))


def _render(lines: list[str], ints: list[int]) -> str:
    head = 'EXTRACTION_INSTRUCTION = "e"\nPLANNING_INSTRUCTION = "p"\nANSWER_INSTRUCTION = "a"\n'
    pieces = "\n".join(lines).split("#")
    body = "".join(p + str(n) for p, n in zip(pieces, [*ints, ""], strict=True))
    return head + body + "\n"


def _retrieved(source: str) -> str:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<generated>", "exec"), namespace)  # our own generated code
    return str(namespace["Memory"]().retrieve(None))


@settings(max_examples=150, deadline=None)
@given(_generated(), st.data())
def test_an_edit_that_changes_retrieval_changes_its_fingerprint(
    program: tuple[list[str], list[int]], data: st.DataObject
) -> None:
    lines, ints = program
    hole = data.draw(st.integers(0, len(ints) - 1))
    edited = [*ints[:hole], ints[hole] + data.draw(st.integers(1, 5)), *ints[hole + 1 :]]
    before, after = _render(lines, ints), _render(lines, edited)
    changed = changed_components(before, after)
    if _retrieved(before) != _retrieved(after):
        assert "retrieve" in changed
    assert not {"extract", "plan", "answer"} & set(changed)  # they reach none of it


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2), st.integers(-50, 50), st.sampled_from(["+", "*", "-"]))
def test_an_edit_nothing_reaches_changes_no_fingerprint(which: int, n: int, op: str) -> None:
    helper = "\n\ndef unused(x):\n    return [x {op} {n}, x {op} 1, {n}]\n"
    program = BASE + helper.format(op="+", n=0)
    bodies = [helper.format(op=op, n=n), helper.format(op="-", n=n + 1), helper.format(op=op, n=7)]
    assert fingerprints(BASE + bodies[which]) == fingerprints(program) == fingerprints(BASE)


def test_only_the_step_cache_derives_its_keys_and_folders() -> None:
    """One cache layout: outside :mod:`evolve.evaluation.stepcache` the project opens the step
    cache through :func:`~evolve.evaluation.stepcache.program_steps` (or ``step_root``), never
    by building keys or a store itself."""
    root = Path(__file__).resolve().parents[1]
    built = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("evolve", "sandbox", "contract", "bench")
        for path in sorted((root / folder).rglob("*.py"))
        if path.name != "stepcache.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "StepKeys(" in line or "StepStore(" in line
    ]
    assert built == []
