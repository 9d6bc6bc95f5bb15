"""The runtime: an evolved memory program at work in a live agent, over a store the user owns.

Evaluation is the pipeline (:mod:`evolve.evaluation.pipeline`) plus the step cache plus scoring; the
runtime is the same pipeline plus a durable store: :mod:`.api` (the public verbs), :mod:`.scopes`
(one confined host per user, a bounded pool), :mod:`.store` (the folder: manifest, programs,
snapshots) and :mod:`.log` (each user's append-only session log). Importing this package loads
none of them.
"""
