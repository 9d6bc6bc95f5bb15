"""Probing questions written from a user's history by a task model, each verified (``evolve
synth``).

One module per concept: :mod:`.kinds` (the six kinds and their capabilities),
:mod:`.windows` (the history cut window by window), :mod:`.write` (one writing call per window
and kind), :mod:`.checks` (the four checks), :mod:`.journal` (what a killed run had finished),
:mod:`.report` (the rejection counts) and :mod:`.driver` (the run: resumable, concurrent,
budgeted). The command is :mod:`evolve.cli.synth`. This package re-exports nothing.
"""
