"""The sandbox: every candidate program is checked here before it costs a model call, and all
candidate code — in the check and in evaluation — runs in a confined host process.

Entry point: :func:`sandbox.check.check_program`. Modules: ``static`` (tier 1 analysis),
``tiers`` (smoke and complexity probe), ``check`` (the report), ``isolate`` (the optimizer's
side of a host), ``host`` and ``serve`` (the host process), ``wire`` (frames between them).
"""
