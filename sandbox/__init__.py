"""The sandbox: every candidate program is checked here before it costs a model call, and all
candidate code — in the check and in evaluation — runs in a confined host process.

Entry point: :func:`sandbox.check.check_program`. Modules: ``static`` (tier 1 analysis; with
``objects`` and ``statefulness``), ``tiers`` (the smoke tier and the probe's runs, in the host),
``probe`` (the probe's verdict, outside the host), ``check`` (the report), ``isolate`` (the
optimizer's side of a host), ``host`` and ``serve`` (the host process), ``barrier`` and
``landlock`` (the OS barrier the host confines itself with), ``wire`` (frames between them).
"""
