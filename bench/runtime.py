"""Benchmark: the runtime (``evolve.open_memory``) at 100K, 1M and 10M tokens, through the host.

A measurement script, not a test. For each history it opens a fresh store, adds the history
session by session through the public API (each add: the session log written and fsync'd, the
program's units made in its confined host, ``Memory.index`` there, snapshots as the runtime
takes them), then asks every question with ``context()`` and prints:

- **ingest**: sessions, messages and tokens (4 characters a token) per second of wall time;
- **context latency** p50 / p99 over the questions, each asked twice: cold (a nonce appended,
  so MiniLM encodes the query), then the same again (its embedding cached), beside the
  baseline of encoding such a query alone in this process (after both passes);
- **reopen**: closing (the last snapshot), opening the store again and the first ``context()``
  (snapshot restored in a new host), and the store's size on disk;
- **readers**: ``--readers`` threads asking one user's questions at once (cached query
  embeddings), with one host for the user and with ``read_hosts`` = ``--readers``: contexts per
  second and each call's p50 / p99;
- the peak resident memory of this process and of the user's host (read before closing it).

Histories: the first BEAM-100K conversation, the first BEAM-1M one with a chat file, and
``10M``: the 13 BEAM-1M conversations with chat files joined into one history of about 11.5M
tokens, as ``bench/joined_history.py --out DIR`` writes it (ids offset, the questions of
conversation 3; pass ``--joined DIR``).
The embedder reads the shared embedding cache (``--cache-dir``), so a history encoded once
(by ``bench/scale.py`` or an earlier run) is not encoded again; ``--embedder hashing`` takes
MiniLM out of the figures.

    python bench/runtime.py --data-dir ../shared/data --sizes 100K,1M
    python bench/joined_history.py --data-dir ../shared/data --out /tmp/beam-joined
    python bench/runtime.py --sizes 10M --joined /tmp/beam-joined --embedder hashing
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import evolve
from evolve.datasets.beam import list_conversations, load_conversation
from evolve.datasets.types import Conversation, Question
from evolve.environment import folder
from evolve.evaluation.setup import EvalSetup, make_embedder

ROOT = Path(__file__).resolve().parents[1]
CHARS_PER_TOKEN = 4


def history(args: argparse.Namespace, size: str) -> tuple[Conversation, list[Question]]:
    """A BEAM conversation of ``size``: the first with a chat file, or for 10M the joined
    history that ``bench/joined_history.py`` wrote under ``--joined``."""
    if size == "10M":
        return load_conversation(args.joined, "10M", "1")
    conv_id = list_conversations(args.data_dir, size)[0]
    return load_conversation(args.data_dir, size, conv_id)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def hosts_peak_mb() -> float:
    """The largest peak resident memory (VmHWM) among this process's live descendants: the
    confined hosts and their reapers."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    mine, peak = os.getpid(), 0.0
    for pid in parent:
        up = parent.get(pid)
        while up not in (None, 0, 1, mine):
            up = parent.get(up)  # type: ignore[arg-type]
        if up != mine:
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]) / 1024)
    return peak


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(size: str, args: argparse.Namespace) -> None:
    conversation, questions = history(args, size)
    n_messages = sum(len(s.messages) for s in conversation.sessions)
    tokens = conversation.n_chars / CHARS_PER_TOKEN
    setup = EvalSetup(cache_dir=str(args.cache_dir), task_model=None, embedder=args.embedder)
    with tempfile.TemporaryDirectory(prefix="prismem-runtime-") as tmp:
        store = Path(tmp) / "store"
        memory = evolve.open_memory(args.program, store, setup=setup, notice=lambda _: None)
        began = time.perf_counter()
        for session in conversation.sessions:
            memory.add(session.messages, user="bench", date=session.date,
                       session_id=session.session_id)  # fmt: skip
        ingest = time.perf_counter() - began
        walls: dict[str, list[float]] = {"cold": [], "cached": []}
        nonce = f" [{uuid.uuid4().hex[:8]}]"  # the first pass misses the embedding cache
        for kind in walls:  # the second asks the same queries: cached
            for q in questions:
                t0 = time.perf_counter()
                memory.context(q.question + nonce, user="bench", date=q.question_date)
                walls[kind].append((time.perf_counter() - t0) * 1000)
        embedder = make_embedder(setup.embedder, setup.cache_dir)  # the runtime's own
        alone = []  # the baseline: encoding the query alone, in process (another nonce)
        for q in questions:
            t0 = time.perf_counter()
            embedder.embed([f"{q.question} [{uuid.uuid4().hex[:8]}]"])
            alone.append((time.perf_counter() - t0) * 1000)
        host_peak = hosts_peak_mb()
        t0 = time.perf_counter()
        memory.close()
        closing = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = evolve.open_memory(args.program, store, setup=setup, notice=lambda _: None)
        opening = time.perf_counter() - t0
        t0 = time.perf_counter()
        again.context(questions[0].question, user="bench", date=questions[0].question_date)
        first = time.perf_counter() - t0
        again.close()
        on_disk = folder_bytes(store)
        together = {hosts: readers(args, store, setup, questions, hosts)
                    for hosts in sorted({1, args.readers})}  # fmt: skip
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{size}: {len(conversation.sessions)} sessions, {n_messages} messages, "
          f"{tokens / 1e6:.2f}M tokens, {len(questions)} questions", flush=True)  # fmt: skip
    print(
        f"  ingest {ingest:.1f} s: {len(conversation.sessions) / ingest:.1f} sessions/s, "
        f"{n_messages / ingest:.0f} messages/s, {tokens / ingest / 1000:.1f}K tokens/s"
    )
    print(f"  baseline: encoding a new query alone, in process: p50 {pct(alone, 0.5):.1f} ms, "
          f"p99 {pct(alone, 0.99):.1f} ms")  # fmt: skip
    for kind, values in walls.items():
        print(f"  context() {kind} query embedding: p50 {pct(values, 0.5):.1f} ms, "
              f"p99 {pct(values, 0.99):.1f} ms")  # fmt: skip
    print(
        f"  close {closing:.1f} s; reopen {opening:.1f} s (sandbox check included) + first "
        f"context {first:.1f} s (snapshot restored in a new host); store {on_disk / 1e6:.1f} MB"
    )
    for hosts, (rate, walls_ms) in together.items():
        print(f"  {args.readers} readers of the user at once, read_hosts={hosts}: "
              f"{rate:.0f} contexts/s, each p50 {pct(walls_ms, 0.5):.1f} ms, "
              f"p99 {pct(walls_ms, 0.99):.1f} ms")  # fmt: skip
    print(f"  peak RSS: this process {me:.0f} MB, the user's host {host_peak:.0f} MB",
          flush=True)  # fmt: skip


