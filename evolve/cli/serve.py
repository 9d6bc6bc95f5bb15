"""``evolve serve``: an evolved memory served over HTTP and MCP, and its tokens.

Owns :func:`add_command` (``serve`` and ``token``), :func:`cmd_serve` and :func:`cmd_token`::

    evolve serve PROGRAM --store DIR --tokens FILE [--host 127.0.0.1] [--port 8765]
                 [--model M] [--api-base URL] [--embedder minilm|hashing] [--stdio]
                 [--backend local|ray [--replicas N] [--ray-address A]] [limits ...]
    evolve token add FILE --name N --scope S [--scope S2] [--expires DAYS]

Invariants: the server starts only with a token file that :class:`evolve.server.auth.TokenFile`
accepts and a program the runtime opens (else one ``error:`` line, status 2); once listening it
prints one line ``serving <program> on http://HOST:PORT`` (the port bound, also for
``--port 0``) on stderr; SIGTERM drains (new verbs 503, admitted ones finish) and the command
ends with status 0 (1 when the drain timed out). ``token add`` prints the new token once on
stdout and writes only its sha256. Every ``evolve`` command imports this module, so the HTTP,
MCP and Ray stacks (:mod:`evolve.server.http`, :mod:`~evolve.server.mcptools`,
:mod:`~evolve.server.rayserve`) are imported only by the function that serves with them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from evolve.cli.common import (
    UsageError,
    api_base_url,
    non_negative_int,
    positive_float,
    positive_int,
)
from evolve.runtime.api import AgentMemoryError, open_memory
from evolve.server.auth import TOKEN_ENV, TokenFile, TokenFileError, add_token
from evolve.server.limits import DrainingServer, ServerBounds, listen, uvicorn_config
from evolve.server.records import Unauthorized
from evolve.server.service import MemoryService, ServiceLimits


def add_command(sub: Any) -> None:
    """Register ``evolve serve`` on the ``evolve`` parser's subparsers."""
    p = sub.add_parser(
        "serve", help="serve a memory program over HTTP and MCP",
        description="Serve PROGRAM over the store DIR: the HTTP API (/docs), MCP at /mcp or on "
        "stdio. `evolve token add FILE --name N --scope S` makes a token.",
    )  # fmt: skip
    p.add_argument("program", help="the memory program (e.g. from evolve export)")
    p.add_argument("--store", type=Path, help="the store folder (made if absent)")
    p.add_argument("--tokens", type=Path, help="the token file (JSON, mode 0600)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=non_negative_int, default=8765, help="0: any free port")
    p.add_argument("--model", default=None, help="the task model (litellm id); none: offline")
    p.add_argument("--api-base", type=api_base_url, default=None,
                   help="the task model's endpoint (an OpenAI-compatible server)")  # fmt: skip
    p.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    p.add_argument(
        "--stdio",
        action="store_true",
        help=f"MCP over stdin/stdout (token from ${TOKEN_ENV}) instead of HTTP",
    )
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="ray: Ray Serve replicas in front of one owner of the store",
    )
    p.add_argument("--replicas", type=positive_int, default=None,
                   help="--backend ray: ingress replicas (default 2)")  # fmt: skip
    p.add_argument("--ray-address", default=None,
                   help="--backend ray: a cluster to join (auto, ray://head:10001); "
                   "default: a private local instance")  # fmt: skip
    d, b = ServiceLimits(), ServerBounds()
    p.add_argument("--scope-queue", type=positive_int, default=d.scope_queue,
                   help="requests of one scope waiting; beyond: 429")  # fmt: skip
    p.add_argument("--total-queue", type=positive_int, default=d.total_queue,
                   help="requests waiting in all; beyond: 429")  # fmt: skip
    p.add_argument("--workers", type=positive_int, default=d.workers,
                   help="requests running at once")  # fmt: skip
    p.add_argument("--scope-workers", type=positive_int, default=d.scope_workers,
                   help="requests of one scope running at once")  # fmt: skip
    p.add_argument("--read-deadline", type=positive_float, default=d.read_deadline_s,
                   help="seconds for context and history")  # fmt: skip
    p.add_argument("--write-deadline", type=positive_float, default=d.write_deadline_s,
                   help="seconds for add, answer and forget")  # fmt: skip
    p.add_argument("--max-body", type=positive_int, default=b.max_body, help="bytes per body")
    p.add_argument("--max-connections", type=positive_int, default=b.max_connections,
                   help="connections and requests at once; beyond: 503")  # fmt: skip
    p.add_argument("--request-read", type=positive_float, default=b.request_read_s,
                   help="seconds a client has to send one request")  # fmt: skip
    p.add_argument("--drain", type=positive_float, default=b.drain_s,
                   help="seconds SIGTERM waits for admitted requests")  # fmt: skip
    t = sub.add_parser("token", help="make a bearer token for evolve serve",
                       description="Add a token to the token file FILE (made if absent, mode "
                       "0600) and print it once: only its sha256 is stored.")  # fmt: skip
    verbs = t.add_subparsers(dest="token_verb", required=True)
    a = verbs.add_parser("add", help="a new token granting one or more scopes")
    a.add_argument("file", type=Path, help="the token file")
    a.add_argument("--name", required=True, help="the token's name (who holds it)")
    a.add_argument("--scope", action="append", required=True, help="a scope granted (repeat)")
    a.add_argument("--expires", type=positive_float, default=None,
                   help="days until the token expires (default: never)")  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> int:
    if args.store is None or args.tokens is None:
        raise UsageError("evolve serve needs --store DIR and --tokens FILE")
    try:
        tokens = TokenFile(args.tokens)
    except TokenFileError as exc:
        raise UsageError(str(exc)) from None
    try:
        limits = ServiceLimits(scope_queue=args.scope_queue, total_queue=args.total_queue,
                        workers=args.workers, scope_workers=args.scope_workers,
                        read_deadline_s=args.read_deadline,
                        write_deadline_s=args.write_deadline)  # fmt: skip
    except ValueError as exc:
        raise UsageError(f"--{str(exc).replace('_', '-')}") from None
    bounds = ServerBounds(max_body=args.max_body, max_connections=args.max_connections,
                          request_read_s=args.request_read, drain_s=args.drain)  # fmt: skip
    if args.stdio:  # one token for the whole session: refused before the store is touched
        try:
            tokens.resolve(os.environ.get(TOKEN_ENV))
        except Unauthorized as exc:
            raise UsageError(f"${TOKEN_ENV}: {exc}") from None
    if args.backend == "ray":
        if args.stdio:
            raise UsageError("--stdio serves MCP from this process: use --backend local")
        from evolve.server.rayserve import RayOptions, serve_ray  # Ray's stack: this backend only

        more = {} if args.replicas is None else {"replicas": args.replicas}
        options = RayOptions(program=str(args.program), store=str(args.store),
                             tokens=str(args.tokens), model=args.model, api_base=args.api_base,
                             embedder=args.embedder, limits=limits, max_body=args.max_body,
                             host=args.host, port=args.port, drain_s=args.drain,
                             **more)  # fmt: skip
        try:
            return serve_ray(options, args.ray_address)
        except AgentMemoryError as exc:
            raise UsageError(str(exc)) from None
    try:
        memory = open_memory(args.program, args.store, model=args.model,
                             api_base=args.api_base, embedder=args.embedder)  # fmt: skip
    except AgentMemoryError as exc:
        raise UsageError(str(exc)) from None
    service = MemoryService(memory, Path(args.program), limits=limits)
    try:
        if args.stdio:
            from evolve.server import mcptools  # the MCP stack loads only when serving

            asyncio.run(mcptools.serve_stdio(service, tokens, os.environ.get(TOKEN_ENV)))
            return 0
        return serve_http(service, tokens, args.host, args.port, bounds, label=args.program)
    finally:
        service.close()


