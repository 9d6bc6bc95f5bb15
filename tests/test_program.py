"""contract/program.py and contract/records.py: loading, the contract checks, schemas, validation,
offline records."""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Optional

import pytest
from conftest import minimal

from contract.program import LoadedProgram, check_names, check_shapes, load_program
from contract.records import (
    FieldSpec,
    RecordError,
    build_record,
    field_specs,
    json_schema,
    validate_record,
)
from contract.types import ContractError

SEEDS_DIR = Path(__file__).resolve().parents[1] / "seeds"
SEEDS = ("simple", "dense", "hybrid", "prism", "ariadne")

BASE = minimal(
    ('        return "\\n".join(u.content for u in self.units)[:16000]\n', '        return ""\n')
)


def _load_seed(name: str) -> LoadedProgram:
    path = SEEDS_DIR / f"{name}.py"
    return load_program(path.read_text(), str(path))


def _contract_error(source: str) -> str:
    with pytest.raises(ContractError) as info:
        load_program(source, "<test>")
    return str(info.value)


# --- loading and the contract -------------------------------------------------------------


@pytest.mark.parametrize("name", SEEDS)
def test_seed_loads_and_passes_contract(name: str) -> None:
    program = _load_seed(name)
    check_names(program)
    check_shapes(program)
    assert program.path.endswith(f"{name}.py")
    assert program.memory_unit.__name__ == "MemoryUnit"
    assert program.query.__name__ == "Query"
    assert len(program.digest) == 64
    assert program.hook("postprocess_units") is None


def test_base_program_loads() -> None:
    program = load_program(BASE, "<base>")
    assert program.get("ANSWER_INSTRUCTION") == "Answer."
    assert program.get("NO_SUCH_NAME") is None


@pytest.mark.parametrize("value", ['""', '"   \\n"', "None", "42"])
def test_instruction_must_be_nonempty_string(value: str) -> None:
    source = BASE.replace(
        'PLANNING_INSTRUCTION = "Plan a query."', f"PLANNING_INSTRUCTION = {value}"
    )
    assert "PLANNING_INSTRUCTION must be a non-empty string" in _contract_error(source)


def test_missing_instruction() -> None:
    source = BASE.replace('ANSWER_INSTRUCTION = "Answer."\n', "")
    assert "ANSWER_INSTRUCTION must be a non-empty string" in _contract_error(source)


def test_memory_unit_must_be_dataclass() -> None:
    source = BASE.replace("@dataclass\nclass MemoryUnit:", "class MemoryUnit:")
    assert "MemoryUnit must be a @dataclass" in _contract_error(source)


def test_query_must_exist() -> None:
    source = BASE.replace("@dataclass\nclass Query:\n    text: str\n", "")
    assert "Query must be a @dataclass" in _contract_error(source)


def test_dataclass_must_have_a_field() -> None:
    source = BASE.replace("class Query:\n    text: str", "class Query:\n    pass")
    assert "Query must have at least one field" in _contract_error(source)


@pytest.mark.parametrize(
    "annotation",
    ["dict", "dict[str, str]", "list[int]", "list", "tuple[str, ...]", "int | str", "set[str]"],
)
def test_unsupported_field_type(annotation: str) -> None:
    source = BASE.replace("    content: str\n", f"    content: str\n    extra: {annotation}\n")
    message = _contract_error(source)
    assert "MemoryUnit.extra: unsupported type" in message
    assert "list[str]" in message  # the message says what is allowed


def test_unresolvable_annotation() -> None:
    source = "from __future__ import annotations\n" + BASE.replace(
        "    text: str", "    text: Missing"
    )
    assert "Query: cannot resolve field types" in _contract_error(source)


def test_memory_must_be_a_class() -> None:
    source = BASE.replace("class Memory:", "class _Memory:") + "\nMemory = 3\n"
    assert "Memory must be a class" in _contract_error(source)


def test_memory_missing_retrieve() -> None:
    source = BASE.replace('    def retrieve(self, query):\n        return ""\n', "")
    assert "Memory.retrieve must be defined" in _contract_error(source)


