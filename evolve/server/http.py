"""The HTTP JSON API over a :class:`~evolve.server.service.MemoryService` (FastAPI; OpenAPI at
``/openapi.json``, pages at ``/docs``).

Owns :func:`make_app` (the routes and error answers) and the credential gate
(:class:`_Gate`)::

    POST   /v1/scopes/{scope}/sessions             AddIn -> Added
    GET    /v1/scopes/{scope}/sessions             -> SessionsOut
    DELETE /v1/scopes/{scope}/sessions/{session_id} -> Forgotten
    DELETE /v1/scopes/{scope}                      -> Forgotten
    POST   /v1/scopes/{scope}/context              QuestionIn -> ContextOut
    POST   /v1/scopes/{scope}/answer               QuestionIn -> AnswerOut
    GET    /v1/program  GET /v1/stats             (with a token)
    GET    /health                                 (no token, no user data)

Invariants:

- **The gate runs before the body is read.** Every ``/v1`` request needs
  ``Authorization: Bearer <token>`` that :meth:`evolve.server.auth.TokenFile.resolve` accepts
  (else 401) and, under ``/v1/scopes/{scope}``, a scope the token grants
  (:meth:`~evolve.server.auth.Grant.scope`, else 403); a refused request reads and writes
  nothing. A route serves only the scope the gate checked (``request.state.scope``).
- Every error is one JSON object ``{"error": "<one line naming the field or the reason>"}``:
  400 malformed JSON, 413 a body over the limit (:class:`~evolve.server.limits.BodyLimit`),
  422 a field of the wrong type, missing, unknown or over its limit, and the service's errors
  with their statuses (429 with ``Retry-After``).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from evolve.server.auth import TokenFile, parse_bearer
from evolve.server.limits import MAX_BODY, BodyLimit
from evolve.server.records import (
    Added,
    AddIn,
    AnswerOut,
    Busy,
    ContextOut,
    ErrorOut,
    Forbidden,
    Forgotten,
    Health,
    ProgramRecord,
    QuestionIn,
    ServiceError,
    SessionsOut,
    Stats,
)
from evolve.server.service import MemoryService

_SCOPED = re.compile(r"^/v1/scopes/(?P<scope>[^/]*)(?:/|$)")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": why} for code, why in [
        (400, "malformed JSON, or a token of several scopes"), (401, "missing, unknown or "
        "expired token"), (403, "scope not granted to the token"), (413, "body over the limit"),
        (422, "a field missing, unknown, of the wrong type or over its limit"),
        (429, "a queue is full (see Retry-After)"), (503, "the server is shutting down"),
        (504, "the verb passed its deadline")]
}  # fmt: skip


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())[:500]}, status, headers)


class _Gate:
    """ASGI middleware: the token and the scope of every ``/v1`` request, before its body."""

    def __init__(self, app: Any, tokens: TokenFile) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/v1" or path.startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        raw = headers.get(b"authorization")
        try:
            grant = self.tokens.resolve(parse_bearer(raw.decode("latin-1") if raw else None))
            found = _SCOPED.match(path)
            state = scope.setdefault("state", {})
            state["grant"] = grant
            state["scope"] = grant.scope(found["scope"]) if found else None
        except ServiceError as exc:
            await _error(exc.status, str(exc))(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _checked(request: Request, scope: str) -> str:
    """The scope the gate checked; a route whose path scope differs serves nothing."""
    checked = getattr(request.state, "scope", None)
    if checked is None or checked != scope:
        raise Forbidden(f"scope: {scope[:140]!r} is not granted to this token")
    return str(checked)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def make_app(service: MemoryService, tokens: TokenFile, *, max_body: int = MAX_BODY) -> FastAPI:
    """The API over ``service``, tokens from ``tokens``; bodies at most ``max_body`` bytes."""
    app = FastAPI(title="PrisMem memory server", version="1",
                  description="An evolved memory program served to agents; the tenant is the "
                  "token's scope.")  # fmt: skip

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Busy) else None
        return _error(exc.status, str(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            ctx = first.get("ctx")
            why = ctx.get("error", "") if isinstance(ctx, dict) else ""
            return _error(400, f"body: malformed JSON ({why})")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return _error(422, f"{_field(tuple(first['loc']))}: {first['msg']}{more}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, f"{request.url.path[:200]}: {exc.detail}")

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        """Liveness and queue totals; no token, no user data."""
        return service.health()

    @app.get("/v1/program", response_model=ProgramRecord, responses=_ERRORS)
    async def program() -> ProgramRecord:
        """The program served: its sha256, its ``# scored as:`` record and transfer figures."""
        return service.program()

    @app.get("/v1/stats", response_model=Stats, responses=_ERRORS)
    async def stats(request: Request) -> Stats:
        """Queue depths (the token's scopes), latency per verb, live hosts, isolation."""
        return await service.stats(request.state.grant.scopes)

    @app.post("/v1/scopes/{scope}/sessions", response_model=Added, responses=_ERRORS)
    async def add(scope: str, body: AddIn, request: Request) -> Added:
        """Add one session; 200 once it is durable and indexed. A known ``session_id`` adds
        nothing (``added`` false)."""
        return await service.add(_checked(request, scope), body.messages,
                                 session_id=body.session_id, date=body.date)  # fmt: skip

    @app.get("/v1/scopes/{scope}/sessions", response_model=SessionsOut, responses=_ERRORS)
    async def history(scope: str, request: Request) -> SessionsOut:
        """The scope's sessions, in the order they were added."""
        return SessionsOut(sessions=await service.history(_checked(request, scope)))

    @app.post("/v1/scopes/{scope}/context", response_model=ContextOut, responses=_ERRORS)
    async def context(scope: str, body: QuestionIn, request: Request) -> ContextOut:
        """The program's retrieved text for the question."""
        text = await service.context(_checked(request, scope), body.question, date=body.date)
        return ContextOut(context=text)

    @app.post("/v1/scopes/{scope}/answer", response_model=AnswerOut, responses=_ERRORS)
    async def answer(scope: str, body: QuestionIn, request: Request) -> AnswerOut:
        """The task model's answer from the retrieved text (409 without a task model)."""
        text = await service.answer(_checked(request, scope), body.question, date=body.date)
        return AnswerOut(answer=text)

    @app.delete("/v1/scopes/{scope}/sessions/{session_id}", response_model=Forgotten,
                responses=_ERRORS)  # fmt: skip
    async def forget_session(scope: str, session_id: str, request: Request) -> Forgotten:
        """Forget one session: gone from every file of the store when this returns."""
        return await service.forget(_checked(request, scope), session_id)

    @app.delete("/v1/scopes/{scope}", response_model=Forgotten, responses=_ERRORS)
    async def forget_scope(scope: str, request: Request) -> Forgotten:
        """Forget the whole scope."""
        return await service.forget(_checked(request, scope), None)

    app.add_middleware(_Gate, tokens=tokens)
    app.add_middleware(BodyLimit, max_body=max_body)  # outermost: before the gate
    return app
