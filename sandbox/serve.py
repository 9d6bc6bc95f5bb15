"""Requests served inside the host: loading a program, the run-time tiers, evaluation steps.

Runs only inside :mod:`sandbox.host`, after confinement. Holds at most one loaded program and
one live memory, which grows one session per request (``open``, then ``add`` per session).
Data crosses the wire as JSON (records as dicts, segments as plain dicts) and memory state as
the restricted pickle of :mod:`contract.state` (unpickled only here, never by the optimizer),
in chunks of at most :data:`~sandbox.wire.STATE_CHUNK_BYTES` (``dump`` then ``state_chunk``
out, ``state_part`` then ``restore`` in), so no frame carries a whole history.

The rules a request enforces on the program's answers raise :class:`RuleError` (a
:class:`~contract.types.ContractError`, rule ``contract``): ``index`` returns None, ``retrieve``
an exact ``str`` (a subclass could lie about its length), and the backend is left as it was
given (class, methods, attributes; ``calls``, the host's own counter, aside) by ``Memory()``,
``index`` and ``retrieve``. Opening or restoring a memory lets the previous one go; opening
also collects its garbage before the program runs again (a probe run's CPU time starts
clean), restoring does not (evaluation may restore a memory for every question).

Records are checked once: what the optimizer hands over (task-LLM records it validated, units
and queries this host returned earlier) is built into the program's classes without being
checked again (:func:`_handed`); what the program's hooks return is checked here, against the
schema, before it crosses back (:func:`_record_dict`).

The backend given to ``Memory`` is always a :class:`RemoteBackend`, which forwards
``embed``/``complete`` to the optimizer as ``backend`` frames. There are no requests of the
sandbox tiers here: tiers 3 and 4 drive a program through these same requests
(:mod:`sandbox.tiers`), with the optimizer answering the backend (:mod:`sandbox.probe`), so a
program meets the same code, backend and call path in a check as in an evaluation, and every
verdict is made on the optimizer's side. When a memory's state cannot be stored, ``dump`` says
why and, asked to, gives :func:`contract.state.state_digest` of it instead, which the smoke
tier compares around a retrieve.
"""

from __future__ import annotations

import gc
import traceback
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import IO, Any

import numpy as np

from contract.program import LoadedProgram, check_shapes, load_program, offline_units
from contract.records import build_record, json_schema, validate_record
from contract.spec import INSTRUCTIONS, OUT_CHAR_BUDGET
from contract.state import MAX_STATE_BYTES, dump_state, load_state, state_digest
from contract.types import BackendError, ContractError, Message, Segment
from sandbox.wire import STATE_CHUNK_BYTES, encode_frame, read_frame, unpack_array


class RuleError(ContractError):
    """The program broke a rule a request enforces on its answers (see the module docstring)."""


class RemoteBackend:
    """``embed`` and ``complete`` answered by the optimizer, with a per-call budget."""

    def __init__(self, server: Server, dim: int, max_complete_calls: int) -> None:
        self.dim = dim
        self.max_complete_calls = max_complete_calls
        self._server = server
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = list(texts)
        if not all(type(t) is str for t in items):
            raise TypeError("backend.embed takes a list of strings")
        header, blobs = self._server.ask({"method": "embed", "texts": items})
        return unpack_array(header.get("array"), blobs[0])

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        if self.calls >= self.max_complete_calls:
            raise BackendError(f"backend.complete: budget of {self.max_complete_calls} calls spent")
        self.calls += 1
        header, _ = self._server.ask(
            {"method": "complete", "prompt": str(prompt), "max_tokens": int(max_tokens)}
        )
        return str(header["text"])


def _backend_state(backend: RemoteBackend) -> tuple[Any, ...]:
    """What a program must leave alone: the backend's class, methods and attributes."""
    cls = type(backend)
    settings = sorted((k, v) for k, v in vars(backend).items() if k != "calls")
    return (cls, cls.embed, cls.complete, settings)


def segment_from(data: dict[str, Any]) -> Segment:
    messages = tuple(
        Message(str(m["id"]), str(m["role"]), str(m["content"])) for m in data["messages"]
    )
    return Segment(str(data["session_id"]), data.get("date"), messages)


