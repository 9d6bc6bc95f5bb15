"""The record schemas of a program's ``MemoryUnit`` and ``Query``: fields, JSON schema, checks.

:func:`field_specs` reads a dataclass's fields against the supported types; :func:`json_schema`
renders the schema the task LLM is given and :func:`conform` checks decoded JSON against exactly
that schema (on the trusted side too: it needs no program class); :func:`validate_record` and
:func:`build_record` make instances (the latter for the offline stand-ins of
:func:`contract.program.offline_units`).

Annotations are program text and are never evaluated (``typing.get_type_hints`` would ``eval``
a string annotation, and a computed one, with whatever builtins it finds). A string annotation
(every annotation under ``from __future__ import annotations``) is parsed with :mod:`ast` and
read by a fixed resolver: ``None``, names, ``typing.Name``, ``list[...]``, ``Optional[...]``,
``Union[...]`` and ``|``; a name is looked up by its exact text in the program's namespace, then
among ``str int float bool list``; ``typing``'s names are recognised by identity. Anything else
is an unsupported type. An annotation that is already an object (no ``__future__`` import) is
classified by identity and ``typing.get_origin``/``get_args`` alone.
"""

from __future__ import annotations

import ast
import builtins
import math
import sys
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any

from contract.parsing import parse
from contract.types import ContractError

_MISSING = object()


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
    """The fields of a MemoryUnit/Query dataclass, checked against the supported types.

    Annotations are read by :func:`_field_kind`, never evaluated."""
    if globalns is None:
        globalns = getattr(sys.modules.get(cls.__module__), "__dict__", {})
    specs = []
    for f in fields(cls):
        try:
            kind, optional = _field_kind(f.type, globalns)
        except NameError as exc:
            raise ContractError(f"{cls.__name__}: cannot resolve field types: {exc}") from None
        if kind is None:
            shown = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", f.type)
            raise ContractError(
                f"{cls.__name__}.{f.name}: unsupported type {str(shown)[:80]!r} "
                "(use str, int, float, bool, list[str] or Optional of those)"
            )
        required = f.default is MISSING and f.default_factory is MISSING
        specs.append(FieldSpec(f.name, kind, optional, required))
    if not specs:
        raise ContractError(f"{cls.__name__} must have at least one field")
    return specs


# The resolver: an annotation string is parsed, and each name in it is looked up by its exact
# text in the program's namespace, then among these builtins; typing's names are recognised by
# identity. Nothing is evaluated, subscripted or looked up as an attribute of an object.
_BUILTIN_TYPES: dict[str, Any] = {
    "str": str, "int": int, "float": float, "bool": bool, "list": list, "None": None,
}  # fmt: skip
_TYPING_NAMES: dict[str, Any] = {"Optional": typing.Optional, "Union": typing.Union, "List": list}
_MAX_ANNOTATION_CHARS = 300
_Term = tuple[str | None, bool]  # (kind, optional); kind "none" for None, None if unsupported


def _field_kind(annotation: Any, namespace: dict[str, Any]) -> _Term:
    """The supported kind of one field's annotation (a string or an already evaluated type)."""
    if not isinstance(annotation, str):
        return _classify(annotation)
    if len(annotation) > _MAX_ANNOTATION_CHARS:
        return None, False
    try:
        tree = parse(annotation.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, False
    kind, optional = _term(tree.body, namespace, 0)
    return (None, False) if kind == "none" else (kind, optional)


def _classify(tp: Any) -> _Term:
    """The kind of an annotation that is already an object, by identity and typing's origin."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            kind, _ = _classify(args[0])
            return kind, True
        return None, False
    scalar = next((k for t, k in SCALAR_TYPES.items() if tp is t), None)
    if scalar is not None:
        return scalar, False
    if origin is list and typing.get_args(tp) == (str,):
        return "string_list", False
    return None, False


def _lookup(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """What a bare or ``typing.``-qualified name in an annotation denotes; ``_MISSING`` if none."""
    if isinstance(node, ast.Name):
        value = (
            namespace[node.id] if node.id in namespace else _BUILTIN_TYPES.get(node.id, _MISSING)
        )
        return list if value is list else value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if namespace.get(node.value.id) is typing:
            return _TYPING_NAMES.get(node.attr, _MISSING)
    return _MISSING


def _term(node: ast.expr, namespace: dict[str, Any], depth: int) -> _Term:
    if depth > 8:
        return None, False
    if isinstance(node, ast.Constant) and node.value is None:
        return "none", False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([node.left, node.right], namespace, depth)
    if isinstance(node, ast.Subscript):
        origin = _lookup(node.value, namespace)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if origin is list and len(args) == 1:
            return ("string_list", False) if _lookup(args[0], namespace) is str else (None, False)
        if origin is typing.Optional and len(args) == 1:
            return _union([args[0], ast.Constant(None)], namespace, depth)
        if origin is typing.Union:
            return _union(args, namespace, depth)
        return None, False
    value = _lookup(node, namespace)
    if value is _MISSING and isinstance(node, ast.Name) and node.id not in vars(builtins):
        raise NameError(f"name {node.id[:40]!r} is not defined")
    if value is None or value is type(None):
        return "none", False
    return next(((k, False) for t, k in SCALAR_TYPES.items() if value is t), (None, False))


def _union(parts: list[ast.expr], namespace: dict[str, Any], depth: int) -> _Term:
    terms = [_term(p, namespace, depth + 1) for p in parts]
    kinds = [k for k, _ in terms if k != "none"]
    if len(terms) != 2 or len(kinds) != 1 or kinds[0] is None or any(o for _, o in terms):
        return None, False
    return kinds[0], True


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
