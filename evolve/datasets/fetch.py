"""Download the official BEAM release from the Hugging Face hub into the on-disk layout.

Owns ``evolve data fetch beam``: hub datasets ``Mohammadta/BEAM`` (splits 100K, 500K, 1M) and
``Mohammadta/BEAM-10M`` (split 10M), parquet rows -> ``<data_dir>/beam/chats/<size>/<id>/``
(``chat.json``, ``probing_questions/probing_questions.json``, ``topic.json``) plus one
``checksums.sha256`` per size (docs/benchmarks.md §2.6). `evolve.datasets.beam` reads the result.

Invariants:
- Hub strings holding Python literals are parsed with `ast.literal_eval` only, never `eval`.
- `convert_row` is pure apart from the files it writes; it validates what it writes with the
  loader's own parsers, so a converted conversation always loads. A release conversation put
  in the hub's row format converts back to its own ``chat.json``, byte for byte.
- Network failures fail fast (a few seconds) with one `DataError` line saying where to put the
  files by hand. Parquet is read with pyarrow.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from evolve.datasets import beam
from evolve.datasets.types import DataError

HUB_DATASETS: dict[str, str] = {
    "100K": "Mohammadta/BEAM",
    "500K": "Mohammadta/BEAM",
    "1M": "Mohammadta/BEAM",
    "10M": "Mohammadta/BEAM-10M",
}
DEFAULT_ENDPOINT = "https://huggingface.co"
CHECKSUMS_FILE = "checksums.sha256"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")

Row = dict[str, Any]


# ---------------------------------------------------------------- row -> files


def _plain(value: Any) -> Any:
    """Plain JSON values: numpy arrays/scalars (pandas rows) and tuples become lists/Python."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _plain(value.tolist())
    return value


def parse_literal(value: Any, what: str) -> Any:
    """A hub field that may be a string holding a Python (or JSON) literal, parsed safely."""
    if not isinstance(value, str):
        return _plain(value)
    try:
        return _plain(ast.literal_eval(value.strip()))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{what}: not a plain Python literal ({reason})") from None


def _turns(messages: list[Any], where: str) -> list[list[Row]]:
    """Group a flat batch into turns; a user ``main_question`` starts a new turn."""
    turns: list[list[Row]] = []
    for k, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise DataError(f"{where}: message {k + 1} is {type(msg).__name__}, not an object")
        main = msg.get("role") == "user" and msg.get("question_type") == "main_question"
        if main or not turns:
            turns.append([])
        turns[-1].append(msg)
    return turns


def _batch(raw: Any, number: int, where: str, id_offset: int = 0) -> Row:
    """One file-layout batch from a hub batch (a flat message list, maybe stringified)."""
    raw = parse_literal(raw, where)
    if isinstance(raw, dict) and "turns" in raw:  # already in file layout
        if not id_offset or not isinstance(raw["turns"], list):
            return raw
        turns = [[_offset(m, id_offset, where) for m in t] for t in raw["turns"]]
        return {**raw, "turns": turns}
    if not isinstance(raw, list):
        raise DataError(f"{where}: expected a list of messages, got {type(raw).__name__}")
    if id_offset:
        raw = [_offset(m, id_offset, where) for m in raw]
    # the release keeps each batch's time anchor on its messages and null on the batch
    return {"batch_number": number, "turns": _turns(raw, where), "time_anchor": None}


def _offset(msg: Any, offset: int, where: str) -> Any:
    if not isinstance(msg, dict):
        return msg
    if isinstance(msg.get("id"), bool) or not isinstance(msg.get("id"), int):
        raise DataError(f"{where}: message id {msg.get('id')!r} is not an integer")
    return {**msg, "id": msg["id"] + offset}


def _message_ids(batches: list[Any], where: str) -> list[int]:
    ids: list[int] = []
    for b in batches:
        b = parse_literal(b, where)
        msgs = [m for t in b["turns"] for m in t] if isinstance(b, dict) else b
        ids.extend(m["id"] for m in msgs if isinstance(m, dict) and isinstance(m.get("id"), int))
    return ids


