"""The wire between the optimizer and a sandboxed program host: length-prefixed frames.

A frame is a JSON object plus zero or more binary blobs (numpy arrays travel as raw float32
bytes with their shape in the JSON). Nothing is ever unpickled on the optimizer's side: the
host is hostile, so the reader bounds every length before allocating and rejects anything that
is not plain JSON.

Layout: ``>II`` (JSON length; the frame's kind code times 256 plus its number of blobs), the
JSON bytes, then per blob ``>Q`` length and the bytes. The kind code is the index of the
header's ``kind`` in :data:`KINDS` (0, ``result``, for a frame without one), so a reader given
per-kind bounds (``read_frame(..., bounds=...)``) knows from the first eight bytes how much
the frame may hold, before it reads any of it, and refuses a header whose ``kind`` is not the
one declared.

Limits: a frame holds at most :data:`MAX_JSON_BYTES` of JSON and :data:`MAX_BLOBS` blobs of at
most :data:`MAX_BLOB_BYTES` each; the reader may be given a tighter bound for a whole frame
(:mod:`sandbox.isolate` bounds each host answer by what its request can return). So that no
frame has to carry a whole history, a memory grows one session per request and its state
(at most :data:`contract.state.MAX_STATE_BYTES`) crosses in chunks of at most
:data:`STATE_CHUNK_BYTES`, one per frame (:mod:`sandbox.serve`, :mod:`evolve.evaluation.pipeline`).

Decoding is bounded before it starts: the JSON bytes are scanned first (:func:`json_cost`,
vectorised, in slices of :data:`SCAN_SLICE` bytes, so the scan itself holds a few times that
at most) and a frame is refused whose JSON holds more than :func:`max_items` values (every
``,``, ``:``, ``[`` and ``{`` outside strings starts one; one item for the whole) for the
bytes it was allowed, or nests deeper than :data:`MAX_DEPTH`. A value costs ``json.loads`` at
most about 100 bytes and a character of a string at most 4, so decoding a frame allowed A
bytes allocates at most about 3 A + 4 × its JSON's bytes, however the JSON is shaped. The JSON
is UTF-8 and decoded as such (invalid UTF-8 is malformed): ``json.loads`` given bytes would
detect UTF-16 or UTF-32, whose code units hide quotes from a byte scan.

The functions used are bound at import, before any program runs in the host, so a program that
patched ``json`` could not rewrite the host's frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from json import dumps as _dumps
from json import loads as _loads
from struct import pack as _pack
from struct import unpack as _unpack
from typing import IO, Any

import numpy as np

_frombuffer, _cumsum, _count_nonzero = np.frombuffer, np.cumsum, np.count_nonzero
_xor_accumulate = np.bitwise_xor.accumulate
_STEP = np.zeros(256, np.int8)  # +1 opens an array or object, -1 closes one
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_STARTS = np.zeros(256, np.bool_)  # a value starts after each of these (and at the start)
_STARTS[list(b",:[{")] = True
_QUOTE = ord('"')

MAX_JSON_BYTES = 64 << 20
MAX_DEPTH = 32  # arrays and objects nested in one another (a record is nested 4 deep)
ITEM_BYTES = 32  # a frame allowed A bytes holds at most MIN_ITEMS + A // ITEM_BYTES values
MIN_ITEMS = 4096
SCAN_SLICE = 1 << 20
MAX_BLOBS = 8
MAX_BLOB_BYTES = 512 << 20
STATE_CHUNK_BYTES = 16 << 20  # a memory state crosses in chunks of at most this many bytes
KINDS = ("result", "error", "backend", "ready")  # a frame's kind code is its index here


class WireError(Exception):
    """The peer sent something that is not a well-formed, bounded frame (or hung up)."""


def encode_frame(header: dict[str, Any], blobs: list[bytes] | None = None) -> bytes:
    blobs = blobs or []
    data = _dumps(header).encode()
    kind = header.get("kind")
    code = KINDS.index(kind) if kind in KINDS else 0
    parts = [_pack(">II", len(data), code << 8 | len(blobs)), data]
    for blob in blobs:
        parts += [_pack(">Q", len(blob)), blob]
    return b"".join(parts)


def reader(inp: IO[bytes]) -> Callable[[int], bytes]:
    """A blocking exact-read function over a binary stream."""

    def recv(n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = inp.read(left)
            if not chunk:
                raise WireError("peer closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    return recv


def max_items(allowed: int) -> int:
    """The most values the JSON of a frame allowed ``allowed`` bytes may hold."""
    return MIN_ITEMS + allowed // ITEM_BYTES


def json_cost(data: bytes) -> tuple[int, int]:
    """(values, deepest nesting) of JSON text, counted outside strings and without decoding
    it: an upper bound of what ``json.loads`` builds from it, valid JSON or not (a decoder
    that stops at an error has built only what the text before it holds). Escaped
    backslashes, then escaped quotes, are dropped first, so every quote left opens or closes
    a string."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    values, depth, deepest, inside = 1, 0, 0, False
    codes = _frombuffer(data, np.uint8)
    for start in range(0, len(codes), SCAN_SLICE):
        part = codes[start : start + SCAN_SLICE]
        quoted = _xor_accumulate(part == _QUOTE)  # True from an opening quote to its closing
        if inside:
            quoted = ~quoted
        inside = bool(quoted[-1])
        outside = ~quoted
        values += int(_count_nonzero(_STARTS[part] & outside))
        levels = _cumsum(_STEP[part] * outside, dtype=np.int32)
        deepest = max(deepest, depth + int(levels.max()))
        depth += int(levels[-1])
    return values, deepest


