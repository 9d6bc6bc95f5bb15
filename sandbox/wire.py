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
:data:`STATE_CHUNK_BYTES`, one per frame (:mod:`sandbox.serve`, :mod:`evolve.pipeline`).

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

MAX_JSON_BYTES = 64 << 20
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
    left -= n_json
    try:
        header = _loads(recv(n_json))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"malformed frame: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise WireError("malformed frame: not a JSON object")
    if bounds is not None and header.get("kind") != KINDS[code]:
        kind = header.get("kind")
        raise WireError(f"malformed frame: a {kind!r} header in a {KINDS[code]!r} frame")
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