@pytest.mark.parametrize(
    "signature", ["retrieve(self)", "retrieve(self, query, extra)", "retrieve()"]
)
def test_retrieve_wrong_arity(signature: str) -> None:
    source = BASE.replace("retrieve(self, query)", signature)
    message = _contract_error(source)
    assert "Memory.retrieve must accept (self, query)" in message
    assert "found (" in message


@pytest.mark.parametrize(
    "signature", ["retrieve(self, query, k=5)", "retrieve(self, *args)", "retrieve(self, q)"]
)
def test_retrieve_compatible_signatures_pass(signature: str) -> None:
    load_program(BASE.replace("retrieve(self, query)", signature), "<test>")


def test_async_index_rejected() -> None:
    source = BASE.replace(
        "    def index(self, units, segment):", "    async def index(self, units, segment):"
    )
    assert "Memory.index must be a plain synchronous function" in _contract_error(source)


def test_generator_retrieve_rejected() -> None:
    source = BASE.replace('        return ""', '        yield ""')
    assert "Memory.retrieve must be a plain synchronous function" in _contract_error(source)


def test_init_wrong_arity() -> None:
    source = BASE.replace("__init__(self, backend)", "__init__(self, backend, other)")
    assert "Memory.__init__ must accept (self, backend)" in _contract_error(source)


def test_hook_signature_checked_when_present() -> None:
    good = BASE + "\n\ndef postprocess_units(units, segment):\n    return units\n"
    program = load_program(good, "<test>")
    assert program.hook("postprocess_units") is not None
    bad = BASE + "\n\ndef postprocess_query(query):\n    return query\n"
    assert "postprocess_query must accept (query, question)" in _contract_error(bad)
    not_callable = BASE + "\npostprocess_query = 1\n"
    assert "postprocess_query must be defined" in _contract_error(not_callable)


def test_syntax_error_names_line() -> None:
    lines = BASE.splitlines()
    lines[6] = "def broken(:"  # line 7
    message = _contract_error("\n".join(lines))
    assert message.startswith("line 7: syntax error")


def test_module_raising_at_import() -> None:
    message = _contract_error(BASE + '\nraise ValueError("boom at import")\n')
    assert "module failed to load" in message
    assert "ValueError: boom at import" in message


def test_module_name_error_at_import() -> None:
    message = _contract_error(BASE + "\nundefined_name + 1\n")
    assert "module failed to load: NameError" in message


# --- schemas ------------------------------------------------------------------------------


