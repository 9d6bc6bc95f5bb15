"""The public API: an evolved program as the memory of a live agent.

Owns :func:`open_memory`, :class:`AgentMemory` and :class:`AgentMemoryError`::

    memory = evolve.open_memory("best.py", store="memstore", model=None, embedder="minilm")
    memory.add([{"role": "user", "content": "I moved to Lyon"}], user="ana", date="2024-05-01")
    memory.context("Where does Ana live?", user="ana")  # the program's retrieved text
    memory.answer("Where does Ana live?", user="ana")   # needs a task model
    memory.close()

Invariants:

- **Deployed = evaluated.** The program runs through the pipeline evaluation runs
  (:class:`evolve.evaluation.pipeline.Pipeline`), with the task model and embedder built exactly as
  evaluation builds them (:func:`evolve.evaluation.setup.make_llm`,
  :func:`~evolve.evaluation.setup.make_embedder`
  from a :class:`~evolve.evaluation.setup.EvalSetup`): ``context()`` for a question is the retrieved
  text evaluation scores for it, given the same sessions in the same order.
- **The program is checked and confined.** It must pass the sandbox check
  (:func:`sandbox.check.check_program`) before it runs; it runs only in confined hosts, one per
  user (:mod:`.scopes`).
- **Users share no cache.** Each user's pipelines get an embedder and a task-model client of
  that user's own (``make_embedder(..., own=True)``, ``make_llm(setup, <the user's folder>)``),
  their caches in the user's scope folder (:mod:`.store`); the call log, the limit on requests
  in flight and the breaker are ``setup``'s, one for the runtime. The caches an earlier
  version shared between users (``<store>/cache/``) are not used, and said once.
- **Said once, never silent.** With no task model the runtime uses the offline stand-ins (one
  unit per message, the question as the query, no answer) and says so in one line; when the
  program is an export whose header records another mode, task model, embedder, precision or
  pipeline version than the runtime's (:func:`evolve.evaluation.identity.read_scored_as`), it
  says so in one line naming each difference.
- **One user's writes take turns, reads run together** (:mod:`.scopes`): an ``add`` waits for
  the user's reads in progress and holds later ones back until it returns, so a read sees
  every session or none of one.
- **One session per ``add``, closed when ``add`` returns.** There is no open session: the
  messages of one ``add`` are one session (one ``Memory.index`` call, with its date), durable in
  the scope's log and indexed before ``add`` returns, and every later ``context()`` of that
  user sees it. An agent that wants finer sessions calls ``add`` more often; one that wants
  coarser ones buffers messages itself.
- **Forgotten means gone.** :meth:`AgentMemory.forget` removes a session, or a whole user,
  from every file of the store (log, snapshots, caches: :mod:`.upkeep`) before it returns; the
  user's memory is rebuilt without it at its next use.
- **Retries do not double.** A session id names a session: ``add`` with an id the user's log
  holds writes and indexes nothing and returns False (pass ids to make retries idempotent;
  without one, a fresh id is made).
- Bad arguments, a damaged store and a failing program raise :class:`AgentMemoryError` with
  one line; an ``add`` that raised added nothing (:mod:`.scopes`).
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from contract.spec import CONTRACT_VERSION
from contract.types import Message, Segment
from evolve.evaluation.identity import OFFLINE_MEANS, ScoredAs, read_scored_as
from evolve.evaluation.pipeline import Pipeline
from evolve.evaluation.setup import EvalSetup, make_embedder, make_llm
from evolve.models.llm import ModelConfig
from evolve.runtime.log import LogError
from evolve.runtime.scopes import Scopes
from evolve.runtime.store import Deployment, MemoryStore, MemoryStoreError
from sandbox.check import CheckedProgram, check_program
from sandbox.isolate import HostFailure, ProgramFailure
from sandbox.probe import BackendShape

MAX_LIVE = 8  # confined hosts kept started (one per user)
SNAPSHOT_EVERY = 64  # sessions added to a memory between two snapshots of it
CALL_PREFIX = "runtime"  # task-model calls are labelled runtime/extract, runtime/plan, ...


class AgentMemoryError(Exception):
    """A runtime call that cannot be served as asked; the message is one line."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def open_memory(
    program: str | Path,
    store: str | Path,
    *,
    model: str | None = None,
    embedder: str = "minilm",
    max_live: int = MAX_LIVE,
    read_hosts: int = 1,
    snapshot_every: int = SNAPSHOT_EVERY,
    notice: Callable[[str], None] = _say,
    setup: EvalSetup | None = None,
    api_base: str | None = None,
) -> AgentMemory:
    """Open ``program`` (a memory program file, e.g. from ``evolve export``) over the store
    folder ``store`` (created if need be). ``model``: a litellm id for the task model, or None
    for the offline stand-ins; ``api_base``: the task model's endpoint (a local
    OpenAI-compatible server, as ``--api-base`` gives runs); ``embedder``: ``minilm`` or
    ``hashing`` (a test double). ``setup`` replaces ``model``, ``api_base`` and ``embedder`` by
    a whole
    :class:`~evolve.evaluation.setup.EvalSetup` (what an evaluation runs with). ``max_live``:
    confined
    hosts kept started, in all; ``read_hosts``: hosts one user's reads may use side by side
    (each holds a copy of that user's memory and indexes every session it is given);
    ``snapshot_every``: sessions between snapshots of a memory. ``notice`` receives the
    runtime's one-line notices (default: stderr)."""
    path = Path(program)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentMemoryError(f"cannot read program {path}: {exc}") from None
    root = Path(store)
    if api_base is not None and (setup is not None or not model):
        raise AgentMemoryError("api_base is the endpoint of model= (not with setup=, which "
                               "carries its own)")  # fmt: skip
    if setup is None:
        if embedder not in ("minilm", "hashing"):
            raise AgentMemoryError(f"unknown embedder {embedder!r} (use minilm or hashing)")
        task = ModelConfig(model=model, api_base=api_base) if model else None
        setup = EvalSetup(cache_dir=str(root / "cache"), task_model=task, embedder=embedder,
                              call_prefix=CALL_PREFIX)  # fmt: skip
    if min(max_live, read_hosts, snapshot_every) < 1 or read_hosts > max_live:
        raise AgentMemoryError("max_live, read_hosts and snapshot_every are at least 1, and "
                               "read_hosts at most max_live")  # fmt: skip
    shape = BackendShape(max_complete_calls=setup.max_complete_calls)  # as the hosts will run
    checked = check_program(source, str(path), backend=shape).require(
        lambda why: AgentMemoryError(f"{path} does not pass the sandbox: {why}")
    )
    return AgentMemory(checked, root, setup, max_live=max_live, read_hosts=read_hosts,
                       snapshot_every=snapshot_every, notice=notice)  # fmt: skip


