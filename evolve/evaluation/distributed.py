"""Where evaluation jobs run: the local loky pool (default) or a Ray cluster (``--backend ray``).

Owns :data:`BACKENDS`, :class:`JobBackend` and :func:`make_backend`. The executor submits one job
per conversation (:func:`evolve.evaluation.conversation.run_conversation`) to a backend's
``executor`` and reads
``concurrent.futures.Future`` results; nothing else about a job depends on where it runs.

Invariants:

- ``local`` is joblib's reusable loky pool, shared between evaluations of one process so the
  embedding model loads once per worker. Its jobs in flight are counted on a
  :class:`evolve.models.cores.BusyBoard` (:class:`CountingExecutor`), and each worker sets
  torch's threads to the cores divided among the busy jobs before every batch it encodes.
- ``ray`` submits each job as one Ray task (``num_cpus=1``) and wraps its ObjectRef as a future.
  It connects to ``address`` (``auto``, ``ray://host:10001``, ...) or, without one, starts a
  private local Ray instance on loopback (even when ``RAY_ADDRESS`` or a ``ray start`` on this
  machine names another); it never shuts down a cluster it did not start. Workers must
  import this package (install it on every node) and share the cache directory (a path every
  node can read and write, e.g. NFS): step outputs, embeddings and LLM responses meet there,
  which is what makes a Ray evaluation equal to a local one.
- Every process the local backend starts (the loky workers here, the progress queue's manager in
  :mod:`evolve.evaluation.executor`) runs :func:`die_with_parent` first: it exits as soon as the
  process
  that started it is gone, even when that one was killed with SIGKILL and could not clean up
  (the resource trackers then see their pipes close and exit too; sandbox hosts see stdin
  close).
- Per-question progress needs a queue the worker can reach: a local backend passes one, a Ray
  backend does not (``live_progress`` is False) and progress advances per finished
  conversation instead.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from evolve.models import cores

BACKENDS = ("local", "ray")
WATCH_SECONDS = 0.5  # how often a local worker checks that its parent is still there


class JobExecutor(Protocol):
    """What the executor needs from a pool: ``submit(fn, *args)`` returning a future."""

    def submit(self, fn: Any, /, *args: Any) -> Future[Any]: ...


@dataclass(frozen=True)
class JobBackend:
    name: str
    executor: JobExecutor
    live_progress: bool  # workers can report each question as it finishes


def make_backend(name: str, jobs: int, address: str | None = None) -> JobBackend:
    """The backend ``name`` with ``jobs`` concurrent workers (Ray: tasks in flight are limited
    by the cluster's CPUs, not by ``jobs``)."""
    if name == "local":
        return JobBackend("local", _loky(jobs), live_progress=True)
    if name == "ray":
        return JobBackend("ray", RayExecutor(address), live_progress=False)
    raise ValueError(f"unknown backend {name!r}; backends are {', '.join(BACKENDS)}")


def _loky(jobs: int) -> JobExecutor:
    from joblib.externals.loky import get_reusable_executor

    busy = cores.board(jobs)
    threads = str(max(1, cores.count() // max(1, jobs)))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, cores.ENV: busy.path}
    executor: JobExecutor = get_reusable_executor(
        max_workers=max(1, jobs), timeout=300, env=env,
        initializer=die_with_parent, initargs=(os.getpid(),),
    )  # fmt: skip
    return CountingExecutor(executor, busy)


class CountingExecutor:
    """An executor that keeps ``board`` told how many of its jobs are in flight."""

    def __init__(self, executor: JobExecutor, board: cores.BusyBoard) -> None:
        self._executor = executor
        self._board = board

    def submit(self, fn: Any, /, *args: Any) -> Future[Any]:
        self._board.started()
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._board.finished()
            raise
        future.add_done_callback(lambda _: self._board.finished())
        return future


def die_with_parent(parent: int) -> None:
    """Process initializer: exit this process as soon as ``parent`` (the pid of the process
    that started it) is gone; a daemon thread watches for its reparenting."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)


class RayExecutor:
    """Each ``submit`` is one Ray task; its result arrives through a standard future."""

    def __init__(self, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError(
                "--backend ray needs Ray: pip install -e '.[ray]' (on every node)"
            ) from None
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                ray.init(address=address, **options)
            else:  # a private local instance on loopback, never one found via RAY_ADDRESS
                ray.init(address="local", _node_ip_address="127.0.0.1", **options)
        self._task = ray.remote(num_cpus=1, max_retries=0)(_call)

    def submit(self, fn: Any, /, *args: Any) -> Future[Any]:
        future: Future[Any] = self._task.remote(fn, *args).future()
        return future
