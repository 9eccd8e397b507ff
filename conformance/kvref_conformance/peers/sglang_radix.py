"""SGLang's ``RadixCache`` over its own allocators, driven the way SGLang's scheduler drives it (chapter 06).

SGLang 0.5.23's scheduler, for a request: ``match_prefix(MatchPrefixParams(key=RadixKey(tokens,
extra_key)))`` gives ``device_prefix_len`` and the last node, whose path holds the prefix's KV
indices (``path_device_indices``); ``lock(node)`` (a ``TreeLock``: ``inc_lock_ref`` and its
receipt) protects it while the request runs; the rest is allocated from
``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator`` (after ``evict(EvictParams)`` when
short). On release, ``release_kv_cache`` -> ``checkpoint`` inserts the page-aligned key
(``insert(InsertParams(key, value, priority))``), frees the duplicates between the request's
protected length and the returned ``prefix_len`` (``free_segment``: for page-aligned rows the
pages ``free`` releases), and ``unlock(lock)`` (after moving the lock to the re-matched last
node, which changes no size). ``flush_cache`` is ``reset`` plus the allocator's ``clear``.
:class:`SglangRadixTree` makes these calls and nothing else: no check of its own (a second
``unlock`` of one lock goes to SGLang as it is), so what the suite finds is SGLang's. Receipts map
kvref's ``LockReceipt`` to SGLang's ``TreeLock``.

SGLang's package imports its model configurations, which import ``transformers`` and, for some
vision models, ``torchvision``. PyPI's torchvision does not import beside torch's CPU build, so
where torchvision is missing :func:`load_radix_cache` imports ``transformers`` first (it then
knows torchvision is absent) and puts an empty ``torchvision`` module in its place; nothing the
radix cache runs touches it. SGLang's scheduler in 0.5.23 uses ``UnifiedRadixCache`` for most
models (``peers/sglang_unified.py``, backends ``sglang-unified*``); ``RadixCache`` serves FlexKV
and the simulated queue tree (spec chapter 06).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from itertools import count
from typing import Any

from kvref.oracle.radix import LockReceipt, MatchResult
from kvref_conformance.peers.sglang_events import SglangEventTranslator, key_namespace

__all__ = ["SglangRadixTree", "cache_params", "load_radix_cache", "make_sglang_importable"]


def _stand_in_for_torchvision() -> None:
    """An empty ``torchvision`` package, after ``transformers`` has decided it is absent."""
    import transformers.image_utils  # noqa: F401  (decides, before the stand-in exists)

    def attribute(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    # older releases' utilities import torchvision.io at module level as well
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional", "torchvision.io"):
        module = types.ModuleType(name)
        module.__path__ = []
        module.__file__ = f"<kvref stand-in for {name}>"
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__getattr__ = attribute  # type: ignore[method-assign]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def make_sglang_importable() -> None:
    """Put the empty ``torchvision`` in place where it is missing (see the module), once."""
    if importlib.util.find_spec("torchvision") is None and "torchvision" not in sys.modules:
        _stand_in_for_torchvision()


def load_radix_cache() -> Any:
    """``sglang.srt.mem_cache.radix_cache``, importable on a CPU-only torch (see the module)."""
    make_sglang_importable()
    import sglang.srt.mem_cache.radix_cache as radix_cache

    return radix_cache


def cache_params(allocator: Any, *, page_size: int, policy: str, **more: Any) -> Any:
    """SGLang's ``CacheInitParams`` for a tree over ``allocator``: no request pool, caching on."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    return CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        eviction_policy=policy,
        **more,
    )


class SglangRadixTree:
    """``RadixCache`` with the oracle tree's calls (``match``, ``lock``, ``insert``, ``unlock``, ``evict``).

    A namespace goes to SGLang as the key's ``extra_key`` (the LoRA path); in a tree with events
    it goes as the key's ``cache_salt`` (``repr(namespace)``), the namespace SGLang's KV events
    carry, so that :class:`~kvref_conformance.peers.sglang_events.SglangEventTranslator` can
    read a chain's namespace from its first event as RADIX-634 salts it.
    """

    def __init__(self, allocator: Any, *, page_size: int, policy: str, enable_events: bool = False) -> None:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

        radix_cache = load_radix_cache()
        self._torch = torch
        self._radix_key = radix_cache.RadixKey
        self._params = (MatchPrefixParams, InsertParams, EvictParams)
        params = cache_params(allocator, page_size=page_size, policy=policy, enable_kv_cache_events=enable_events)
        self.cache = radix_cache.RadixCache(params)
        self._events = SglangEventTranslator(page_size, self.cache) if enable_events else None
        self._nodes: dict[int, Any] = {}
        self._locks: dict[int, Any] = {}  # kvref receipt -> SGLang's TreeLock
        self._receipts = count(1)

    def _key(self, tokens: Sequence[int], namespace: Any) -> Any:
        return self._radix_key(list(tokens), **key_namespace(namespace, self._events is not None))

    def take_events(self) -> list[Any]:
        """SGLang's ``take_events()``, rewritten in chapter 06's hashes by their content (RADIX-634)."""
        return [] if self._events is None else self._events.take()

    def match(self, tokens: Sequence[int], *, namespace: Any = None) -> MatchResult:
        """``match_prefix``; the prefix's slots are the path's KV indices."""
        match_params = self._params[0]
        found = self.cache.match_prefix(match_params(key=self._key(tokens, namespace)))
        node = found.last_device_node
        slots = [int(s) for s in self.cache.path_device_indices(node).tolist()]
        ident = 0 if node is self.cache.root_node else int(node.id)
        self._nodes[ident] = node
        return MatchResult(slots, int(found.device_prefix_len), ident)

    def lock(self, node: int) -> LockReceipt:
        """``lock`` (``inc_lock_ref``) on the node a match returned."""
        receipt = LockReceipt(next(self._receipts), node)
        self._locks[receipt.ident] = self.cache.lock(self._node(node))
        return receipt

    def unlock(self, receipt: LockReceipt) -> None:
        """``unlock`` of the receipt's ``TreeLock``, as the scheduler calls it (SGLang checks nothing)."""
        self.cache.unlock(self._locks[receipt.ident])

    def _node(self, ident: int) -> Any:
        return self.cache.root_node if ident == 0 else self._nodes[ident]

    def insert(self, tokens: Sequence[int], slots: Sequence[int], *, namespace: Any = None, priority: int = 0) -> int:
        """``insert``: the length already cached, which the caller's duplicates cover."""
        insert_params = self._params[1]
        value = self._torch.tensor(list(slots), dtype=self._torch.int64)
        key = self._key(tokens, namespace)
        return int(self.cache.insert(insert_params(key=key, value=value, priority=priority)).prefix_len)

    def evict(self, num_tokens: int) -> int:
        """``evict``: the tokens it freed."""
        evict_params = self._params[2]
        return int(self.cache.evict(evict_params(num_tokens=num_tokens)).num_tokens_evicted)

    def evictable_size(self) -> int:
        """``evictable_size()``."""
        return int(self.cache.evictable_size())

    def protected_size(self) -> int:
        """``protected_size()``."""
        return int(self.cache.protected_size())

    def total_size(self) -> int:
        """``total_size()``."""
        return int(self.cache.total_size())

    def reset(self) -> None:
        """What SGLang's ``flush_cache`` does: ``reset`` the tree and ``clear`` the allocator."""
        self.cache.reset()
        self.cache.token_to_kv_pool_allocator.clear()
        self._nodes.clear()
        self._locks.clear()
