"""PrisMem: evolve the memory programs of long-horizon LLM agents, and run them.

The public API is :func:`open_memory` (:mod:`evolve.runtime.api`): an evolved program as the
memory of a live agent. It is loaded on first use (PEP 562), so importing a part of the
package (``evolve.config``, the CLI) does not load the runtime and the evaluation engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolve.runtime.api import AgentMemory, AgentMemoryError, open_memory

__all__ = ["AgentMemory", "AgentMemoryError", "open_memory"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from evolve.runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'evolve' has no attribute {name!r}")
