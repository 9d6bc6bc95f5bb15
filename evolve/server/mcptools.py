"""The MCP server: the memory service's verbs as MCP tools, on the official SDK's ``MCPServer``.

Owns :func:`build_server` (the tools ``add_session``, ``get_context``, ``answer``,
``get_history`` and ``forget`` over a :class:`~evolve.server.service.MemoryService`),
:func:`mount` (the streamable-HTTP transport at ``/mcp`` of the HTTP app, behind the bearer
check of :class:`_Bearer`) and :func:`serve_stdio` (``evolve serve --stdio``, the token from
``$PRISMEM_TOKEN``).

Invariants:

- **Schemas from typed signatures.** Each tool is a typed ``async def`` whose arguments carry the
  request limits of :mod:`.records` (message count and size, question length, id length, the
  scope pattern) and whose return is a record of :mod:`.records`: the SDK derives the input and
  output schemas from them, and validates every call against them before a tool runs.
- **The tenant comes from the credential.** Each call resolves its grant afresh: over HTTP from
  the request's ``Authorization: Bearer`` header (:class:`_Bearer`, which answers 401 before
  the MCP layer sees a request with a missing, unknown or expired token); over stdio and
  in process from the token the server was built for (:func:`token_grant`, re-read from the
  token file on every call, so an expired or removed token stops working). A tool's ``scope``
  argument only chooses among the grant's scopes (:meth:`~evolve.server.auth.Grant.scope`);
  a scope not granted is refused before the service is called, so nothing is read or written.
- **Sessions are bounded.** Over streamable HTTP at most ``max_sessions`` MCP sessions are open
  (one more is refused with 503 until one ends), a session idle for ``idle_s`` is closed, a
  request body is at most ``max_body`` bytes (the HTTP API's limit), and a session is usable
  only with the token that opened it (the SDK binds it to the principal :class:`_Bearer` sets).
- A refused or failed verb is a tool error (``isError``) whose one line starts with the HTTP
  status the same refusal has over HTTP (``403``, ``429 ... retry after N s``, ...).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, TypeVar

from mcp.server import MCPServer
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp_types import ToolAnnotations
from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from evolve.server.auth import REFUSED, Grant, TokenFile, digest, parse_bearer
from evolve.server.limits import MAX_BODY
from evolve.server.records import (
    MAX_MESSAGES,
    MAX_QUESTION,
    SCOPE_PATTERN,
    Added,
    AnswerOut,
    ContextOut,
    Forgotten,
    MessageIn,
    ServiceError,
    SessionsOut,
    ShortText,
    Unauthorized,
)
from evolve.server.service import MemoryService

NAME = "prismem"
PATH = "/mcp"  # where :func:`mount` serves the streamable-HTTP transport
MAX_SESSIONS = 1024  # MCP sessions open at once over streamable HTTP
IDLE_S = 600.0  # an MCP session with no request for this long is closed
_GRANT = "prismem.grant"  # the ASGI scope key :class:`_Bearer` leaves the resolved grant under

T = TypeVar("T")
GrantOf = Callable[[Request | None], Grant]  # the grant of one tool call, from its HTTP request

ScopeArg = Annotated[
    str | None,
    Field(
        pattern=SCOPE_PATTERN, description="one of the token's scopes (needed when it has several)"
    ),
]
Question = Annotated[str, Field(max_length=MAX_QUESTION)]
Messages = Annotated[list[MessageIn], Field(min_length=1, max_length=MAX_MESSAGES)]
SessionId = Annotated[
    ShortText | None, Field(description="names the session: a retry with it adds nothing again")
]
Date = Annotated[ShortText | None, Field(description="the session's or question's ISO date")]

INSTRUCTIONS = (
    "A long-term memory of conversations, one memory per scope. Call add_session with the "
    "messages of a finished exchange (pass a session_id so a retry is not added twice); call "
    "get_context with a question to get what the memory retrieves for it. The scope comes from "
    "the bearer token; name one with `scope` only when the token grants several."
)


def _refusal(exc: ServiceError) -> ToolError:
    """The tool error of a service refusal: its HTTP status, then its one line."""
    retry = getattr(exc, "retry_after_s", None)
    tail = f" (retry after {retry} s)" if retry is not None else ""
    return ToolError(f"{exc.status} {exc}{tail}")


def build_server(service: MemoryService, grant_of: GrantOf) -> MCPServer:
    """An ``MCPServer`` with the memory tools over ``service``; each call's grant is
    ``grant_of(<the call's HTTP request, or None>)``."""
    server: MCPServer = MCPServer(NAME, instructions=INSTRUCTIONS, log_level="WARNING")

    def scope_of(ctx: Context, requested: str | None) -> str:
        request = ctx.request_context.request
        try:
            return grant_of(request if isinstance(request, Request) else None).scope(requested)
        except ServiceError as exc:
            raise _refusal(exc) from None

    async def call(verb: Awaitable[T]) -> T:
        try:
            return await verb
        except ServiceError as exc:
            raise _refusal(exc) from None

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
    async def add_session(
        messages: Messages,
        ctx: Context,
        session_id: SessionId = None,
        date: Date = None,
        scope: ScopeArg = None,
    ) -> Added:
        """Add one session (the messages of one exchange) to the memory; it returns once the
        session is durable and indexed. A session_id the memory holds adds nothing
        (added: false)."""
        where = scope_of(ctx, scope)
        return await call(service.add(where, messages, session_id=session_id, date=date))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def get_context(
        question: Question, ctx: Context, date: Date = None, scope: ScopeArg = None
    ) -> ContextOut:
        """What the memory retrieves for a question: the text to answer it from."""
        where = scope_of(ctx, scope)
        return ContextOut(context=await call(service.context(where, question, date=date)))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def answer(
        question: Question, ctx: Context, date: Date = None, scope: ScopeArg = None
    ) -> AnswerOut:
        """The server's task model's answer to a question, from the memory's context (needs a
        server started with a task model)."""
        where = scope_of(ctx, scope)
        return AnswerOut(answer=await call(service.answer(where, question, date=date)))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def get_history(ctx: Context, scope: ScopeArg = None) -> SessionsOut:
        """The sessions the memory holds, in the order they were added."""
        where = scope_of(ctx, scope)
        return SessionsOut(sessions=await call(service.history(where)))

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    async def forget(
        ctx: Context, session_id: SessionId = None, scope: ScopeArg = None
    ) -> Forgotten:
        """Forget one session (session_id), or every session of the scope (no session_id):
        its text is removed from every file of the store."""
        where = scope_of(ctx, scope)
        return await call(service.forget(where, session_id))

    return server


def _request_grant(request: Request | None) -> Grant:
    """The grant :class:`_Bearer` resolved for this HTTP request (none: refused)."""
    grant = request.scope.get(_GRANT) if request is not None else None
    if not isinstance(grant, Grant):
        raise Unauthorized(REFUSED)
    return grant


def token_grant(tokens: TokenFile, token: str | None) -> GrantOf:
    """Every call's grant from one token (stdio, in process), resolved again at each call."""
    return lambda _request: tokens.resolve(token)


class _Bearer:
    """ASGI guard of the MCP transport: resolves the bearer token of every HTTP request and
    answers 401 (one JSON error line) when it is missing, unknown or expired; otherwise leaves
    the grant for the tools and the principal the SDK binds sessions to."""

    def __init__(self, app: ASGIApp, tokens: TokenFile) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        token = parse_bearer(header.decode("latin-1"))
        try:
            grant = self.tokens.resolve(token)
        except Unauthorized as exc:
            body = json.dumps({"error": str(exc)}).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                (b"content-length", str(len(body)).encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        assert token is not None
        principal = AccessToken(token=digest(token), client_id=grant.name,
                                scopes=list(grant.scopes), subject=digest(token))  # fmt: skip
        scope = {**scope, _GRANT: grant, "user": AuthenticatedUser(principal)}
        await self.app(scope, receive, send)


def mount(
    app: Starlette,
    service: MemoryService,
    tokens: TokenFile,
    *,
    host: str = "127.0.0.1",
    max_sessions: int = MAX_SESSIONS,
    idle_s: float = IDLE_S,
    max_body: int = MAX_BODY,
) -> StreamableHTTPSessionManager:
    """Serve the MCP tools over streamable HTTP at :data:`PATH` of ``app``, behind the bearer
    check; the session manager runs within ``app``'s lifespan (around the one it has).
    ``host``: the address served; on a loopback one the SDK also refuses requests whose
    ``Host`` or ``Origin`` is not loopback (DNS rebinding)."""
    server = build_server(service, _request_grant)
    server.streamable_http_app(streamable_http_path=PATH, max_request_body_size=max_body,
                               session_idle_timeout=idle_s, max_sessions=max_sessions,
                               host=host)  # fmt: skip
    manager = server.session_manager
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(outer: Any) -> AsyncIterator[Any]:
        async with manager.run(), inner(outer) as state:
            yield state

    app.router.lifespan_context = lifespan
    app.router.routes.append(Route(PATH, _Bearer(StreamableHTTPASGIApp(manager), tokens)))
    return manager


async def serve_stdio(service: MemoryService, tokens: TokenFile, token: str | None) -> None:
    """Serve the MCP tools over stdin/stdout with ``token``'s grant until stdin closes;
    :class:`~evolve.server.records.Unauthorized` at once when the token does not resolve."""
    tokens.resolve(token)
    await build_server(service, token_grant(tokens, token)).run_stdio_async()
