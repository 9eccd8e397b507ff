"""vLLM as a peer: its v1 ``BlockPool`` driven through kvref's protocol, as vLLM's engine drives it.

The adapter is :mod:`.pool` (its docstring says what it does on vLLM's behalf and what it leaves
to vLLM); the ``vllm`` and ``vllm-nocache`` backends, named by the entry points, are
:mod:`.backend`. The request-level manager's adapter will be a module beside them.
"""

from kvref_conformance.peers.vllm.backend import VllmBackend, backend, backend_nocache
from kvref_conformance.peers.vllm.pool import VllmBlockPool

__all__ = ["VllmBackend", "VllmBlockPool", "backend", "backend_nocache"]
