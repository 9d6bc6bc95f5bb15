"""Measurement: a BEAM history of about 10M tokens evaluated through the sandbox (``evolve eval``).

A measurement script, not a test. It joins the BEAM-1M conversations that have a chat file under
``--data-dir`` into one history and writes it, outside the repository, as a BEAM-10M
conversation (``<out>/beam/chats/10M/1/``): ``chat.json`` in the 10M layout (one plan per joined
conversation, in conversation order, so session ids stay unique), every message id offset past
the conversation before it, the probing questions of one conversation (``--questions-of``)
with their evidence ids offset the same way, and its ``topic.json``. With ``--run`` it then runs

    evolve eval --program seeds/dense.py --split all:10M --embedder hashing --data-dir <out>

with a fresh cache, samples ``/proc`` every 0.2 s and prints the exit status, the wall time,
the errors the report counts, and the peak resident memory (``VmHWM``) of the optimizer's
processes (the CLI and its workers) and of the program hosts (``sandbox.host``), the largest
of each.

    python bench/joined_history.py --data-dir ../shared/data --out /tmp/beam-joined --run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evolve.datasets.beam import QUESTIONS_FILE, chat_file, list_conversations
from evolve.environment import folder

ROOT = Path(__file__).resolve().parents[1]


def _offset_ids(value: Any, offset: int) -> Any:
    """``source_chat_ids`` (ints, numeric strings, nested lists or dicts) moved by ``offset``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value + offset
    if isinstance(value, str) and value.strip().isdigit():
        return str(int(value) + offset)
    if isinstance(value, list):
        return [_offset_ids(v, offset) for v in value]
    if isinstance(value, dict):
        return {k: _offset_ids(v, offset) for k, v in value.items()}
    return value


def build(data_dir: Path, out: Path, questions_of: str) -> dict[str, int]:
    """Write the joined history under ``out``; return its size in conversations, sessions,
    messages and characters."""
    convs = list_conversations(data_dir, "1M")
    if questions_of not in convs:
        raise SystemExit(f"error: BEAM-1M conversation {questions_of} has no chat file")
    joined: list[dict[str, Any]] = []
    offset, offsets, sessions, messages, chars = 0, {}, 0, 0, 0
    for conv in convs:
        cdir = data_dir / "beam" / "chats" / "1M" / conv
        path = chat_file(cdir)
        assert path is not None
        batches = json.loads(path.read_text())
        offsets[conv], top = offset, offset
        for batch in batches:
            sessions += 1
            for turn in batch["turns"]:
                for message in turn:
                    message["id"] = int(message["id"]) + offset
                    top = max(top, message["id"])
                    messages += 1
                    chars += len(message["content"])
        joined.append({f"plan-{conv}": batches})
        offset = top + 1
    target = out / "beam" / "chats" / "10M" / "1"
    (target / QUESTIONS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (target / "chat.json").write_text(json.dumps(joined))
    source = data_dir / "beam" / "chats" / "1M" / questions_of
    questions = json.loads((source / QUESTIONS_FILE).read_text())
    for items in questions.values():
        for q in items:
            if "source_chat_ids" in q:
                q["source_chat_ids"] = _offset_ids(q["source_chat_ids"], offsets[questions_of])
    (target / QUESTIONS_FILE).write_text(json.dumps(questions))
    (target / "topic.json").write_text((source / "topic.json").read_text())
    return {"conversations": len(convs), "sessions": sessions, "messages": messages,
            "chars": chars}  # fmt: skip


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                pass
    return out


def _peak_kib(pid: int) -> tuple[str, int] | None:
    """(command line, VmHWM in KiB) of a live process, None when it is gone."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return cmd, int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def run(out: Path, program: str) -> dict[str, Any]:
    """``evolve eval`` over the joined history, with peak memory per kind of process."""
    work = Path(tempfile.mkdtemp(prefix="joined-eval-"))
    cmd = [str(Path(sys.executable).parent / "evolve"), "eval", "--program", program,
           "--split", "all:10M", "--embedder", "hashing", "--data-dir", str(out), "--json",
           "--no-progress", "--cache-dir", str(work / "cache"),
           "--runs-dir", str(work / "runs")]  # fmt: skip
    began = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peaks: dict[int, tuple[str, int]] = {}
    while proc.poll() is None:
        for pid in _tree(proc.pid):
            got = _peak_kib(pid)
            if got is not None and got[1] >= peaks.get(pid, ("", 0))[1]:
                peaks[pid] = got
        time.sleep(0.2)
    stdout, stderr = proc.communicate()
    seconds = time.monotonic() - began
    hosts = [kib for cmd, kib in peaks.values() if "sandbox.host" in cmd]
    optimizer = [kib for cmd, kib in peaks.values() if "sandbox.host" not in cmd]
    try:
        report = json.loads(stdout)
    except ValueError:
        report = None
    return {
        "exit": proc.returncode,
        "seconds": round(seconds, 1),
        "errors": report.get("meta", {}).get("errors") if isinstance(report, dict) else None,
        "meta": {k: v for k, v in report["meta"].items() if k in ("questions", "seconds", "time")}
        if isinstance(report, dict)
        else None,
        "stages": report.get("stages") if isinstance(report, dict) else None,
        "optimizer_peak_mib": round(max(optimizer, default=0) / 1024),
        "host_peak_mib": round(max(hosts, default=0) / 1024),
        "processes": {"optimizer": len(optimizer), "hosts": len(hosts)},
        "stderr_tail": stderr.decode(errors="replace").strip().splitlines()[-3:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data-dir", default=folder("DATA") or "../shared/data")
    parser.add_argument("--out", required=True, help="where to write the joined history")
    parser.add_argument("--questions-of", default="3", help="BEAM-1M conversation (default 3)")
    parser.add_argument("--program", default="seeds/dense.py")
    parser.add_argument("--run", action="store_true", help="then run evolve eval on it")
    args = parser.parse_args()
    size = build(Path(args.data_dir), Path(args.out), args.questions_of)
    print(json.dumps({"history": {**size, "tokens_at_4_chars": size["chars"] // 4}}))
    if args.run:
        print(json.dumps(run(Path(args.out), args.program)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
