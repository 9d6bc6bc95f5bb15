"""The runtime: an evolved memory program at work in a live agent, over a memory store the user
owns.

Evaluation is the pipeline (:mod:`evolve.evaluation.pipeline`) plus the step cache plus scoring;
the runtime is the same pipeline plus a durable memory store: :mod:`.api` (the public verbs),
:mod:`.scopes` (one confined host per user, a bounded pool), :mod:`.store`
(:class:`~.store.MemoryStore`, the folder: manifest, programs, snapshots), :mod:`.log` (each
user's append-only session log) and :mod:`.upkeep` (forget, verify, repair). Importing this
package loads none of them.

Invariants: the runtime stands beside the optimizer (:mod:`evolve.evolution`) on evaluation and
imports nothing of it (an import-linter contract in pyproject.toml): how a program was scored,
and how it runs here, is :mod:`evolve.evaluation.identity`. ``import evolve.runtime.api`` loads
at most 50 project modules, none of the evaluation engine's executor, conversation or step
cache (``tests/test_layers.py``).
"""
