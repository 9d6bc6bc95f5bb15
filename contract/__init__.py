"""The contract between the optimizer and a memory program: the leaf every other package reads.

It imports nothing else of the project (only the standard library and numpy), so the confined
sandbox host can load it without loading evaluation (:mod:`evolve`). Modules: ``spec`` (what a
program must define, which names belong to which pipeline component), ``types`` (``Segment`` /
``Message``, what a program receives, and the ``MemoryBackend`` it is given), ``program``
(loading a module and checking its names and signatures), ``records`` (the record schemas of
``MemoryUnit`` / ``Query``, validation and offline stand-ins) and ``state`` (the restricted
codec of memory state).
"""
