"""The memory server: an evolved memory served to agents over HTTP (and MCP), the tenant taken
from the credential.

:mod:`.records` (the typed requests, answers and errors), :mod:`.auth` (the operator's token
file, grants), :mod:`.service` (:class:`~.service.MemoryService`, the bounded verbs over one
:class:`evolve.runtime.api.AgentMemory`), :mod:`.http` (the FastAPI app), :mod:`.limits` (the
transport's bounds and the draining uvicorn server), :mod:`.mcptools` (the MCP tools) and
:mod:`.rayserve` (the Ray Serve backend). The package stands
above the runtime and imports nothing of the optimizer (:mod:`evolve.evolution`); the runtime
never imports it. Importing this package loads none of its modules.
"""
