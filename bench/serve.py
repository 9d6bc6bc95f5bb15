"""Benchmark: a 1M-token memory served — ``context`` and ``add`` in process, over HTTP and MCP.

A measurement script, not a test. It builds (once) a store where each of ``--users`` users
holds the same BEAM-1M conversation (the first with a chat file unless ``--conv``; about 0.9M
tokens each), through the public API (``evolve.open_memory``, offline, ``--embedder``). The
built store is kept as ``<--work>/built-<embedder>-<conv>-u<users>/`` and reused by later runs
(the first MiniLM build encodes the conversation once, for the first user; each other user's
embedding cache starts as a copy of that user's, so its add reads the same vectors from it
instead of encoding them again). Every run measures a fresh copy of it, so the adds of one run
never reach the next. Then, at 1, 4 and 16 concurrent clients (``--clients``):

- ``context`` of BEAM's probing questions of that conversation, request k asking user
  ``k % users`` question ``k // users`` (distinct questions, clients spread over the users);
  every (user, question) is asked once before, unmeasured, so the figures are those of a cached
  query embedding (as the runtime's "query cached" figure) and of started hosts (and
  ``WARM_ADDS`` sessions are added before, so the embedding model is loaded and warm where it
  runs);
- ``add`` of small new sessions (two messages, text never seen, so MiniLM encodes them): spread
  over the users ("users"), and all to the first user ("one user", whose writes take turns);

through four ways in:

- ``in-process``: ``evolve.open_memory`` called from threads (the runtime alone);
- ``service``: :class:`evolve.server.service.MemoryService` in process (its queues and worker
  threads, no transport), ``context`` only: the part of the server's time that is not HTTP;
- ``http``: the real ``evolve serve`` in a subprocess on a loopback port, one httpx client
  (keep-alive) per concurrent client;
- ``mcp``: the ``mcp`` package's streamable-HTTP client against ``/mcp`` of the same server,
  one client session per concurrent client, calling ``get_context`` and ``add_session``.

Each cell is ``--requests`` contexts or ``--adds`` adds; its requests/s is over the cell's wall
time, p50/p99 over each request's wall time as its client saw it. The clients run in this
process (threads in process, asyncio tasks over the network), on the same cores as the server.
It prints one markdown table; ``--json FILE`` writes every figure.

    python bench/serve.py --data-dir ../shared/data --work /tmp/prismem-serve
    python bench/serve.py --embedder hashing --requests 40 --adds 8      # a quick smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import evolve
from evolve.datasets.beam import list_conversations, load_conversation
from evolve.datasets.types import Conversation
from evolve.environment import folder
from evolve.runtime.store import scope_key
from evolve.server.auth import add_token
from evolve.server.records import MessageIn
from evolve.server.service import MemoryService

ROOT = Path(__file__).resolve().parents[1]
CHARS_PER_TOKEN = 4
VERBS = ("context", "add (users)", "add (one user)")
WAYS = ("in-process", "service", "http", "mcp")
# adds before the measured ones: the first MiniLM encodes of a process are slower (a first add
# loads the model, about 5 s; the next few stall at times), so they are not measured
WARM_ADDS = 32
Job = tuple[str, Any]  # (user, the question, or (session id, messages))


@dataclass
class Cell:
    transport: str
    verb: str
    clients: int
    requests: int
    wall_s: float
    per_s: float
    p50_ms: float
    p99_ms: float


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Progress:
    """One line per loop: its label, then the count done at every quarter."""

    def __init__(self, label: str, total: int) -> None:
        self.total, self.done, self._next = total, 0, max(1, total // 4)
        self._lock = threading.Lock()
        print(f"  {label}:", end="", flush=True)

    def tick(self) -> None:
        with self._lock:
            self.done += 1
            if self.done >= self._next or self.done == self.total:
                print(f" {self.done}", end="\n" if self.done == self.total else "", flush=True)
                self._next += max(1, self.total // 4)


# -- the store ------------------------------------------------------------------------------


def users_of(n: int) -> list[str]:
    return [f"user{k}" for k in range(n)]


def build(args: argparse.Namespace, conv: Conversation) -> Path:
    """The built store for ``args`` under ``--work`` (made now unless a finished one is there)."""
    base = args.work / f"built-{args.embedder}-{args.conv}-u{args.users}"
    marker = base / "built.json"
    if marker.exists():
        print(f"store: reusing {base}", flush=True)
        return base / "store"
    shutil.rmtree(base, ignore_errors=True)
    store = base / "store"
    users = users_of(args.users)
    t0 = time.perf_counter()
    for k, user in enumerate(users):
        if k and args.embedder == "minilm":  # the same texts: their vectors from user0's cache
            seed = store / "scopes" / scope_key(users[0]) / "embeddings.sqlite"
            mine = store / "scopes" / scope_key(user)
            mine.mkdir(parents=True, exist_ok=True)
            with sqlite3.connect(seed) as src, sqlite3.connect(mine / seed.name) as dst:
                src.backup(dst)
        memory = evolve.open_memory(args.program, store, embedder=args.embedder,
                                    notice=lambda _: None)  # fmt: skip
        progress = Progress(f"build {user} ({len(conv.sessions)} sessions)", len(conv.sessions))
        for session in conv.sessions:
            memory.add(session.messages, user=user, date=session.date,
                       session_id=session.session_id)  # fmt: skip
            progress.tick()
        memory.close()
    took = time.perf_counter() - t0
    marker.write_text(json.dumps({"conv": args.conv, "users": users, "built_s": round(took, 1),
                                  "embedder": args.embedder}) + "\n")  # fmt: skip
    print(f"store: built {base} in {took:.0f} s", flush=True)
    return store


# -- the ways in ----------------------------------------------------------------------------


class InProcess:
    """The runtime alone: ``AgentMemory`` called from threads."""

    name, sync = "in-process", True

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    def context(self, k: int, user: str, question: str) -> None:
        self.memory.context(question, user=user)

    def add(self, k: int, user: str, sid: str, messages: list[dict[str, str]]) -> None:
        if not self.memory.add(messages, user=user, session_id=sid):
            raise RuntimeError(f"session {sid} was not added")


class Service:
    """``MemoryService`` in process: its scheduler and worker threads, no transport."""

    name, sync = "service", False

    def __init__(self, service: MemoryService) -> None:
        self.service = service

    async def context(self, k: int, user: str, question: str) -> None:
        await self.service.context(user, question)

    async def add(self, k: int, user: str, sid: str, messages: list[dict[str, str]]) -> None:
        rows = [MessageIn(**m) for m in messages]
        if not (await self.service.add(user, rows, session_id=sid)).added:
            raise RuntimeError(f"session {sid} was not added")


class Http:
    """The HTTP API: one keep-alive httpx client per concurrent client."""

    name, sync = "http", False

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients

    async def context(self, k: int, user: str, question: str) -> None:
        r = await self.clients[k].post(f"/v1/scopes/{user}/context", json={"question": question})
        r.raise_for_status()

    async def add(self, k: int, user: str, sid: str, messages: list[dict[str, str]]) -> None:
        r = await self.clients[k].post(f"/v1/scopes/{user}/sessions",
                                       json={"messages": messages, "session_id": sid})  # fmt: skip
        r.raise_for_status()
        if not r.json()["added"]:
            raise RuntimeError(f"session {sid} was not added")


class Mcp:
    """MCP tools over streamable HTTP: one ``mcp.Client`` per concurrent client."""

    name, sync = "mcp", False

    def __init__(self, clients: list[Client]) -> None:
        self.clients = clients

    async def _call(self, k: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.clients[k].call_tool(tool, arguments)
        if result.is_error:
            raise RuntimeError(f"{tool}: {result.content}")
        return dict(result.structured_content or {})

    async def context(self, k: int, user: str, question: str) -> None:
        await self._call(k, "get_context", {"question": question, "scope": user})

    async def add(self, k: int, user: str, sid: str, messages: list[dict[str, str]]) -> None:
        arguments = {"messages": messages, "session_id": sid, "scope": user}
        out = await self._call(k, "add_session", arguments)
        if not out.get("added"):
            raise RuntimeError(f"session {sid} was not added")


# -- the cells ------------------------------------------------------------------------------


def jobs(verb: str, n: int, users: list[str], questions: list[str], tag: str) -> list[Job]:
    """The requests of one cell: ``n`` of them, spread over ``users`` (or all to the first)."""
    if verb == "context":
        return [(users[j % len(users)], questions[(j // len(users)) % len(questions)])
                for j in range(n)]  # fmt: skip
    out: list[Job] = []
    for j in range(n):
        user = users[0] if verb == "add (one user)" else users[j % len(users)]
        note = f"{tag}-{j}"
        messages = [
            {"role": "user", "content": f"Note {note}: the staging deploy for ticket {j} moved "
             f"to Thursday; remind me to tell the on-call team ({uuid.uuid4().hex[:8]})."},
            {"role": "assistant", "content": f"Noted ({note}): staging deploy for ticket {j} "
             "is now on Thursday; I will remind you to tell the on-call team."},
        ]  # fmt: skip
        out.append((user, (f"bench-{note}", messages)))
    return out


def _call(way: Any, verb: str, k: int, job: Job) -> Any:
    user, what = job
    return way.context(k, user, what) if verb == "context" else way.add(k, user, *what)


def run_threads(way: Any, verb: str, clients: int, todo: list[Job], label: str) -> list[float]:
    pending: Iterator[Job] = iter(todo)
    lock, lat, progress = threading.Lock(), [], Progress(label, len(todo))

    def client(k: int) -> None:
        while True:
            with lock:
                job = next(pending, None)
            if job is None:
                return
            t0 = time.perf_counter()
            _call(way, verb, k, job)
            lat.append((time.perf_counter() - t0) * 1000)
            progress.tick()

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return lat


async def run_tasks(way: Any, verb: str, clients: int, todo: list[Job], label: str) -> list[float]:
    pending, lat, progress = iter(todo), [], Progress(label, len(todo))

    async def client(k: int) -> None:
        for job in pending:  # one iterator shared by the tasks of one event loop
            t0 = time.perf_counter()
            await _call(way, verb, k, job)
            lat.append((time.perf_counter() - t0) * 1000)
            progress.tick()

    await asyncio.gather(*(client(k) for k in range(clients)))
    return lat


async def measure(way: Any, args: argparse.Namespace, questions: list[str]) -> list[Cell]:
    """Warm ``way`` up (every user and question once), then every cell of ``way``."""
    users = users_of(args.users)
    run: Callable[..., Awaitable[list[float]]]
    if way.sync:
        run = lambda *a: asyncio.to_thread(run_threads, way, *a)  # noqa: E731
    else:
        run = lambda *a: run_tasks(way, *a)  # noqa: E731
    warm = jobs("context", len(users) * len(questions), users, questions, "")
    await run("context", min(4, max(args.clients)), warm, f"{way.name} warm-up")
    if way.name != "service":  # adds: the embedding model loaded and run where it runs
        first = jobs("add (users)", WARM_ADDS, users, questions, f"{args.nonce}-{way.name}-warm")
        await run("add (users)", 1, first, f"{way.name} warm-up adds")
    cells = []
    for verb in VERBS if way.name != "service" else VERBS[:1]:
        for clients in args.clients:
            n = args.requests if verb == "context" else args.adds
            tag = f"{args.nonce}-{way.name}-{verb.split()[-1].strip(')')}-{clients}"
            todo = jobs(verb, n, users, questions, tag)
            t0 = time.perf_counter()
            lat = await run(verb, clients, todo, f"{way.name} {verb} x{clients}")
            wall = time.perf_counter() - t0
            cells.append(Cell(way.name, verb, clients, n, round(wall, 3), round(n / wall, 1),
                              round(pct(lat, 0.5), 2), round(pct(lat, 0.99), 2)))  # fmt: skip
    return cells


# -- the server -----------------------------------------------------------------------------


def start_server(args: argparse.Namespace, store: Path, tokens: Path) -> tuple[Any, str]:
    """``evolve serve`` on a free loopback port; (the process, its base URL)."""
    log = open(store.parent / "serve.log", "w")  # noqa: SIM115 (the server's stderr)
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve", "serve", str(args.program), "--store", str(store),
         "--tokens", str(tokens), "--port", "0", "--embedder", args.embedder],
        stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in (store.parent / "serve.log").read_text().splitlines():
            if line.startswith("serving ") and " on http://" in line:
                return proc, line.rsplit(" on ", 1)[1].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("evolve serve did not start:\n" + (store.parent / "serve.log").read_text())


def stop_server(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def over_network(
    args: argparse.Namespace, url: str, token: str, questions: list[str]
) -> list[Cell]:
    """The HTTP cells, then the MCP cells, of ``--ways``, against the server at ``url``."""
    auth = {"Authorization": f"Bearer {token}"}
    n = max(args.clients)
    cells: list[Cell] = []
    async with AsyncExitStack() as stack:
        http = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=url, headers=auth, timeout=120)) for _ in range(n)]  # fmt: skip
        if "http" in args.ways:
            cells += await measure(Http(http), args, questions)
    if "mcp" not in args.ways:
        return cells
    async with AsyncExitStack() as stack:
        mcp = []
        for _ in range(n):
            transport = streamable_http_client(
                f"{url}/mcp", http_client=httpx2.AsyncClient(headers=auth, timeout=120)
            )
            mcp.append(await stack.enter_async_context(Client(transport)))
        cells += await measure(Mcp(mcp), args, questions)
    return cells


# -- the run --------------------------------------------------------------------------------


def table(cells: list[Cell]) -> str:
    ways = list(dict.fromkeys(c.transport for c in cells))
    head = "| verb | clients | " + " | ".join(f"{w}: req/s, p50 / p99 ms" for w in ways) + " |"
    lines = [head, "|---|---|" + "---|" * len(ways)]
    for verb in VERBS:
        for clients in sorted({c.clients for c in cells}):
            row = []
            for w in ways:
                c = next((c for c in cells if (c.transport, c.verb, c.clients)
                          == (w, verb, clients)), None)  # fmt: skip
                row.append(f"{c.per_s:.0f}, {c.p50_ms:.1f} / {c.p99_ms:.1f}" if c else "–")
            lines.append(f"| {verb} | {clients} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--work", type=Path, default=Path("/tmp/prismem-serve"),
                        help="keeps the built store (reused) and each run's copy")  # fmt: skip
    parser.add_argument("--program", type=Path, default=ROOT / "seeds" / "dense.py")
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--conv", default=None, help="the BEAM-1M conversation (default: first)")
    parser.add_argument("--users", type=int, default=4, help="users holding the conversation")
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients per cell")
    parser.add_argument("--requests", type=int, default=1000, help="contexts per cell")
    parser.add_argument("--adds", type=int, default=128, help="adds per cell")
    parser.add_argument("--ways", default=",".join(WAYS), help="the ways in to measure")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    args.clients = [int(x) for x in args.clients.split(",")]
    args.ways = [w for w in args.ways.split(",") if w]
    if not set(args.ways) <= set(WAYS):
        parser.error(f"--ways: choose among {', '.join(WAYS)}")
    args.nonce = uuid.uuid4().hex[:8]
    args.program = args.program.resolve()
    args.conv = args.conv or list_conversations(args.data_dir, "1M")[0]
    conv, qs = load_conversation(args.data_dir, "1M", args.conv)
    questions = list(dict.fromkeys(q.question for q in qs))
    print(
        f"$ python bench/serve.py --embedder {args.embedder} --users {args.users} --clients "
        f"{','.join(map(str, args.clients))} --requests {args.requests} --adds {args.adds}"
    )
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)  # fmt: skip
    print(f"BEAM-1M {args.conv}: {len(conv.sessions)} sessions, "
          f"{conv.n_chars / CHARS_PER_TOKEN / 1e6:.2f}M tokens, {len(questions)} questions; "
          f"{args.users} users hold it", flush=True)  # fmt: skip
    args.work.mkdir(parents=True, exist_ok=True)
    built = build(args, conv)
    run_dir = args.work / f"run-{args.nonce}"
    store = run_dir / "store"
    shutil.copytree(built, store)
    began = time.perf_counter()
    try:
        memory = evolve.open_memory(args.program, store, embedder=args.embedder,
                                    notice=lambda _: None)  # fmt: skip
        cells: list[Cell] = []
        if "in-process" in args.ways:
            cells += asyncio.run(measure(InProcess(memory), args, questions))
        service = MemoryService(memory, args.program)
        if "service" in args.ways:
            cells += asyncio.run(measure(Service(service), args, questions))
        service.close()  # closes the memory: the server opens the store next
        if {"http", "mcp"} & set(args.ways):
            tokens = run_dir / "tokens.json"
            token = add_token(tokens, "bench", users_of(args.users))
            proc, url = start_server(args, store, tokens)
            try:
                cells += asyncio.run(over_network(args, url, token, questions))
            finally:
                stop_server(proc)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    took = time.perf_counter() - began
    print(
        f"\nmeasured in {took:.0f} s (after the build); {args.requests} contexts and "
        f"{args.adds} adds per cell; client-side wall time per request\n"
    )
    print(table(cells), flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "argv": sys.argv[1:], "conv": args.conv, "users": args.users,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "load": os.getloadavg(), "measured_s": round(took, 1),
            "cells": [asdict(c) for c in cells]}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