def read_frame(
    recv: Callable[[int], bytes],
    max_bytes: int | None = None,
    bounds: Mapping[str, int] | None = None,
) -> tuple[dict[str, Any], list[bytes]]:
    """One frame through ``recv(n)``, which returns exactly n bytes or raises. ``max_bytes``
    bounds the JSON and blobs together, checked from each length before its bytes are read;
    ``bounds`` (kind -> bytes), when given, bounds them by the kind the frame declares instead,
    refuses a kind not named there and a header whose ``kind`` is not the declared one."""
    n_json, word = _unpack(">II", recv(8))
    code, n_blobs = word >> 8, word & 0xFF
    if code >= len(KINDS):
        raise WireError(f"malformed frame: kind code {code}")
    if n_json > MAX_JSON_BYTES or n_blobs > MAX_BLOBS:
        raise WireError(f"frame too large ({n_json} bytes of JSON, {n_blobs} blobs)")
    if bounds is not None:
        if KINDS[code] not in bounds:
            raise WireError(f"unexpected frame kind {KINDS[code]!r}")
        max_bytes = bounds[KINDS[code]]
    left = MAX_JSON_BYTES + MAX_BLOBS * MAX_BLOB_BYTES if max_bytes is None else max_bytes
    if n_json > left:
        raise WireError(f"frame too large ({n_json} bytes of JSON; at most {left} expected)")
    data = recv(n_json)
    (values, deepest), most = json_cost(data), max_items(min(left, MAX_JSON_BYTES))
    if values > most:
        raise WireError(f"frame of {values:,} JSON items; at most {most:,} expected")
    if deepest > MAX_DEPTH:
        raise WireError(f"JSON nested deeper than {MAX_DEPTH} ({deepest} levels)")
    left -= n_json
    try:  # as UTF-8 only: json.loads(bytes) would detect UTF-16/32, whose quotes the scan missed
        header = _loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"malformed frame: {type(exc).__name__}") from None
    del data
    if not isinstance(header, dict):
        raise WireError("malformed frame: not a JSON object")
    if bounds is not None and header.get("kind") != KINDS[code]:
        kind = header.get("kind")
        shown = repr(kind)[:40] if isinstance(kind, str | None) else type(kind).__name__
        raise WireError(f"malformed frame: a {shown} header in a {KINDS[code]!r} frame")
    blobs = []
    for _ in range(n_blobs):
        (size,) = _unpack(">Q", recv(8))
        if size > min(MAX_BLOB_BYTES, left):
            raise WireError(f"blob too large ({size} bytes)")
        left -= size
        blobs.append(recv(size))
    return header, blobs


def pack_array(array: np.ndarray) -> tuple[dict[str, Any], bytes]:
    arr = np.ascontiguousarray(array, dtype=np.float32)
    return {"shape": list(arr.shape)}, arr.tobytes()


def unpack_array(meta: Any, blob: bytes) -> np.ndarray:
    shape = meta.get("shape") if isinstance(meta, dict) else None
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise WireError("malformed array header")
    if int(np.prod(shape, dtype=np.int64)) * 4 != len(blob):
        raise WireError("array size does not match its shape")
    return np.frombuffer(blob, dtype=np.float32).reshape(shape).copy()