class Server:
    def __init__(self, out: IO[bytes], recv: Callable[[int], bytes], builtins: dict[str, Any]):
        self.out = out
        self.recv = recv
        self.builtins = builtins
        self.program: LoadedProgram | None = None
        self.memory: Any = None
        self.backend: RemoteBackend | None = None
        self._given: tuple[Any, ...] = ()  # the backend's state as it was given
        self._outgoing = b""  # the state being dumped, until its last chunk is sent
        self._incoming = bytearray()  # the parts of a state to restore

    def send(self, header: dict[str, Any], blobs: list[bytes] | None = None) -> None:
        self.out.write(encode_frame(header, blobs))
        self.out.flush()

    def ask(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        """A backend request to the optimizer; its answer, or BackendError."""
        self.send({"kind": "backend", **request})
        header, blobs = read_frame(self.recv)
        if "error" in header:
            raise BackendError(str(header["error"]))
        return header, blobs

    def run(self) -> None:
        while True:
            header, blobs = read_frame(self.recv)
            op = header.get("op")
            if op == "exit":
                return
            handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
            if handler is None or not isinstance(op, str):
                self.send({"kind": "error", "type": "protocol", "error": f"unknown op {op!r}"})
                continue
            path = self.program.path if self.program else str(header.get("path", ""))
            try:
                result, out_blobs = handler(header, blobs)
            except Exception as exc:
                self.send({"kind": "error", **error_frame(exc, path, op)})
            else:
                self.send({"kind": "result", "result": result}, out_blobs)

    # -- loading and the tiers -------------------------------------------------------------

    def _program(self) -> LoadedProgram:
        if self.program is None:
            raise RuntimeError("no program loaded")
        return self.program

    def op_load(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """Tier 1 at run time: the module executes and defines the required names. Returns the
        instruction strings the loaded module holds (name -> value), which the optimizer's
        prompts use; the optimizer checks their types and lengths itself."""
        self.program = load_program(str(req["source"]), str(req["path"]), self.builtins, False)
        names = INSTRUCTIONS.values()
        return {"instructions": {n: str.__str__(self.program.get(n)) for n in names}}, []

    def op_schema(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """Tier 2: field types and signatures; returns the record schemas."""
        program = self._program()
        check_shapes(program)
        ns = vars(program.module)
        return {
            "MemoryUnit": json_schema(program.memory_unit, ns),
            "Query": json_schema(program.query, ns),
        }, []

    # -- evaluation steps --------------------------------------------------------------------

    def op_units(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """Extraction's program side: records (or offline stand-ins) → hook → unit dicts."""
        program = self._program()
        ns, cls = vars(program.module), program.memory_unit
        segment = segment_from(req["segment"])
        if req.get("records") is None:
            units = offline_units(program, segment)
        else:
            units = [_handed(cls, r) for r in req["records"]]
        hook = program.hook("postprocess_units")
        if hook is not None:
            units = hook(units, segment)
        return [_record_dict(u, cls, ns) for u in units], []

    def op_query(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """Planning's program side: a record (or the question itself) → hook → query dict."""
        program = self._program()
        ns, cls = vars(program.module), program.query
        question = str(req["question"])
        if req.get("record") is None:
            query = build_record(cls, question, ns, date=req.get("date"))
        else:
            query = _handed(cls, req["record"])
        hook = program.hook("postprocess_query")
        if hook is not None:
            query = hook(query, question)
        return _record_dict(query, cls, ns), []

    def _new_backend(self, req: dict[str, Any], collect: bool = False) -> RemoteBackend:
        """A fresh backend for a new memory, the previous memory let go (and with ``collect``,
        its garbage collected)."""
        self.memory = self.backend = None
        if collect:
            gc.collect()
        self.backend = RemoteBackend(self, int(req["dim"]), int(req["max_complete_calls"]))
        self._given = _backend_state(self.backend)
        return self.backend

    def _check_backend(self) -> None:
        if self.backend is None or _backend_state(self.backend) != self._given:
            raise RuleError("Memory modified the backend it was given; treat it as read-only")

    def op_open(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """A new, empty memory: it grows one session at a time (:meth:`op_add`)."""
        program = self._program()
        self._outgoing, self._incoming = b"", bytearray()
        self.memory = program.get("Memory")(self._new_backend(req, collect=True))
        self._check_backend()
        return None, []

    def op_add(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """Index one session's units into the live memory (sessions come in order)."""
        if self.memory is None or self.backend is None:
            raise RuntimeError("no memory opened")
        cls = self._program().memory_unit
        self.backend.calls = 0
        units = [_handed(cls, r) for r in req["units"]]
        if self.memory.index(units, segment_from(req["segment"])) is not None:
            raise RuleError("Memory.index must return None")
        self._check_backend()
        return None, []

    def op_dump(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """The live memory's state, when it can be stored (:mod:`contract.state`): its size
        here, its bytes through :meth:`op_state_chunk`, chunk after chunk; otherwise the reason,
        and with ``digest`` asked for, the state's digest (None when even that walk fails)."""
        if self.memory is None or self.backend is None:
            raise RuntimeError("no memory opened")
        self._outgoing = b""
        module = self._program().module.__name__
        try:
            state = dump_state(self.memory, module, self.backend)
        except Exception as exc:  # not storable: the optimizer will rebuild it next time
            reason = f"{type(exc).__name__}: {exc}"[:300]
        else:
            if state and len(state) <= MAX_STATE_BYTES:
                self._outgoing = state
                return {"stored": True, "bytes": len(state)}, []
            reason = f"a state of {len(state)} bytes"
        if not req.get("digest"):
            return {"stored": False, "reason": reason}, []
        digest = state_digest(self.memory, module, self.backend)
        return {"stored": False, "reason": reason, "digest": digest}, []

    def op_state_chunk(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """The bytes of the last dumped state from ``offset``, at most STATE_CHUNK_BYTES; the
        state is let go once its last chunk is sent."""
        offset, state = int(req["offset"]), self._outgoing
        if not 0 <= offset < len(state):
            raise RuntimeError("no dumped state left at that offset")
        chunk = state[offset : offset + STATE_CHUNK_BYTES]
        if offset + len(chunk) >= len(state):
            self._outgoing = b""
        return None, [chunk]

    def op_state_part(self, req: dict[str, Any], blobs: list[bytes]) -> tuple[Any, list[bytes]]:
        """The next chunk of a state to restore (:meth:`op_restore` takes them all)."""
        if len(blobs) != 1 or len(blobs[0]) > STATE_CHUNK_BYTES:
            raise RuntimeError("a state part is one blob of at most STATE_CHUNK_BYTES")
        if len(self._incoming) + len(blobs[0]) > MAX_STATE_BYTES:
            self._incoming = bytearray()
            raise RuntimeError(f"a state of more than {MAX_STATE_BYTES} bytes")
        self._incoming += blobs[0]
        return None, []

    def op_restore(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        """The memory restored from the parts sent since the last restore or open."""
        program = self._program()
        data, self._incoming = bytes(self._incoming), bytearray()
        backend = self._new_backend(req)
        self.memory = load_state(program.get("Memory"), data, vars(program.module), backend)
        return None, []

    def op_retrieve(self, req: dict[str, Any], _: list[bytes]) -> tuple[Any, list[bytes]]:
        program = self._program()
        if self.memory is None or self.backend is None:
            raise RuntimeError("no memory built")
        self.backend.calls = 0
        text = self.memory.retrieve(_handed(program.query, req["query"]))
        if type(text) is not str:  # a subclass could lie about its length
            raise RuleError(f"Memory.retrieve must return str, got {type(text).__name__}")
        self._check_backend()
        return {"text": text[:OUT_CHAR_BUDGET], "raw_chars": len(text)}, []


def _handed(cls: type, record: dict[str, Any]) -> Any:
    """A record the optimizer already checked against ``cls``'s schema, as a ``cls``."""
    return cls(**record)


def error_frame(exc: BaseException, path: str, op: str) -> dict[str, Any]:
    """What the optimizer learns of a failed request: the exception's class, one line for a
    model to act on, the program line it came from (None when no frame of ``path`` raised) and
    the rule: ``contract`` for a contract rule (:class:`RuleError` included), ``exception``
    otherwise."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    line = frames[-1].lineno if frames else None
    where = f" (line {line}: {frames[-1].line})" if frames else ""
    text = f"{type(exc).__name__}: {exc}{where}".replace("\n", " ")[:1000]
    rule = "contract" if isinstance(exc, ContractError) else "exception"
    return {"type": type(exc).__name__, "error": text, "line": line, "rule": rule}


def _record_dict(record: Any, cls: type, ns: dict[str, Any]) -> dict[str, Any]:
    """A hook's output as a plain dict, checked again against the schema."""
    if not isinstance(record, cls):
        raise TypeError(f"expected a {cls.__name__}, got {type(record).__name__}")
    return asdict(validate_record(cls, asdict(typing.cast(Any, record)), ns))
