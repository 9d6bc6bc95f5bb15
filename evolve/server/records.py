"""The records and errors that cross the server's boundary: HTTP bodies, MCP tool returns, the
service's verbs.

Owns the pydantic models the service takes and returns (:class:`MessageIn`, :class:`AddIn`,
:class:`Added`, :class:`QuestionIn`, :class:`SessionOut`, :class:`Forgotten`,
:class:`ProgramRecord`, :class:`Health`, :class:`Stats`, ...), the request limits they enforce
(:data:`MAX_CONTENT`, :data:`MAX_MESSAGES`, :data:`MAX_QUESTION`, :data:`SCOPE_PATTERN`) and the
service's errors (:class:`ServiceError` and its kinds, each with the HTTP status it maps to).

Invariants:

- A request record refuses what the limits refuse and unknown fields, so a malformed request
  never reaches the runtime; every error is one line (:meth:`ServiceError.__str__`).
- :class:`Health` holds no user data (no scope id, no text); :class:`Stats` names only the
  scopes the asking credential is granted.
- Each error kind has one status: 400 bad request, 401 :class:`Unauthorized`, 403
  :class:`Forbidden`, 404 :class:`NotFound`, 409 :class:`Conflict`, 429 :class:`Busy` (with
  ``retry_after_s``), 503 :class:`ShuttingDown`, 504 :class:`DeadlineExceeded`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_CONTENT = 1_000_000  # characters of one message's content
MAX_MESSAGES = 1_000  # messages in one add
MAX_QUESTION = 10_000  # characters of a question
MAX_ID = 256  # characters of a session or message id, a date, a role
SCOPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$"  # a scope id (a URL path segment)

ShortText = Annotated[str, Field(max_length=MAX_ID)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class MessageIn(_In):
    """One message of a session (``id`` defaults to ``<session id>.<k>``)."""

    role: ShortText = "user"
    content: Annotated[str, Field(max_length=MAX_CONTENT)]
    id: ShortText | None = None


class AddIn(_In):
    """``POST /v1/scopes/{scope}/sessions``: one session; a known ``session_id`` adds nothing."""

    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=MAX_MESSAGES)]
    session_id: ShortText | None = None
    date: ShortText | None = None


class QuestionIn(_In):
    """``POST /v1/scopes/{scope}/context`` and ``/answer``."""

    question: Annotated[str, Field(max_length=MAX_QUESTION)]
    date: ShortText | None = None


class Added(BaseModel):
    """The session's id (the caller's, or a fresh one) and whether this call added it."""

    session_id: str
    added: bool


class ContextOut(BaseModel):
    context: str


class AnswerOut(BaseModel):
    answer: str


class MessageOut(BaseModel):
    id: str
    role: str
    content: str


class SessionOut(BaseModel):
    """A session as the scope's log holds it."""

    session_id: str
    date: str | None
    messages: list[MessageOut]


class SessionsOut(BaseModel):
    sessions: list[SessionOut]


class Forgotten(BaseModel):
    """What a forget removed: the scope's sessions (``session_id`` None) or one of them."""

    session_id: str | None
    forgotten: int  # sessions removed from the log


class ScoredAsOut(BaseModel):
    """An export's ``# scored as:`` record (:class:`evolve.evaluation.identity.ScoredAs`)."""

    mode: str
    task_model: str | None
    embedder: str
    precision: str
    pipeline_version: str


class ProgramRecord(BaseModel):
    """The program the server runs: its sha256, how it was scored, its transfer figures."""

    sha256: str
    path: str
    scored_as: ScoredAsOut | None  # None: not an export, or one without the record
    running_as: ScoredAsOut  # how this server runs it
    differences: list[str]  # scored_as against running_as, one ``field: a -> b`` each
    transfer: list[str]  # the export header's transfer lines, as text


class Health(BaseModel):
    """Liveness with no user data."""

    status: Literal["ok", "draining"]
    uptime_s: float
    waiting: int  # verbs admitted and not yet running, in all
    running: int  # verbs running, in all


class VerbLatency(BaseModel):
    count: int  # calls finished (the percentiles are over the last ones, at most a window)
    p50_ms: float | None
    p99_ms: float | None


class Stats(BaseModel):
    """Queues, latencies, hosts and isolation (the scopes named: the caller's grants only)."""

    status: Literal["ok", "draining"]
    uptime_s: float
    waiting: int
    running: int
    waiting_by_scope: dict[str, int]
    running_by_scope: dict[str, int]
    limits: dict[str, float]  # the queue sizes, workers and deadlines in force
    latency: dict[str, VerbLatency]  # per verb
    refused: dict[str, int]  # busy, draining, deadline: counts since start
    live_hosts: int
    isolation: str  # sandbox.barrier.describe of this machine's survey


class ErrorOut(BaseModel):
    """Every error answer's body: one line naming the field or the reason."""

    error: str


class ServiceError(Exception):
    """A verb that cannot be served as asked; one line; ``status``: its HTTP status."""

    status: ClassVar[int] = 400

    def __str__(self) -> str:
        return " ".join(super().__str__().split())


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class Busy(ServiceError):
    """A queue is full; retry after ``retry_after_s`` seconds."""

    status = 429

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ShuttingDown(ServiceError):
    status = 503


class DeadlineExceeded(ServiceError):
    status = 504