def _is_batch(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def _chat_10m(chat: list[Any], where: str) -> list[Row]:
    """``[{"plan-k": [batches] | batch | None}, ...]`` -> ``[{"plan-k": [file batches]}]``.

    Null values are dropped, consecutive entries of one plan are merged, and each plan's ids
    are shifted past the previous plans' largest id when they overlap (0-based per plan).
    """
    plans: dict[str, list[Any]] = {}
    for i, entry in enumerate(chat):
        entry = parse_literal(entry, f"{where} entry {i + 1}")
        if not isinstance(entry, dict):
            raise DataError(f"{where} entry {i + 1}: expected a {{'plan-k': ...}} object")
        for plan, value in entry.items():
            if value is None:
                continue
            value = parse_literal(value, f"{where} {plan}")
            batches = [value] if _is_batch(value) else value
            if not isinstance(batches, list):
                raise DataError(f"{where} {plan}: expected a list of batches")
            plans.setdefault(plan, []).extend(batches)
    out: list[Row] = []
    max_seen = -1
    for plan, batches in plans.items():
        ids = _message_ids(batches, f"{where} {plan}")
        offset = 0
        if ids and min(ids) <= max_seen:
            offset = max_seen + 1 - min(ids)
        done = [
            _batch(b, j + 1, f"{where} {plan} batch {j + 1}", offset) for j, b in enumerate(batches)
        ]
        max_seen = max([max_seen, *(i + offset for i in ids)])
        out.append({plan: done})
    return out


def _write(path: Path, data: Any) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, ensure_ascii=True, indent=2), encoding="utf-8")
    except OSError as e:
        raise DataError(f"{path}: cannot write ({e.strerror or e})") from None
    return path


def convert_row(row: Row, size: str, out_dir: Path) -> list[Path]:
    """Write one hub row as ``<out_dir>/beam/chats/<size>/<conversation_id>/...``.

    ``out_dir`` is the data root (the folder that holds ``beam/``). Returns the files written.
    """
    if size not in HUB_DATASETS:
        raise DataError(f"unknown BEAM size {size!r} (expected one of {', '.join(HUB_DATASETS)})")
    cid = str(_plain(row.get("conversation_id", ""))).strip()
    if not _SAFE_NAME.match(cid) or cid in (".", ".."):
        raise DataError(f"hub row: unusable conversation_id {row.get('conversation_id')!r}")
    where = f"hub row {size}/{cid}"
    for column in ("chat", "probing_questions", "conversation_seed"):
        if row.get(column) is None:
            raise DataError(f"{where}: missing column {column!r}")
    topic = row["conversation_seed"]
    if isinstance(topic, str):
        try:
            topic = json.loads(topic)
        except json.JSONDecodeError:
            topic = parse_literal(topic, f"{where} conversation_seed")
    topic = _plain(topic)
    if not isinstance(topic, dict):
        raise DataError(f"{where}: conversation_seed is not an object")
    questions = parse_literal(row["probing_questions"], f"{where} probing_questions")
    chat = parse_literal(row["chat"], f"{where} chat")
    if not isinstance(chat, list):
        raise DataError(f"{where}: chat is not a list of batches")
    if size == "10M":
        batches: list[Row] = _chat_10m(chat, f"{where} chat")
    else:
        batches = [_batch(b, j + 1, f"{where} chat batch {j + 1}") for j, b in enumerate(chat)]

    conv_dir = Path(out_dir) / "beam" / "chats" / size / cid
    beam.parse_chat(batches, conv_dir / "chat.json")  # validate before writing
    beam.parse_questions(questions, f"beam/{size}/{cid}", conv_dir / beam.QUESTIONS_FILE)
    return [
        _write(conv_dir / "chat.json", batches),
        _write(conv_dir / beam.QUESTIONS_FILE, questions),
        _write(conv_dir / beam.TOPIC_FILE, topic),
    ]


def write_checksums(size_dir: Path, files: Iterable[Path]) -> Path:
    """``<size_dir>/checksums.sha256`` in ``sha256sum`` format, paths relative to size_dir."""
    lines = []
    for f in sorted({Path(p) for p in files}):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        lines.append(f"{digest}  {f.relative_to(size_dir).as_posix()}\n")
    return _write_text(size_dir / CHECKSUMS_FILE, "".join(lines))


