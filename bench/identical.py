"""Benchmark: every evaluation output of a tree, recorded to compare two trees byte for byte.

For each seed × mode (``offline``: no task model; ``scripted``: task model and judge served by
the fake model server's script) × LLM concurrency (1 and 8), runs ``evolve eval --json`` from
this checkout on BEAM-100K valid (first conversation, hashing embedder) into a fresh cache and
runs folder, and records:

- the report printed (``--json``), with the fields that measure time or name a path removed;
- every trace line (``questions.jsonl``) and the run's ``report.json``, masked the same way;
- the sha256 of every file of the cache (step outputs, ceilings, LLM responses and call log),
  by path, of its content with the timing fields masked (JSON bodies, SQLite rows);
- for ``scripted``, the fake server's counts, and every logged model call (role, purpose,
  request digest), cached or not. At concurrency 8, which of two equal requests in flight at
  once was answered from the cache depends on timing: the cached-call counts, the tokens of
  uncached calls and the server's request count are compared at concurrency 1 only.

``record`` writes one JSON file per combination; ``compare`` prints each difference between
two recordings and exits 1 when there is one. Only the command line is used, so a recording
made by one version of the code compares against another's::

    python bench/identical.py record /tmp/before --data-dir ../shared/data
    # ... change the code ...
    python bench/identical.py record /tmp/after --data-dir ../shared/data
    python bench/identical.py compare /tmp/before /tmp/after

The cache paths are compared after ``--rename OLD=NEW`` (e.g. a renamed cache folder).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ("simple", "dense", "hybrid")
MODES = ("offline", "scripted")
CONCURRENCY = (1, 8)
# One fixed port: the model's address is part of the answer step's cache key.
PORT = 18871
# Fields that measure time or name a temporary path: equal outputs differ there by design.
MASKED = re.compile(
    r"^(seconds|time|elapsed|duration|wall|latency|traces|program|run_dir|started|finished"
    r"|created|when|at|ts|id|.*_seconds|.*_at|.*_ms|.*_s)$"
)


def _without(value: Any, keys: re.Pattern[str]) -> Any:
    """``value`` with every field whose name ``keys`` finds removed, at any depth."""
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if not keys.search(str(k))}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def _mask(value: Any) -> Any:
    return _without(value, MASKED)


def _content(path: Path) -> Any:
    """A file's content with its timing fields masked: JSON (after a ``prismem-`` header line,
    whose checksum covers timings), SQLite (rows of each table, sorted), else the raw bytes."""
    if path.suffix == ".sqlite":
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            out = {}
            for table in sorted(t for t in tables if not t.startswith("sqlite_")):
                cursor = db.execute(f"SELECT * FROM {table}")
                columns = [c[0] for c in cursor.description]
                rows = [_mask(dict(zip(columns, row, strict=True))) for row in cursor]
                out[table] = sorted(json.dumps(r, sort_keys=True) for r in rows)
            return out
    raw = path.read_bytes()
    if path.suffix == ".json":
        header, _, body = raw.partition(b"\n") if raw.startswith(b"prismem-") else (b"", b"", raw)
        return {"header": header.split(b" ")[0].decode(), "body": _mask(json.loads(body))}
    return raw.hex()


def _digests(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith(("-wal", "-shm", "-journal", ".lock")):
            canonical = json.dumps(_content(path), sort_keys=True).encode()
            out[str(path.relative_to(root))] = hashlib.sha256(canonical).hexdigest()
    return out


def _calls(path: Path) -> list[str]:
    """Every logged model call as (role, purpose, request), sorted: what was asked, whether or
    not a duplicate in flight at the same time was answered from the cache."""
    if not path.exists():
        return []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT role, stage, request_hash, error FROM calls").fetchall()
    return sorted(json.dumps(row) for row in rows)


# At concurrency above 1, two equal requests (the judge's, mostly) may be in flight at once:
# whether the second is answered from the cache depends on timing, so which calls were cached
# and the tokens of uncached calls are compared at concurrency 1 only; ``calls`` (every call,
# cached or not) is compared everywhere.
IN_FLIGHT = re.compile(
    r"(cached_calls|prompt_tokens|completion_tokens|cost_usd|requests"
    r"|llm-calls\.sqlite)$"
)


def _start_server() -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "evolve.models.fake_server", "--port", str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    match = re.search(r"(http://\S+)", line)
    if not match:
        server.kill()
        raise SystemExit(f"error: the fake server did not start: {line!r}")
    return server, match.group(1).rstrip("/")


def _server_stats(base: str) -> dict[str, Any]:
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    with urllib.request.urlopen(f"{root}/stats", timeout=10) as reply:
        stats = json.loads(reply.read())
    return {k: v for k, v in stats.items() if k in ("requests", "faults", "by_role", "purposes")}


def record_one(seed: str, mode: str, concurrency: int, data_dir: str, work: Path) -> dict[str, Any]:
    cache, runs = work / "cache", work / "runs"
    command = [
        sys.executable,
        "-m",
        "evolve",
        "eval",
        "--program",
        str(ROOT / "seeds" / f"{seed}.py"),
        "--bench",
        "beam",
        "--split",
        "valid",
        "--conversations",
        "1",
        "--embedder",
        "hashing",
        "--json",
        "--no-progress",
        "--cache-dir",
        str(cache),
        "--runs-dir",
        str(runs),
        "--data-dir",
        data_dir,
        "--jobs",
        "1",
        "--llm-concurrency",
        str(concurrency),
    ]
    server = None
    if mode == "offline":
        command += ["--model", "none"]
    else:
        server, base = _start_server()
        command += ["--model", "openai/scripted", "--judge", "openai/scripted", "--api-base", base]
    env = {**os.environ, "OPENAI_API_KEY": "sk-fake"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
        if done.returncode != 0:
            raise SystemExit(f"error: {seed}/{mode}/{concurrency}: {done.stderr.strip()[-2000:]}")
        stats = _server_stats(base) if server is not None else None
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    run_dirs = sorted(p for p in runs.iterdir() if p.is_dir())
    if len(run_dirs) != 1:
        raise SystemExit(f"error: {seed}/{mode}/{concurrency}: {len(run_dirs)} run folders")
    traces = [
        _mask(json.loads(line))
        for line in (run_dirs[0] / "questions.jsonl").read_text().splitlines()
        if line.strip()
    ]
    traces.sort(key=lambda t: str(t.get("id")))
    return {
        "calls": _calls(cache / "llm-calls.sqlite"),
        "printed": _mask(json.loads(done.stdout)),
        "traces": traces,
        "report": _mask(json.loads((run_dirs[0] / "report.json").read_text())),
        "cache": _digests(cache),
        "server": stats,
    }


def record(out: Path, data_dir: str, seeds: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for mode in MODES:
            for concurrency in CONCURRENCY:
                started = time.monotonic()
                with tempfile.TemporaryDirectory(prefix="identical-") as work:
                    result = record_one(seed, mode, concurrency, data_dir, Path(work))
                name = f"{seed}-{mode}-{concurrency}.json"
                (out / name).write_text(json.dumps(result, indent=1, sort_keys=True))
                files = len(result["cache"])
                print(
                    f"{name}: {len(result['traces'])} traces, {files} cache files, "
                    f"{time.monotonic() - started:.1f} s",
                    flush=True,
                )


def _diff(a: Any, b: Any, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only in {'after' if key not in a else 'before'}")
            else:
                _diff(a[key], b[key], f"{where}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{where}[{i}]", out)
    elif a != b:
        out.append(f"{where}: {str(a)[:120]!r} != {str(b)[:120]!r}")


def compare(before: Path, after: Path, renames: list[str]) -> int:
    differences: list[str] = []
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    for name in names:
        if not (before / name).exists() or not (after / name).exists():
            differences.append(f"{name}: recorded on one side only")
            continue
        a, b = json.loads((before / name).read_text()), json.loads((after / name).read_text())
        for rename in renames:
            old, new = rename.split("=", 1)
            a["cache"] = {re.sub(f"^{re.escape(old)}", new, k): v for k, v in a["cache"].items()}
        if not name.endswith("-1.json"):
            a, b = _without(a, IN_FLIGHT), _without(b, IN_FLIGHT)
        found: list[str] = []
        _diff(a, b, name, found)
        differences += found
        print(f"{name}: {'identical' if not found else f'{len(found)} differences'}")
    for line in differences[:200]:
        print(line)
    return 1 if differences else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--data-dir", default=os.environ.get("PRISMEM_DATA", "../shared/data"))
    rec.add_argument("--seeds", nargs="+", default=list(SEEDS))
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("--rename", action="append", default=[], help="OLD=NEW cache path prefix")
    args = parser.parse_args()
    if args.verb == "record":
        record(args.out, str(Path(args.data_dir).resolve()), args.seeds)
    else:
        sys.exit(compare(args.before, args.after, args.rename))


if __name__ == "__main__":
    main()