def readers(
    args: argparse.Namespace,
    store: Path,
    setup: EvalSetup,
    questions: list[Question],
    hosts: int,
) -> tuple[float, list[float]]:
    """``args.readers`` threads ask every question of one user at once (query embeddings
    cached), over the store opened with ``read_hosts=hosts``: contexts per second of wall time
    and each call's milliseconds. The extra hosts start during a first, unmeasured round."""
    memory = evolve.open_memory(args.program, store, setup=setup, notice=lambda _: None,
                                read_hosts=hosts, max_live=max(hosts, 8))  # fmt: skip
    walls: list[float] = []

    def ask(record: bool) -> None:
        for q in questions:
            t0 = time.perf_counter()
            memory.context(q.question, user="bench", date=q.question_date)
            if record:
                walls.append((time.perf_counter() - t0) * 1000)

    with ThreadPoolExecutor(args.readers) as pool:
        list(pool.map(ask, [False] * args.readers))
        began = time.perf_counter()
        list(pool.map(ask, [True] * args.readers))
        wall = time.perf_counter() - began
    memory.close()
    return len(walls) / wall, walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "prismem")
    parser.add_argument("--program", type=Path, default=ROOT / "seeds" / "dense.py")
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--sizes", default="100K,1M,10M")
    joined = Path(tempfile.gettempdir()) / "beam-joined"
    parser.add_argument("--joined", type=Path, default=joined,
                        help="bench/joined_history.py's --out (for 10M)")  # fmt: skip
    parser.add_argument("--readers", type=int, default=2,
                        help="threads reading one user at once (and its read_hosts)")  # fmt: skip
    args = parser.parse_args()
    print(f"$ python bench/runtime.py --sizes {args.sizes} --embedder {args.embedder} "
          f"--program {args.program.name}")  # fmt: skip
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)  # fmt: skip
    for size in args.sizes.split(","):
        measure(size.strip(), args)


if __name__ == "__main__":
    main()
