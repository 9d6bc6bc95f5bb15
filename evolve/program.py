"""The memory-program contract: what a program file must define, and how its data is checked.

A memory program is one Python module (design §1). It must define:

- ``EXTRACTION_INSTRUCTION``, ``PLANNING_INSTRUCTION``, ``ANSWER_INSTRUCTION`` — non-empty
  strings given to the task LLM for the Extraction, Planning and Answer components.
- ``@dataclass MemoryUnit`` and ``@dataclass Query`` — at least one field each; every field is
  one of ``str``, ``int``, ``float``, ``bool``, ``list[str]`` or ``Optional`` of those. The
  executor renders their JSON schema for the LLM (:func:`json_schema`) and validates what comes
  back (:func:`validate_record`): missing or extra fields, wrong types, non-finite numbers.
- ``class Memory`` with ``__init__(self, backend)``, ``index(self, units, segment) -> None``
  (called once per session, in history order, with that session's units) and
  ``retrieve(self, query) -> str``. All synchronous.

It may also define these component hooks (plain functions):

- ``postprocess_units(units: list[MemoryUnit], segment: Segment) -> list[MemoryUnit]`` — part
  of Extraction; runs on the validated units of each segment before they are stored.
- ``postprocess_query(query: Query, question: str) -> Query`` — part of Planning; runs on the
  validated query before retrieval.

What the program receives:

- ``segment``: a frozen :class:`~evolve.datasets.types.Segment` (``session_id``, ``date`` —
  ISO ``YYYY-MM-DD`` when known —, ``messages`` each with ``id``, ``role``, ``content``).
- ``backend``: an object with ``embed(texts) -> numpy.ndarray`` (float32 rows, L2-normalised,
  ``backend.dim`` columns) and ``complete(prompt, max_tokens=256) -> str``, a counted call to the
  task LLM limited to ``backend.max_complete_calls`` per index/retrieve call (raises
  :class:`BackendError` when no LLM is configured or the budget is spent).

Invariants enforced by the executor, not by the program:

- The retrieved text handed to Answer is at most :data:`OUT_CHAR_BUDGET` characters; longer
  results are truncated and the trace records that the budget was exceeded.
- Offline (no task model): extraction yields one unit per message via :func:`build_record`
  (the content field gets ``"[date] role: text"``), planning uses the question as the query,
  answering is skipped.
"""

from __future__ import annotations

import hashlib
import linecache
import math
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Protocol

import numpy as np

CONTRACT_VERSION = "1"  # bump when a program valid under the old contract may not be now
OUT_CHAR_BUDGET = 16_000

INSTRUCTIONS = ("EXTRACTION_INSTRUCTION", "PLANNING_INSTRUCTION", "ANSWER_INSTRUCTION")
DATACLASSES = ("MemoryUnit", "Query")
MEMORY_METHODS = {"__init__": ["backend"], "index": ["units", "segment"], "retrieve": ["query"]}
HOOKS = {"postprocess_units": ["units", "segment"], "postprocess_query": ["query", "question"]}

SCALAR_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ContractError(Exception):
    """A program violates the contract; the message names the rule and, when known, the line."""


class RecordError(ValueError):
    """An LLM output does not match the program's MemoryUnit/Query schema."""


class BackendError(RuntimeError):
    """A program asked the backend for something it cannot give (no LLM, budget spent)."""


class Backend(Protocol):
    """What ``Memory.__init__`` receives."""

    dim: int
    max_complete_calls: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def complete(self, prompt: str, max_tokens: int = 256) -> str: ...


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str  # "string" | "integer" | "number" | "boolean" | "string_list"
    optional: bool
    required: bool  # no default value


@dataclass
class Program:
    """A loaded program: its module, source and content hash."""

    source: str
    module: types.ModuleType
    path: str = "<program>"

    @property
    def digest(self) -> str:
        return source_digest(self.source)

    def get(self, name: str) -> Any:
        return getattr(self.module, name, None)

    @property
    def memory_unit(self) -> type:
        return typing.cast(type, self.module.MemoryUnit)

    @property
    def query(self) -> type:
        return typing.cast(type, self.module.Query)

    def hook(self, name: str) -> Callable[..., Any] | None:
        fn = getattr(self.module, name, None)
        return fn if callable(fn) else None


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def load_program(
    source: str,
    path: str = "<program>",
    builtins: dict[str, Any] | None = None,
    shapes: bool = True,
) -> Program:
    """Execute ``source`` as a fresh module and check what the contract requires: the names
    (:func:`check_names`) and, unless ``shapes`` is False, :func:`check_shapes`.

    This runs the module's top level: call it only inside a sandbox host
    (:mod:`sandbox.host`), which passes its restricted ``builtins``.
    """
    name = f"prismem_program_{source_digest(source)[:16]}"
    module = types.ModuleType(name)
    module.__file__ = path
    if builtins is not None:
        module.__dict__["__builtins__"] = builtins
    sys.modules[name] = module  # dataclasses resolve string annotations through sys.modules
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)  # error lines
    try:
        code = compile(source, path, "exec")
        exec(code, module.__dict__)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise ContractError(f"line {exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ContractError(f"module failed to load: {type(exc).__name__}: {exc}") from None
    program = Program(source=source, module=module, path=path)
    check_names(program)
    if shapes:
        check_shapes(program)
    return program


def check_names(program: Program) -> None:
    """The required names exist with the right kinds (instructions, dataclasses, a class)."""
    for name in INSTRUCTIONS:
        value = program.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ContractError(f"{name} must be a non-empty string")
    for name in DATACLASSES:
        cls = program.get(name)
        if not (isinstance(cls, type) and is_dataclass(cls)):
            raise ContractError(f"{name} must be a @dataclass")
    if not isinstance(program.get("Memory"), type):
        raise ContractError("Memory must be a class")


def check_shapes(program: Program) -> None:
    """Dataclass field types and the signatures of Memory's methods and of any hooks."""
    import inspect

    for name in DATACLASSES:
        field_specs(program.get(name), vars(program.module))
    memory = program.get("Memory")
    for method, params in MEMORY_METHODS.items():
        fn = getattr(memory, method, None)
        _check_signature(f"Memory.{method}", fn, ["self", *params], inspect)
    for hook, params in HOOKS.items():
        if hasattr(program.module, hook):
            _check_signature(hook, program.get(hook), params, inspect)


def _check_signature(label: str, fn: Any, params: list[str], inspect: Any) -> None:
    if not callable(fn):
        raise ContractError(f"{label} must be defined")
    if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn):
        raise ContractError(f"{label} must be a plain synchronous function")
    sig = inspect.signature(fn)
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    has_var = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(required) > len(params) or (len(positional) < len(params) and not has_var):
        raise ContractError(f"{label} must accept ({', '.join(params)}); found {sig}")


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


def offline_units(program: Program, segment: Any) -> list[Any]:
    """Offline extraction's stand-in: one ``MemoryUnit`` per message of ``segment`` (any object
    with ``messages``, ``date`` and ``session_id``), text ``"role: content"``, metadata by name."""
    ns = vars(program.module)
    return [
        build_record(
            program.memory_unit,
            f"{m.role}: {m.content}",
            ns,
            date=segment.date,
            role=m.role,
            session_id=segment.session_id,
            message_id=m.id,
            message_ids=[m.id],
        )
        for m in segment.messages
    ]