class AgentMemory:
    """An evolved program over a store: ``add``, ``context``, ``answer`` per user."""

    def __init__(
        self,
        program: CheckedProgram,
        root: Path,
        setup: EvalSetup,
        *,
        max_live: int,
        read_hosts: int,
        snapshot_every: int,
        notice: Callable[[str], None],
    ) -> None:
        source, path, digest = program.source, program.path, program.digest
        self.setup = setup
        task = setup.task_model.model if setup.task_model else None
        running = ScoredAs.here(task, setup.embedder)
        self.deployment = Deployment(digest, CONTRACT_VERSION, running.pipeline_version, task,
                                     setup.embedder, running.precision)  # fmt: skip
        try:
            self.store = MemoryStore(root, self.deployment, source)
        except (MemoryStoreError, OSError) as exc:
            raise AgentMemoryError(str(exc)) from None
        try:
            if task is None:
                notice(f"runtime: no task model: offline stand-ins ({OFFLINE_MEANS}; no answers)")
            scored = read_scored_as(source)
            if scored is not None and scored.differences(running):
                notice(f"runtime: {path} was scored otherwise than it runs here: "
                       f"{'; '.join(scored.differences(running))}")  # fmt: skip
            if self.store.switched_from:
                notice(f"runtime: store {root} switched to this program from "
                       f"{self.store.switched_from[:12]}: memories are rebuilt from the logs "
                       "(the previous program stays in the store to roll back to)")  # fmt: skip
            if self.store.shared_caches:
                notice(f"runtime: {', '.join(str(p) for p in self.store.shared_caches)}: caches "
                       "an earlier version shared between users, no longer used (each user's "
                       "are in their scope folder); they hold every user's text: delete them "
                       "to forget it")  # fmt: skip

            def pipeline(user: str) -> Pipeline:
                """A pipeline of ``user``'s own: its embedder and task-model client keep their
                caches in the user's folder (:mod:`.scopes`, "no channel through a cache")."""
                folder = str(self.store.cache_dir(user))
                embedder = make_embedder(setup.embedder, folder, own=True)
                return Pipeline.for_setup(program, setup, make_llm(setup, folder), embedder)

            self._scopes = Scopes(self.store, pipeline, max_live=max_live, read_hosts=read_hosts,
                                  snapshot_every=snapshot_every, notice=notice)  # fmt: skip
        except BaseException:
            self.store.close()
            raise
        self._closed = threading.Event()

    # -- the verbs -------------------------------------------------------------------------

    def add(
        self,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        user: str,
        date: str | None = None,
        session_id: str | None = None,
    ) -> bool:
        """Add one session (``messages``, each ``{"role", "content"}`` with an optional
        ``"id"``) to ``user``'s memory; durable and indexed when it returns. False when the
        user's log already holds ``session_id`` (nothing is added again)."""
        segment = _segment(messages, date, session_id)
        _, new = self._serve(user, lambda: self._scopes.add(user, segment))
        return bool(new)

    def context(self, question: str, *, user: str, date: str | None = None) -> str:
        """The program's retrieved text for ``question`` over ``user``'s memory (at most
        :data:`~contract.spec.OUT_CHAR_BUDGET` characters)."""
        question = _text(question, "question")
        text = self._serve(user, lambda: self._scopes.read(
            user, lambda live: live.pipeline.retrieve(live.pipeline.plan(question, date)).text
        ))  # fmt: skip
        return str(text)

    def answer(self, question: str, *, user: str, date: str | None = None) -> str:
        """The task model's answer to ``question`` from its context, under the program's
        answer instruction."""
        if self.setup.task_model is None:
            raise AgentMemoryError("answer() needs a task model (open_memory(..., model=...))")
        question = _text(question, "question")

        def step(live: Any) -> str:
            found = live.pipeline.retrieve(live.pipeline.plan(question, date))
            return str(live.pipeline.answer(question, date, found.text))

        return str(self._serve(user, lambda: self._scopes.read(user, step)))

    def forget(self, user: str, session_id: str | None = None) -> int:
        """Forget the session ``session_id`` of ``user`` (None: every session of the user):
        when it returns, no file of the store holds its text and the user's memory is
        rebuilt without it at its next use. The sessions forgotten (0: none by that id)."""
        if session_id is not None:
            _text(session_id, "session_id")

        def forget() -> int:
            try:
                return self._scopes.forget(user, session_id)
            except OSError as exc:
                raise MemoryStoreError(f"cannot forget in store {self.store.root}: "
                                       f"{exc.strerror or exc}") from None  # fmt: skip

        return int(self._serve(user, forget))

    def history(self, user: str) -> list[Segment]:
        """The sessions in ``user``'s log, in order (what the memory is built from)."""
        return list(self._serve(user, lambda: self._scopes.history(user)))

    @property
    def previous_program(self) -> Path | None:
        """The program this store ran before the current one (open it again to roll back)."""
        return self.store.previous_program()

    def live_hosts(self) -> int:
        return self._scopes.live_count()

    def close(self) -> None:
        """Snapshot every live memory and close its host; the store stays."""
        if not self._closed.is_set():
            self._closed.set()
            try:
                self._scopes.close()
            finally:
                self.store.close()

    def __enter__(self) -> AgentMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self, user: str, fn: Callable[[], Any]) -> Any:
        if self._closed.is_set():
            raise AgentMemoryError("this memory is closed")
        if not isinstance(user, str) or not user:
            raise AgentMemoryError("user is a non-empty string (the scope id)")
        try:
            return fn()
        except (MemoryStoreError, LogError) as exc:
            raise AgentMemoryError(str(exc)) from None
        except (HostFailure, ProgramFailure) as exc:  # the program's, one line
            raise AgentMemoryError(f"the program failed: {exc}".replace("\n", " ")) from None


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise AgentMemoryError(f"{what} is a string, got {type(value).__name__}")
    return value


def _segment(
    messages: Iterable[Mapping[str, Any] | Message], date: str | None, session_id: str | None
) -> Segment:
    """One session of the caller's messages; message ids default to ``<session id>.<k>``."""
    if date is not None and not isinstance(date, str):
        raise AgentMemoryError(f"date is an ISO date string or None, got {type(date).__name__}")
    sid = uuid.uuid4().hex if session_id is None else _text(session_id, "session_id")
    out = []
    for k, m in enumerate(list(messages)):
        if isinstance(m, Message):
            out.append(m)
            continue
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise AgentMemoryError(f"message {k} is not a mapping with a string 'content'")
        role = m.get("role", "user")
        if not isinstance(role, str):
            raise AgentMemoryError(f"message {k}: role is a string")
        out.append(Message(str(m.get("id", f"{sid}.{k}")), role, m["content"]))
    if not out:
        raise AgentMemoryError("a session holds at least one message")
    return Segment(sid, date, tuple(out))
