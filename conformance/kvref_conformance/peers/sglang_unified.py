"""SGLang's ``UnifiedRadixCache`` over its own allocators, driven as its scheduler drives it (chapter 06).

SGLang 0.5.23's scheduler builds ``UnifiedRadixCache`` for most models (``mem_cache/registry.py``:
``create_unified_radix_cache`` unless the model is all sliding-window, or FlexKV or LMCache is
asked for); ``RadixCache`` (``peers/sglang_radix.py``) serves the rest. Its tree is a Rust core
(``rust_tree_core``, the default ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``), whose nodes are
integer ids and whose keys are ``RadixKey(array('q', tokens), extra_key)``. A full-attention
model has one tree component, ``ComponentType.FULL``; that is the cache built here.

The calls are the scheduler's: ``match_prefix(MatchPrefixParams(key))`` gives
``device_prefix_len`` and the last node's id, whose path's KV indices are
``tree_core.collect_full_device_indices(node, root_node_handle(extra_key))`` (what
``prefix_device_indices(req)`` reads); ``lock(node)`` returns a ``TreeLock`` and ``unlock`` takes
it back; ``insert(InsertParams(key, value, priority))`` returns ``prefix_len``; ``evict`` returns
``num_tokens_evicted``; ``flush_cache`` is ``reset`` plus the allocator's ``clear``.

One difference of contract, bridged here: given ``InsertParams.prev_prefix_len`` (the request's
protected length), SGLang's tree frees the request's duplicate slots itself (its ``FreeDeviceKV``
actions, for ``[prev_prefix_len, prefix_len)``), where chapter 06 has the caller free them
(RADIX-623). The adapter passes the whole key as protected, so the tree frees nothing, and the
suite's caller frees that same range through the allocator's ``free``. Sizes:
``evictable_size()``, ``protected_size()``, and the first of ``total_size()``'s pair (full
tokens; the second is sliding-window tokens). :class:`SglangUnifiedTree` checks nothing of its
own, so what the suite finds is SGLang's.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import count
from typing import Any

from kvref.oracle.radix import LockReceipt, MatchResult
from kvref_conformance.peers.sglang_events import SglangEventTranslator, key_namespace
from kvref_conformance.peers.sglang_radix import cache_params, load_radix_cache

__all__ = ["SglangUnifiedTree"]


class SglangUnifiedTree:
    """``UnifiedRadixCache`` (full attention) with the oracle tree's calls."""

    def __init__(self, allocator: Any, *, page_size: int, policy: str, enable_events: bool = False) -> None:
        import torch

        load_radix_cache()  # SGLang's import chain, on a CPU-only torch
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        self._torch = torch
        self._radix_key = RadixKey
        self._params = (MatchPrefixParams, InsertParams, EvictParams)
        params = cache_params(
            allocator,
            page_size=page_size,
            policy=policy,
            tree_components=(ComponentType.FULL,),
            enable_kv_cache_events=enable_events,
        )
        self.cache = UnifiedRadixCache(params)
        self._events = SglangEventTranslator(page_size, self.cache) if enable_events else None
        self._locks: dict[int, Any] = {}  # kvref receipt -> SGLang's TreeLock
        self._receipts = count(1)

    def _key(self, tokens: Sequence[int], namespace: Any) -> Any:
        """The key in ``namespace``, named as :func:`~kvref_conformance.peers.sglang_events.key_namespace` says."""
        return self._radix_key(array("q", tokens), **key_namespace(namespace, self._events is not None))

    def take_events(self) -> list[Any]:
        """SGLang's ``take_events()``, rewritten in chapter 06's hashes by their content (RADIX-634)."""
        return [] if self._events is None else self._events.take()

    def match(self, tokens: Sequence[int], *, namespace: Any = None) -> MatchResult:
        """``match_prefix``; the prefix's slots are the path's KV indices from the namespace's root."""
        found = self.cache.match_prefix(self._params[0](key=self._key(tokens, namespace)))
        node = int(found.last_device_node)  # a node id (a namespace's root on a miss); opaque to the suite
        root = self.cache.root_node_handle(None if self._events is not None else namespace)  # salts share a root
        slots = self.cache.tree_core.collect_full_device_indices(node, root)
        return MatchResult([int(s) for s in slots.tolist()], int(found.device_prefix_len), node)

    def lock(self, node: int) -> LockReceipt:
        """``lock`` (``inc_lock_ref``) on the node a match returned."""
        receipt = LockReceipt(next(self._receipts), node)
        self._locks[receipt.ident] = self.cache.lock(node)
        return receipt

    def unlock(self, receipt: LockReceipt) -> None:
        """``unlock`` of the receipt's ``TreeLock``, as the scheduler calls it (SGLang checks nothing)."""
        self.cache.unlock(self._locks[receipt.ident])

    def insert(self, tokens: Sequence[int], slots: Sequence[int], *, namespace: Any = None, priority: int = 0) -> int:
        """``insert``: the length already cached, which the caller's duplicates cover."""
        value = self._torch.tensor(list(slots), dtype=self._torch.int64)
        key = self._key(tokens, namespace)
        # The whole key as the request's protected length: the tree frees no duplicate itself, and the
        # caller frees [its protected length, prefix_len), the range SGLang's tree would have freed.
        insert = self._params[1](key=key, value=value, priority=priority, prev_prefix_len=len(tokens))
        return int(self.cache.insert(insert).prefix_len)

    def evict(self, num_tokens: int) -> int:
        """``evict``: the tokens it freed."""
        return int(self.cache.evict(self._params[2](num_tokens=num_tokens)).num_tokens_evicted)

    def evictable_size(self) -> int:
        """``evictable_size()``."""
        return int(self.cache.evictable_size())

    def protected_size(self) -> int:
        """``protected_size()``."""
        return int(self.cache.protected_size())

    def total_size(self) -> int:
        """The full-attention tokens of ``total_size()`` (its second number counts sliding-window tokens)."""
        return int(self.cache.total_size()[0])

    def reset(self) -> None:
        """What SGLang's ``flush_cache`` does: ``reset`` the tree and ``clear`` the allocator."""
        self.cache.reset()
        self.cache.token_to_kv_pool_allocator.clear()
        self._locks.clear()