def test_json_schema_simple_seed() -> None:
    program = _load_seed("simple")
    ns = vars(program.module)
    unit = json_schema(program.memory_unit, ns)
    assert unit == {
        "title": "MemoryUnit",
        "type": "object",
        "properties": {
            "content": {"type": "string"},
            "date": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["content"],
        "additionalProperties": False,
    }
    query = json_schema(program.query, ns)
    assert query["properties"] == {"text": {"type": "string"}}
    assert query["required"] == ["text"]
    assert query["additionalProperties"] is False


def test_json_schema_hybrid_seed_list_of_strings() -> None:
    program = _load_seed("hybrid")
    schema = json_schema(program.memory_unit, vars(program.module))
    assert schema["required"] == ["content"]  # the other fields have defaults
    assert schema["additionalProperties"] is False
    assert schema["properties"]["message_ids"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
    }
    assert schema["properties"]["role"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}


@dataclass
class Everything:
    name: str
    count: int
    score: float
    flag: bool
    tags: list[str]
    note: Optional[str] = None  # noqa: UP045 - typing.Optional must be accepted too
    weight: float | None = None
    labels: list[str] | None = None
    level: int = 1


def test_json_schema_all_kinds() -> None:
    schema = json_schema(Everything, globals())
    props = schema["properties"]
    assert props["name"] == {"type": "string"}
    assert props["count"] == {"type": "integer"}
    assert props["score"] == {"type": "number"}
    assert props["flag"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert props["weight"] == {"anyOf": [{"type": "number"}, {"type": "null"}]}
    # fields with defaults may be omitted, so only the others are required
    assert schema["required"] == [f.name for f in fields(Everything) if f.default is MISSING]
    assert schema["additionalProperties"] is False


def test_field_specs_required_and_optional() -> None:
    specs = {s.name: s for s in field_specs(Everything, globals())}
    assert specs["name"] == FieldSpec("name", "string", optional=False, required=True)
    assert specs["tags"] == FieldSpec("tags", "string_list", optional=False, required=True)
    assert specs["note"] == FieldSpec("note", "string", optional=True, required=False)
    assert specs["level"] == FieldSpec("level", "integer", optional=False, required=False)


# --- validate_record ----------------------------------------------------------------------

GOOD = {"name": "a", "count": 2, "score": 0.5, "flag": True, "tags": ["x", "y"]}


def _record_error(data: object) -> str:
    with pytest.raises(RecordError) as info:
        validate_record(Everything, data, globals())
    return str(info.value)


def test_valid_record_with_defaults_omitted() -> None:
    record = validate_record(Everything, dict(GOOD), globals())
    assert record == Everything(**GOOD)
    assert record.note is None and record.level == 1


def test_valid_record_all_fields() -> None:
    data = {**GOOD, "note": "n", "weight": 2.5, "labels": ["l"], "level": 3}
    assert validate_record(Everything, data, globals()) == Everything(**data)


def test_missing_required_field() -> None:
    data = dict(GOOD)
    del data["count"]
    assert "missing field 'count'" in _record_error(data)


def test_extra_field() -> None:
    assert "unknown field 'colour'" in _record_error({**GOOD, "colour": "red"})


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("name", 3, "expected string, got int"),
        ("count", "2", "expected integer, got str"),
        ("count", 2.0, "expected integer, got float"),
        ("score", "0.5", "expected number, got str"),
        ("flag", 1, "expected boolean, got int"),
        ("tags", "x", "expected string_list, got str"),
    ],
)
def test_wrong_type(field: str, value: object, expected: str) -> None:
    message = _record_error({**GOOD, field: value})
    assert f"field {field!r}: {expected}" in message


def test_bool_is_not_an_int() -> None:
    assert "field 'count': expected integer, got bool" in _record_error({**GOOD, "count": True})
    assert "field 'score': expected number, got bool" in _record_error({**GOOD, "score": False})


def test_int_accepted_for_float_and_converted() -> None:
    record = validate_record(Everything, {**GOOD, "score": 3, "weight": 4}, globals())
    assert record.score == 3.0 and isinstance(record.score, float)
    assert record.weight == 4.0 and isinstance(record.weight, float)
    assert isinstance(record.count, int)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_rejected(value: float) -> None:
    assert "field 'score': non-finite number" in _record_error({**GOOD, "score": value})
    assert "field 'weight': non-finite number" in _record_error({**GOOD, "weight": value})


def test_int_too_large_for_a_float_rejected() -> None:
    huge = json.loads("1" + "0" * 400)  # JSON allows it; float() overflows
    assert "field 'score': non-finite number" in _record_error({**GOOD, "score": huge})
    assert validate_record(Everything, {**GOOD, "count": huge}, globals()).count == huge


def test_null_for_optional_ok_and_for_required_rejected() -> None:
    record = validate_record(Everything, {**GOOD, "note": None, "labels": None}, globals())
    assert record.note is None and record.labels is None
    assert "field 'name': null is not allowed" in _record_error({**GOOD, "name": None})
    assert "field 'level': null is not allowed" in _record_error({**GOOD, "level": None})


def test_list_with_non_string_item_rejected() -> None:
    assert "field 'tags'" in _record_error({**GOOD, "tags": ["a", 1]})
    assert "field 'labels'" in _record_error({**GOOD, "labels": ["a", None]})
    assert validate_record(Everything, {**GOOD, "tags": []}, globals()).tags == []


@pytest.mark.parametrize("data", [[GOOD], "text", None, 3])
def test_non_dict_rejected(data: object) -> None:
    message = _record_error(data)
    assert message.startswith("Everything: expected a JSON object, got ")


