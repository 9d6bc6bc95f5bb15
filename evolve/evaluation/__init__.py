"""Evaluation: how one memory program is run over conversations and scored.

Owns everything between a checked program and its scores, one module per concept:
:mod:`~evolve.evaluation.setup` (what an evaluation runs with, and the one place that builds
task and judge clients and the embedder), :mod:`~evolve.evaluation.pipeline` (the program in
its confined host: extract, index, plan, retrieve, answer), :mod:`~evolve.evaluation.backend`
(the host's model and embedder requests, served under budget),
:mod:`~evolve.evaluation.stepcache` (the reusable step outputs),
:mod:`~evolve.evaluation.conversation` (one conversation through the pipeline, steps reused),
:mod:`~evolve.evaluation.executor` (conversations fanned out and scored),
:mod:`~evolve.evaluation.distributed` (where conversations run: local processes or Ray),
:mod:`~evolve.evaluation.prompts` and :mod:`~evolve.evaluation.diagnostics`.

Invariants: the optimizer (:mod:`evolve.evolution`) and the runtime (:mod:`evolve.runtime`)
both stand on this package and on nothing of each other; nothing here imports either of them.
Importing the package imports none of its modules.
"""
