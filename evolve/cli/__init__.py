"""The ``evolve`` command line (entry point :func:`evolve.cli.main.main`, ``python -m evolve``).

Modules: :mod:`~evolve.cli.main` (parser and dispatch), :mod:`~evolve.cli.common` (errors,
consoles, progress, shared options and flag types), :mod:`~evolve.cli.eval` (``eval``,
``compare``, ``check``, ``data``), :mod:`~evolve.cli.run` (``run``) and
:mod:`~evolve.cli.inspect` (``runs``, ``status``, ``programs``, ``show``, ``diff``,
``lineage``) and :mod:`~evolve.cli.deliver` (``freeze``, ``export``, ``report``). ``main``
imports the command modules, they import ``common`` (``deliver`` also ``inspect``'s helpers),
and nothing imports back.
"""