def test_all_problems_in_one_message() -> None:
    data = {"name": 1, "count": True, "score": math.nan, "tags": ["ok", 2], "x": 0, "y": 1}
    message = _record_error(data)
    assert message.startswith("Everything: ")
    for part in [
        "unknown field 'x'",
        "unknown field 'y'",
        "missing field 'flag'",
        "field 'name': expected string",
        "field 'count': expected integer, got bool",
        "field 'score': non-finite number",
        "field 'tags': expected string_list",
    ]:
        assert part in message
    assert message.count(";") == 6


def test_record_error_is_a_value_error() -> None:
    assert issubclass(RecordError, ValueError)


def test_validate_seed_records() -> None:
    program = _load_seed("hybrid")
    ns = vars(program.module)
    unit = validate_record(
        program.memory_unit, {"content": "c", "role": "user", "message_ids": ["m1"]}, ns
    )
    assert type(unit) is program.memory_unit
    assert (unit.content, unit.date, unit.role, unit.message_ids) == ("c", None, "user", ["m1"])
    with pytest.raises(RecordError, match="missing field 'text'"):
        validate_record(program.query, {}, ns)


# --- build_record -------------------------------------------------------------------------


@dataclass
class Note:
    text: str
    speaker: str
    priority: int
    tags: list[str]
    weight: float = 1.0


@dataclass
class NoStrings:
    count: int


def test_build_record_simple_seed_uses_date_field() -> None:
    program = _load_seed("simple")
    unit = build_record(
        program.memory_unit, "user: I like tea", vars(program.module), date="2024-01-02"
    )
    assert type(unit) is program.memory_unit
    assert unit.content == "user: I like tea"
    assert unit.date == "2024-01-02"


def test_build_record_simple_seed_without_date() -> None:
    program = _load_seed("simple")
    unit = build_record(program.memory_unit, "hello", vars(program.module), date=None)
    assert (unit.content, unit.date) == ("hello", None)


def test_build_record_hybrid_seed_fills_role_and_message_ids() -> None:
    program = _load_seed("hybrid")
    unit = build_record(
        program.memory_unit,
        "assistant: noted",
        vars(program.module),
        date="2024-03-04",
        role="assistant",
        session_id="s1",
        message_id="m7",
        message_ids=["m7"],
    )
    assert unit.content == "assistant: noted"
    assert unit.date == "2024-03-04"
    assert unit.role == "assistant"
    assert unit.message_ids == ["m7"]


def test_build_record_query_from_question() -> None:
    program = _load_seed("dense")
    query = build_record(program.query, "Where do I live?", vars(program.module))
    assert query == program.query(text="Where do I live?")


def test_build_record_date_prefixed_without_date_field() -> None:
    note = build_record(Note, "user: buy milk", globals(), date="2024-05-06", role="user")
    assert note.text == "[2024-05-06] user: buy milk"
    assert note.speaker == "user"  # role goes to its alias
    assert note.priority == 0  # unknown required int
    assert note.tags == []  # unknown required list[str]
    assert note.weight == 1.0  # fields with defaults keep them


def test_build_record_date_of_wrong_type_is_prefixed() -> None:
    @dataclass
    class Dated:
        content: str
        date: int

    record = build_record(Dated, "x", {}, date="2024-05-06")
    assert (record.content, record.date) == ("[2024-05-06] x", 0)


def test_build_record_known_value_of_wrong_type_skipped() -> None:
    note = build_record(Note, "t", globals(), priority="high", role=None)
    assert note.priority == 0  # a str does not fit an int field
    assert note.speaker == ""  # None does not fit a non-optional str


def test_build_record_known_key_by_own_name() -> None:
    note = build_record(Note, "t", globals(), priority=5, tags=["a"])
    assert (note.priority, note.tags) == (5, ["a"])


def test_build_record_message_ids_only_when_field_exists() -> None:
    program = _load_seed("simple")
    unit = build_record(program.memory_unit, "x", vars(program.module), message_ids=["m1"])
    assert not hasattr(unit, "message_ids")


def test_build_record_without_string_field() -> None:
    assert build_record(NoStrings, "dropped", globals()) == NoStrings(count=0)
