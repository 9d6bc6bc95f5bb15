"""Loading a memory program and checking what the contract requires of it.

:func:`load_program` executes a source as a fresh module (only ever inside the sandbox host,
which passes its restricted builtins) and checks the names (:func:`check_names`: the kinds
:mod:`contract.spec` lists) and, unless asked not to, the shapes (:func:`check_shapes`: field
types, and the signatures of ``Memory``'s methods and of any hooks). Every violation is a
:class:`~contract.types.ContractError` naming the rule and, when known, the line.
:func:`offline_units` is offline extraction's stand-in (one unit per message).
"""

from __future__ import annotations

import hashlib
import linecache
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, is_dataclass
from typing import Any

from contract.records import build_record, field_specs
from contract.spec import DATACLASSES, HOOKS, INSTRUCTIONS, MEMORY, MEMORY_METHODS
from contract.types import ContractError


@dataclass
class LoadedProgram:
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
) -> LoadedProgram:
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
    program = LoadedProgram(source=source, module=module, path=path)
    check_names(program)
    if shapes:
        check_shapes(program)
    return program


def check_names(program: LoadedProgram) -> None:
    """The required names exist with the right kinds (instructions, dataclasses, a class)."""
    for name in INSTRUCTIONS.values():
        value = program.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ContractError(f"{name} must be a non-empty string")
    for name in DATACLASSES.values():
        cls = program.get(name)
        if not (isinstance(cls, type) and is_dataclass(cls)):
            raise ContractError(f"{name} must be a @dataclass")
    if not isinstance(program.get(MEMORY), type):
        raise ContractError(f"{MEMORY} must be a class")


def check_shapes(program: LoadedProgram) -> None:
    """Dataclass field types and the signatures of Memory's methods and of any hooks."""
    import inspect

    for name in DATACLASSES.values():
        field_specs(program.get(name), vars(program.module))
    memory = program.get(MEMORY)
    for method, (_, params) in MEMORY_METHODS.items():
        fn = getattr(memory, method, None)
        _check_signature(f"{MEMORY}.{method}", fn, ["self", *params], inspect)
    for hook, (_, params) in HOOKS.items():
        if hasattr(program.module, hook):
            _check_signature(hook, program.get(hook), list(params), inspect)


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


def offline_units(program: LoadedProgram, segment: Any) -> list[Any]:
    """Offline extraction's stand-in: one ``MemoryUnit`` per message of ``segment`` (any object
    with ``date``, ``session_id`` and :class:`~contract.types.Message` ``messages``), text
    :meth:`~contract.types.Message.text`, metadata by name."""
    ns = vars(program.module)
    return [
        build_record(
            program.memory_unit,
            m.text(),
            ns,
            date=segment.date,
            role=m.role,
            session_id=segment.session_id,
            message_id=m.id,
            message_ids=[m.id],
        )
        for m in segment.messages
    ]