def serve_http(
    service: MemoryService, tokens: TokenFile, host: str, port: int, bounds: ServerBounds,
    *, label: str,
) -> int:  # fmt: skip
    """Serve the HTTP API and MCP at /mcp until a signal drains and stops it; the exit status."""
    try:
        sock = listen(host, port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    from evolve.server import mcptools  # the HTTP and MCP stacks load only when serving
    from evolve.server.http import make_app

    app = make_app(service, tokens, max_body=bounds.max_body)
    mcptools.mount(app, service, tokens, host=host)
    server = DrainingServer(uvicorn_config(app, bounds, log_level="warning"),
                            begin_drain=service.begin_drain, wait_idle=service.wait_idle,
                            drain_s=bounds.drain_s)  # fmt: skip
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"serving {label} on http://{shown}:{bound_port}", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    return 1 if server.drained is False else 0


def cmd_token(args: argparse.Namespace) -> int:
    try:
        token = add_token(args.file, args.name, args.scope, expires_days=args.expires)
    except TokenFileError as exc:
        raise UsageError(str(exc)) from None
    print(token, flush=True)
    print(f"token {args.name!r} for {', '.join(args.scope)} added to {args.file} "
          "(shown once: only its sha256 is stored)", file=sys.stderr)  # fmt: skip
    return 0
