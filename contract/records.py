"""The record schemas of a program's ``MemoryUnit`` and ``Query``: fields, JSON schema, checks.

:func:`field_specs` reads a dataclass's fields against the supported types; :func:`json_schema`
renders the schema the task LLM is given and :func:`conform` checks decoded JSON against exactly
that schema (on the trusted side too: it needs no program class); :func:`validate_record` and
:func:`build_record` make instances (the latter for the offline stand-ins of
:func:`contract.program.offline_units`).
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any

from contract.types import ContractError


class RecordError(ValueError):
    """An LLM output does not match the program's MemoryUnit/Query schema."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str  # "string" | "integer" | "number" | "boolean" | "string_list"
    optional: bool
    required: bool  # no default value


SCALAR_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def field_specs(cls: type, globalns: dict[str, Any] | None = None) -> list[FieldSpec]:
    """The fields of a MemoryUnit/Query dataclass, checked against the supported types."""
    try:
        hints = typing.get_type_hints(cls, globalns=globalns)
    except Exception as exc:
        raise ContractError(f"{cls.__name__}: cannot resolve field types: {exc}") from None
    specs = []
    for f in fields(cls):
        kind, optional = _classify(hints.get(f.name))
        if kind is None:
            raise ContractError(
                f"{cls.__name__}.{f.name}: unsupported type {hints.get(f.name)!r} "
                "(use str, int, float, bool, list[str] or Optional of those)"
            )
        required = f.default is MISSING and f.default_factory is MISSING
        specs.append(FieldSpec(f.name, kind, optional, required))
    if not specs:
        raise ContractError(f"{cls.__name__} must have at least one field")
    return specs


def _classify(tp: Any) -> tuple[str | None, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            kind, _ = _classify(args[0])
            return kind, True
        return None, False
    if tp in SCALAR_TYPES:
        return SCALAR_TYPES[tp], False
    if origin is list and typing.get_args(tp) == (str,):
        return "string_list", False
    return None, False


def json_schema(cls: type, globalns: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON schema of one record of ``cls``: no extra properties; fields without a default
    are required. :func:`conform` checks data against exactly this schema."""
    props: dict[str, Any] = {}
    required = []
    for spec in field_specs(cls, globalns):
        base: dict[str, Any] = (
            {"type": "array", "items": {"type": "string"}}
            if spec.kind == "string_list"
            else {"type": spec.kind}
        )
        props[spec.name] = {"anyOf": [base, {"type": "null"}]} if spec.optional else base
        if spec.required:
            required.append(spec.name)
    return {
        "title": cls.__name__,
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


def _spec_from_schema(name: str, prop: dict[str, Any], required: bool) -> FieldSpec:
    options = prop.get("anyOf", [prop])
    base = next(o for o in options if o.get("type") != "null")
    kind = "string_list" if base.get("type") == "array" else str(base.get("type"))
    return FieldSpec(name, kind, len(options) > 1, required)


def conform(schema: dict[str, Any], data: Any) -> dict[str, Any]:
    """Check one decoded JSON object against a :func:`json_schema` record schema.

    Returns the field values (integers given for numbers become floats); raises RecordError
    naming every problem: unknown or missing fields, wrong types (a bool is not an int),
    non-finite numbers, non-string list items. Fields with defaults may be omitted.
    """
    title = schema.get("title", "record")
    if not isinstance(data, dict):
        raise RecordError(f"{title}: expected a JSON object, got {type(data).__name__}")
    required = set(schema.get("required", []))
    specs = {n: _spec_from_schema(n, p, n in required) for n, p in schema["properties"].items()}
    problems = [f"unknown field {k!r}" for k in data if k not in specs]
    problems += [f"missing field {n!r}" for n, s in specs.items() if s.required and n not in data]
    values: dict[str, Any] = {}
    for name, value in data.items():
        spec = specs.get(name)
        if spec is None:
            continue
        error = _type_error(spec, value)
        if error:
            problems.append(f"field {name!r}: {error}")
        else:
            values[name] = float(value) if spec.kind == "number" and value is not None else value
    if problems:
        raise RecordError(f"{title}: " + "; ".join(problems))
    return values


def validate_record(cls: type, data: Any, globalns: dict[str, Any] | None = None) -> Any:
    """Build a ``cls`` instance from one decoded JSON object, or raise RecordError."""
    return cls(**conform(json_schema(cls, globalns), data))


def _type_error(spec: FieldSpec, value: Any) -> str | None:
    if value is None:
        return None if spec.optional else "null is not allowed"
    kind = spec.kind
    if kind == "string":
        ok = isinstance(value, str)
    elif kind == "boolean":
        ok = isinstance(value, bool)
    elif kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and not _finite(value):
            return "non-finite number"
    else:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return None if ok else f"expected {kind}, got {type(value).__name__}"


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (JSON allows any number of digits)
        return False


_DEFAULTS = {"string": "", "integer": 0, "number": 0.0, "boolean": False}

# Offline stand-ins fill fields by name: the first matching field of each group gets the value.
CONTENT_FIELDS = ("content", "text", "fact", "memory", "statement", "summary", "question", "query")
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "date": ("date", "timestamp", "time", "session_date"),
    "role": ("role", "speaker"),
    "session_id": ("session_id", "session"),
    "message_id": ("message_id", "source_id"),
    "message_ids": ("message_ids", "source_ids", "source_message_ids"),
}


def build_record(
    cls: type, content: str, globalns: dict[str, Any] | None = None, **known: Any
) -> Any:
    """Make a ``cls`` instance from text and known metadata, matching fields by name.

    Used by the offline stand-ins. ``content`` goes to the first field named in
    :data:`CONTENT_FIELDS` (or, failing that, the first string field); each ``known`` key goes
    to the first field named in its alias group when the type fits; a ``date`` that finds no
    field of its own is prefixed to the content as ``[date]``, so no unit loses its date. Every
    other required field gets its type's empty value.
    """
    specs = field_specs(cls, globalns)
    by_name = {s.name: s for s in specs}
    values: dict[str, Any] = {}
    target = next((n for n in CONTENT_FIELDS if n in by_name and by_name[n].kind == "string"), None)
    target = target or next((s.name for s in specs if s.kind == "string"), None)
    placed: set[str] = set()
    for key, value in known.items():
        for alias in FIELD_ALIASES.get(key, (key,)):
            spec = by_name.get(alias)
            if (
                spec
                and alias != target
                and alias not in values
                and _type_error(spec, value) is None
            ):
                values[alias] = value
                placed.add(key)
                break
    if known.get("date") and "date" not in placed:
        content = f"[{known['date']}] {content}"
    if target:
        values[target] = content
    for spec in specs:
        if spec.name not in values and spec.required:
            values[spec.name] = None if spec.optional else _DEFAULTS.get(spec.kind, [])
            if spec.kind == "string_list" and not spec.optional:
                values[spec.name] = []
    return cls(**values)