def _write_text(path: Path, text: str) -> Path:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise DataError(f"{path}: cannot write ({e.strerror or e})") from None
    return path


# ---------------------------------------------------------------- hub access


def read_parquet(path: Path) -> list[Row]:
    """The rows of one parquet file of the release, as plain dicts."""
    import pyarrow.parquet as pq

    return [_plain(row) for row in pq.read_table(path).to_pylist()]


def _unreachable(reason: str, data_dir: Path) -> DataError:
    return DataError(
        f"cannot reach the Hugging Face hub ({reason}); download the BEAM release elsewhere and "
        f"place it under {Path(data_dir)}/beam/chats/<size>/<n>/ "
        "(chat.json, probing_questions/probing_questions.json, topic.json)"
    )


def _probe(endpoint: str, timeout: float, data_dir: Path) -> None:
    """Fail in ``timeout`` seconds when the hub's host cannot be reached (huggingface_hub itself
    retries with back-off for ~20 s). Skipped behind a proxy, where a direct connect says little."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise _unreachable(f"{host}:{port}: {e}", data_dir) from None


def _is_split_file(path: str, split: str) -> bool:
    *dirs, base = path.split("/")
    if not base.endswith(".parquet"):
        return False
    stem = base[: -len(".parquet")]
    return split in dirs or stem == split or stem.startswith((f"{split}-", f"{split}_"))


def _split_files(api: Any, repo: str, split: str) -> tuple[list[str], str | None]:
    for revision in (None, "refs/convert/parquet"):
        try:
            names = api.list_repo_files(repo, repo_type="dataset", revision=revision)
        except Exception as e:  # revision missing: try the next one; network errors re-raised
            if revision is None or "Revision" not in type(e).__name__:
                raise
            continue
        chosen = sorted(n for n in names if _is_split_file(n, split))
        if chosen:
            return chosen, revision
    raise DataError(f"hub dataset {repo} has no parquet files for split {split!r}")


def fetch_beam(
    data_dir: Path,
    sizes: Sequence[str] = ("100K", "500K", "1M", "10M"),
    progress: bool = True,
    *,
    endpoint: str | None = None,
    timeout: float = 5.0,
) -> dict[str, int]:
    """Download and convert the requested sizes; returns conversations written per size."""
    unknown = [s for s in sizes if s not in HUB_DATASETS]
    if unknown:
        raise DataError(f"unknown BEAM size(s) {unknown} (expected {', '.join(HUB_DATASETS)})")
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    for var in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        os.environ.setdefault(var, str(max(1, int(timeout))))
    _probe(endpoint, timeout, data_dir)

    from huggingface_hub import HfApi, hf_hub_download
    from rich.progress import Progress

    api = HfApi(endpoint=endpoint)
    counts: dict[str, int] = {}
    with Progress(disable=not progress, transient=False) as bar:
        for size in sizes:
            repo = HUB_DATASETS[size]
            task = bar.add_task(f"BEAM-{size}: listing {repo}", total=None)
            try:
                files, revision = _split_files(api, repo, size)
                local = []
                for name in files:
                    bar.update(task, description=f"BEAM-{size}: downloading {name}")
                    local.append(
                        hf_hub_download(
                            repo,
                            name,
                            repo_type="dataset",
                            revision=revision,
                            endpoint=endpoint,
                            etag_timeout=timeout,
                        )
                    )
            except DataError:
                raise
            except Exception as e:  # any transport/HTTP failure of the hub client
                first = (str(e).splitlines() or [type(e).__name__])[0]
                raise _unreachable(f"{repo}: {type(e).__name__}: {first}", data_dir) from None
            written: list[Path] = []
            counts[size] = total = 0
            bar.update(task, description=f"BEAM-{size}: converting", total=0, completed=0)
            for path in local:
                rows = read_parquet(Path(path))
                total += len(rows)
                bar.update(task, total=total)
                for row in rows:
                    written.extend(convert_row(row, size, data_dir))
                    counts[size] += 1
                    bar.advance(task)
            write_checksums(Path(data_dir) / "beam" / "chats" / size, written)
    return counts
