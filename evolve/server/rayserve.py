"""``evolve serve --backend ray``: the HTTP API on Ray Serve, with one owner per store and so
one writer per scope.

Owns :class:`RayOptions`, :func:`owner_name`, the store owner (:class:`StoreOwner`, a named Ray
actor), the ingress (:class:`Ingress`, a Ray Serve deployment of :func:`evolve.server.http.make_app`
over :class:`OwnerClient`), :class:`RayServer` (start and stop) and :func:`serve_ray` (the
CLI's)::

    HTTP -> Serve proxy (every node) -> Ingress replicas (N, any node: token, scope, limits, JSON)
         -> the store owner actor (one per store: MemoryService over AgentMemory) -> the store

Invariants:

- **One writer per scope.** Every scope of a store has one owner: the store's owner actor,
  named :func:`owner_name` (``prismem-store-<sha256 of the store's path>[:16]`` in the
  ``prismem`` namespace). It is the only process that opens the store; the runtime's
  ``MemoryStore`` holds an exclusive ``flock`` on ``<store>/lock`` while it is open, so a second
  owner (another command over the same path, a misnamed actor) is refused when it opens the
  store and writes nothing. Ingress replicas never open the store: they resolve the token and
  the scope (:mod:`.http`) and forward each verb to the owner, found by name. Serve's model
  multiplexing is not used: it gives affinity, not ownership.
- **The same API.** The ingress serves :func:`~evolve.server.http.make_app` unchanged; the
  owner runs :class:`~evolve.server.service.MemoryService`, so queues, deadlines,
  acknowledgement (an ``add`` answers once durable and indexed), retries by session id and the
  error statuses are the local server's. A refusal crosses the actor boundary as data
  (:class:`_OwnerReply`) and is raised again in the ingress as the same error kind. An ``add``
  without a session id gets one in the ingress, so a 503 after the owner died names the id to
  retry with.
- **Stops in order.** :meth:`RayServer.stop` deletes the Serve application (replicas finish
  the requests they hold), then drains and closes the owner (snapshots written, the lock
  released); it shuts Ray down only when it started the instance itself.
- **An owner that dies** (its process killed) is restarted by Ray and opens the store again
  (the kernel released the dead process's lock; every acknowledged session is in the log);
  meanwhile the verbs answer 503. The owner records, per scope, which processes wrote it and
  which ingress replicas the writes came through (:meth:`StoreOwner.ownership`).

Limits (by design): the owner is one process, so the store's memory work runs on one node and
its throughput is bounded by that node (its thread pool, and the confined hosts it starts);
the ingress replicas scale HTTP, tokens and validation across nodes. The application takes the
root of Serve's one HTTP port, so a cluster serves one store. The store must be on a path every
node can reach under the same name (NFS, CephFS, ...), as must the token file and the program;
the owner can move between nodes only where the file system's locks work across them (NFS v4
and CephFS locks do). The owner is an actor of the command's job: it ends with the command,
kill -9 included (the Serve application then answers 503 until the command runs again and
replaces it). Serve's proxy is the HTTP transport here: its keep-alive and request timeouts are
set, but not the local server's per-request read deadline and connection cap
(:mod:`.limits`): in front of an exposed cluster, a load balancer keeps those. The MCP
transport is not served on this backend (its sessions live in one replica's memory); MCP
clients use the local backend or ``--stdio``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from evolve.runtime.api import AgentMemoryError, open_memory
from evolve.server.auth import TokenFile
from evolve.server.http import make_app
from evolve.server.limits import MAX_BODY
from evolve.server.records import (
    Added,
    Busy,
    DeadlineExceeded,
    Forgotten,
    Health,
    MessageIn,
    ProgramRecord,
    ServiceError,
    SessionOut,
    ShuttingDown,
    Stats,
)
from evolve.server.service import MemoryService, ServiceLimits

NAMESPACE = "prismem"  # the Ray namespace of the owners
OWNER_PREFIX = "prismem-store-"
APP_PREFIX = "prismem-"  # the Serve application of a store: prismem-<the owner's digest>
FORWARDED = ("add", "context", "answer", "history", "forget", "program", "health", "stats")
HEALTH_EVERY_S = 1.0  # how often an ingress replica asks the owner for its health
HEALTH_STALE_S = 5.0  # an owner not heard from for this long: /health answers 503
DEADLINE_SLACK_S = 10.0  # the ingress waits the service's deadline plus this for the owner
REPLICAS = 2
KEEP_ALIVE_S = 5  # Serve's proxy closes a keep-alive connection idle this long
RAY_MISSING = "--backend ray needs Ray Serve: pip install -e '.[ray]' (on every node)"


@dataclass(frozen=True)
class RayOptions:
    """What the owner and the ingress are built from (the paths as every node names them:
    :class:`RayServer` makes them absolute)."""

    program: str
    store: str
    tokens: str
    model: str | None = None
    api_base: str | None = None
    embedder: str = "minilm"
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    max_body: int = MAX_BODY
    replicas: int = REPLICAS
    host: str = "127.0.0.1"
    port: int = 8765
    drain_s: float = 130.0


def owner_name(store: str | Path) -> str:
    """The name of ``store``'s owner actor (the store's absolute path, hashed)."""
    digest = hashlib.sha256(str(Path(store).resolve()).encode()).hexdigest()[:16]
    return OWNER_PREFIX + digest


def _identity() -> str:
    """This process, as the ownership record names it: ``<node id[:12]>:<pid>``."""
    import ray

    return f"{ray.get_runtime_context().get_node_id()[:12]}:{os.getpid()}"


@dataclass(frozen=True)
class _OwnerReply:
    """An owner's answer: the verb's value, or the refusal to raise again in the ingress."""

    value: Any = None
    refused: type[ServiceError] | None = None
    message: str = ""
    retry_after_s: int = 1

    def result(self) -> Any:
        if self.refused is None:
            return self.value
        if issubclass(self.refused, Busy):
            raise self.refused(self.message, self.retry_after_s)
        raise self.refused(self.message)


@dataclass(frozen=True)
class OwnerInfo:
    identity: str  # the owner process (``<node>:<pid>``)
    problem: str | None  # why it could not open the store (None: it serves)


@dataclass
class Ownership:
    """One scope's writes (sessions added, forgets): by which processes, and through which
    ingress replicas."""

    writers: Counter[str] = field(default_factory=Counter)
    origins: Counter[str] = field(default_factory=Counter)


class StoreOwner:
    """The Ray actor that alone opens the store and runs every verb of every scope in it."""

    def __init__(self, options: RayOptions) -> None:
        self.identity = _identity()
        self.problem: str | None = None
        self.service: MemoryService | None = None
        self.record: dict[str, Ownership] = {}
        try:
            memory = open_memory(options.program, options.store, model=options.model,
                                 api_base=options.api_base, embedder=options.embedder)  # fmt: skip
            self.service = MemoryService(memory, Path(options.program), limits=options.limits)
        except (AgentMemoryError, OSError) as exc:
            self.problem = str(exc)

    def ready(self) -> OwnerInfo:
        return OwnerInfo(self.identity, self.problem)

    async def call(self, verb: str, origin: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> _OwnerReply:  # fmt: skip
        """Run ``verb`` of the service; a refusal is returned as data."""
        if self.service is None:
            return _OwnerReply(
                refused=ShuttingDown,
                message=f"the store owner could not open the store: {self.problem}",
            )
        if verb not in FORWARDED:
            return _OwnerReply(refused=ServiceError, message=f"verb: unknown {verb[:40]!r}")
        try:
            result = getattr(self.service, verb)(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = await result
        except ServiceError as exc:
            return _OwnerReply(refused=type(exc), message=str(exc),
                          retry_after_s=getattr(exc, "retry_after_s", 1))  # fmt: skip
        if (isinstance(result, Added) and result.added) or isinstance(result, Forgotten):
            seen = self.record.setdefault(args[0], Ownership())
            seen.writers[self.identity] += 1
            seen.origins[origin] += 1
        return _OwnerReply(value=result)

    def ownership(self) -> dict[str, Ownership]:
        return self.record

    async def drain(self, timeout: float) -> bool:
        return True if self.service is None else await self.service.drain(timeout)

    def close(self) -> None:
        if self.service is not None:
            self.service.close()


class OwnerClient:
    """What :func:`~evolve.server.http.make_app` calls in an ingress replica: the service's
    verbs, each forwarded to the store's owner."""

    def __init__(self, owner: Any, limits: ServiceLimits, program: ProgramRecord) -> None:
        self.owner = owner
        self.limits = limits
        self.identity = _identity()
        self._program = program
        self._health: Health | None = None
        self._heard = 0.0

    async def _call(self, verb: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        deadline = self.limits.deadline(verb) + DEADLINE_SLACK_S
        try:
            reply = await asyncio.wait_for(
                self.owner.call.remote(verb, self.identity, args, kwargs), deadline
            )
        except TimeoutError:
            raise DeadlineExceeded(f"{verb}: the store owner did not answer within "
                                   f"{deadline:g} s") from None  # fmt: skip
        except ray.exceptions.RayActorError:
            again = f"; retry with session_id {kwargs['session_id']}" if verb == "add" else ""
            raise ShuttingDown(f"the store owner is unavailable{again}") from None
        return cast(_OwnerReply, reply).result()

    async def add(self, scope: str, messages: list[MessageIn], *, session_id: str | None = None,
                  date: str | None = None) -> Added:  # fmt: skip
        sid = session_id if session_id is not None else uuid.uuid4().hex
        return cast(Added, await self._call("add", scope, messages, session_id=sid, date=date))

    async def context(self, scope: str, question: str, *, date: str | None = None) -> str:
        return str(await self._call("context", scope, question, date=date))

    async def answer(self, scope: str, question: str, *, date: str | None = None) -> str:
        return str(await self._call("answer", scope, question, date=date))

    async def history(self, scope: str) -> list[SessionOut]:
        return cast(list[SessionOut], await self._call("history", scope))

    async def forget(self, scope: str, session_id: str | None = None) -> Forgotten:
        return cast(Forgotten, await self._call("forget", scope, session_id))

    async def stats(self, scopes: tuple[str, ...] | None = None) -> Stats:
        return cast(Stats, await self._call("stats", scopes))

    def program(self) -> ProgramRecord:
        return self._program

    def health(self) -> Health:
        """The owner's health as last heard (:meth:`watch`); 503 when not heard lately."""
        loop = asyncio.get_running_loop()
        if self._health is None or loop.time() - self._heard > HEALTH_STALE_S:
            raise ShuttingDown("the store owner has not answered lately")
        return self._health

    async def watch(self) -> None:
        """Ask the owner for its health every :data:`HEALTH_EVERY_S`, for good."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._health = await self._call("health")
                self._heard = loop.time()
            except Exception:  # not heard: /health turns 503 once the last answer is stale
                pass
            await asyncio.sleep(HEALTH_EVERY_S)


class Ingress:
    """A Serve replica: the HTTP app over an :class:`OwnerClient` (see :func:`_deployment`)."""

    def __init__(self, options: RayOptions, owner: str) -> None:
        self.options = options
        self.owner = owner  # the owner's name, as the command made it
        self._watch: asyncio.Task[None] | None = None

    async def __serve_build_asgi_app__(self) -> Any:
        import ray

        owner = ray.get_actor(self.owner, namespace=NAMESPACE)
        first = cast(_OwnerReply, await owner.call.remote("program", _identity(), (), {}))
        client = OwnerClient(owner, self.options.limits, first.result())
        self._watch = asyncio.get_running_loop().create_task(client.watch())
        tokens = TokenFile(Path(self.options.tokens))
        return make_app(cast(MemoryService, client), tokens, max_body=self.options.max_body)


def _deployment(options: RayOptions) -> Any:
    from ray import serve

    limits = options.limits
    ingress = serve.ingress(None)(Ingress)
    return serve.deployment(
        name="ingress", num_replicas=options.replicas, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=limits.workers + limits.total_queue // max(1, options.replicas),
        max_queued_requests=limits.total_queue, graceful_shutdown_timeout_s=options.drain_s,
    )(ingress)  # fmt: skip


class RayServer:
    """A started store owner and Serve application; :meth:`stop` ends both."""

    def __init__(self, options: RayOptions, address: str | None = None) -> None:
        try:
            import ray
            from ray import serve
        except ImportError:
            raise AgentMemoryError(RAY_MISSING) from None
        options = replace(
            options,
            program=str(Path(options.program).resolve()),
            store=str(Path(options.store).resolve()),
            tokens=str(Path(options.tokens).resolve()),
        )  # as every node names them
        self.options = options
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            settings: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                ray.init(address=address, **settings)
            else:  # a private local instance on loopback, never one found via RAY_ADDRESS
                ray.init(address="local", _node_ip_address="127.0.0.1", **settings)
        self.name = owner_name(options.store)
        self.app = APP_PREFIX + self.name.removeprefix(OWNER_PREFIX)
        actor: Any = ray.remote(StoreOwner).options(
            name=self.name, namespace=NAMESPACE, num_cpus=1, max_restarts=-1,
            max_task_retries=0, max_concurrency=options.limits.total_queue + 64,
        )  # fmt: skip
        try:
            self.owner = actor.remote(options)
        except ValueError:  # the name is taken: another server owns this store
            self._shutdown()
            raise AgentMemoryError(f"store {options.store} is already served in this Ray "
                                   f"cluster (actor {self.name})") from None  # fmt: skip
        try:
            info: OwnerInfo = ray.get(self.owner.ready.remote())
        except ray.exceptions.RayError as exc:  # the actor did not start at all
            self._shutdown()
            raise AgentMemoryError(
                f"the store owner did not start: {exc}".splitlines()[0]
            ) from None
        if info.problem is not None:
            self._release()
            raise AgentMemoryError(info.problem)
        try:
            serve.start(http_options={
                "host": options.host, "port": options.port, "keep_alive_timeout_s": KEEP_ALIVE_S,
                "request_timeout_s": options.limits.write_deadline_s + 2 * DEADLINE_SLACK_S,
            })  # fmt: skip
            serve.run(_deployment(options).bind(options, self.name), name=self.app,
                      route_prefix="/")  # fmt: skip
        except Exception as exc:  # the port taken, a replica that does not start, ...
            self._release()
            raise AgentMemoryError(f"Ray Serve did not start: {exc}".splitlines()[0]) from None
        self.url = f"http://{options.host}:{options.port}"

    def ownership(self) -> dict[str, Ownership]:
        import ray

        return cast(dict[str, Ownership], ray.get(self.owner.ownership.remote()))

    def stop(self) -> bool:
        """Stop serving: the replicas finish their requests, the owner drains and closes.
        False when the owner's drain timed out."""
        import ray
        from ray import serve

        serve.delete(self.app)
        drained = bool(ray.get(self.owner.drain.remote(self.options.drain_s)))
        self._release()
        return drained

    def _release(self) -> None:
        """Close the owner (snapshots written, the store's lock released) and end it."""
        import ray

        ray.get(self.owner.close.remote())
        ray.kill(self.owner, no_restart=True)
        self._shutdown()

    def _shutdown(self) -> None:
        import ray
        from ray import serve

        if self.started_ray:
            serve.shutdown()
            ray.shutdown()


def serve_ray(options: RayOptions, address: str | None = None) -> int:
    """``evolve serve --backend ray``: serve until SIGTERM or SIGINT, then stop in order; the
    exit status (0; 1 when the owner's drain timed out). ``address``: a Ray cluster to join
    (``auto``, ``ray://head:10001``); None starts a private local instance. A server that
    cannot start raises :class:`~evolve.runtime.api.AgentMemoryError` (one line)."""
    server = RayServer(options, address)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which installs its own
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving {server.options.program} on {server.url} (Ray Serve, {options.replicas} "
          f"replicas, store owner {server.name})", file=sys.stderr, flush=True)  # fmt: skip
    stop.wait()
    return 0 if server.stop() else 1
