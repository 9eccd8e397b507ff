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
where torchvision is missing :func:`load_radix_cache` puts an empty one in its place
(``kvref.simulation.sglang_imports``); nothing the radix cache runs touches it. SGLang's
scheduler in 0.5.23 uses ``UnifiedRadixCache`` for most models (``peers/sglang_unified.py``,
backends ``sglang-unified*``); ``RadixCache`` serves FlexKV and the simulated queue tree (spec
chapter 06).
"""

from __future__ import annotations

import importlib.util
import sys
from array import array
from collections.abc import Sequence
from itertools import count
from typing import Any

from kvref.oracle.radix import LockReceipt, MatchResult
from kvref.simulation.sglang_imports import stand_in, stand_in_torchvision
from kvref_conformance.peers.sglang_events import SglangEventTranslator, key_namespace

__all__ = ["SglangRadixTree", "cache_params", "installed_release", "load_radix_cache", "make_sglang_importable"]


def _register_configurations_again() -> None:
    """Let ``transformers``' ``Auto*.register`` take a name it knows already (``exist_ok=True``).

    SGLang releases before 0.5.21 register configurations (``qwen3_asr``) that the transformers
    installed beside them (5.19, as 0.5.23 pins) ships itself, and the second registration raises.
    """
    import transformers

    for name in ("AutoConfig", "AutoProcessor", "AutoImageProcessor", "AutoTokenizer"):
        cls = getattr(transformers, name, None)
        register = getattr(cls, "register", None)
        if cls is None or register is None or getattr(register, "kvref_exist_ok", False):
            continue

        def again(*args: Any, _register: Any = register, **kwargs: Any) -> Any:
            return _register(*args, **{**kwargs, "exist_ok": True})

        again.kvref_exist_ok = True  # type: ignore[attr-defined]
        cls.register = staticmethod(again)


def make_sglang_importable() -> None:
    """Put in place, once, what SGLang imports at module level and its radix cache never runs: an
    empty ``torchvision`` where it is missing (after ``transformers`` decided it is absent), an empty
    ``sgl_kernel`` (the CUDA kernels the host KV pool of 0.5.6-0.5.16 imports), and, for releases
    before 0.5.21, configurations registered a second time without an error."""
    stand_in_torchvision()
    release = installed_release()
    if release < (0, 5, 17) and importlib.util.find_spec("sgl_kernel") is None and "sgl_kernel" not in sys.modules:
        stand_in("sgl_kernel", "sgl_kernel.kvcacheio")
    if release < (0, 5, 21) and importlib.util.find_spec("transformers") is not None:
        _register_configurations_again()


def installed_release() -> tuple[int, ...]:
    """The installed sglang's release numbers, ``(0, 5, 23)`` for 0.5.23; a build without release
    metadata (a work tree on the path) counts as newer than any release."""
    from importlib import metadata

    from packaging.version import InvalidVersion, Version

    try:
        return Version(metadata.version("sglang")).release
    except (metadata.PackageNotFoundError, InvalidVersion):
        return (1 << 31,)


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
    """``RadixCache`` with the oracle tree's calls (``match``, ``lock``, ``insert``, ``unlock``, ``evict``),
    each made the way the installed release's scheduler makes it.

    From 0.5.5 to 0.5.21 the scheduler locks with ``inc_lock_ref(node)`` and unlocks with
    ``dec_lock_ref(node)`` (passed the receipt ``inc_lock_ref`` returns where it returns one, which
    ``RadixCache`` does not read); from 0.5.22 with ``lock``/``unlock`` and a ``TreeLock``.
    ``match_prefix`` takes the key itself before 0.5.8 and ``MatchPrefixParams`` from 0.5.8;
    ``insert`` and ``evict`` take parameter objects from 0.5.9 (before, ``evict`` returns nothing:
    the tokens it freed are the fall of ``evictable_size``).
    ``RadixCache`` takes ``CacheInitParams`` from 0.5.6, its arguments before.

    A namespace goes to SGLang as the key's ``extra_key`` (the LoRA path). In a tree with events,
    from 0.5.18, it goes as the key's ``cache_salt`` (``repr(namespace)``), the namespace SGLang's
    KV events carry, so that :class:`~kvref_conformance.peers.sglang_events.SglangEventTranslator`
    can read a chain's namespace from its first event as RADIX-636 salts it; before 0.5.18 the key
    has no salt, and the scheduler puts a request's salt in its ``extra_key``, as this does.
    """

    def __init__(self, allocator: Any, *, page_size: int, policy: str, enable_events: bool = False) -> None:
        import inspect

        import torch
        from sglang.srt.mem_cache import base_prefix_cache

        radix_cache = load_radix_cache()
        self._torch = torch
        self._radix_key = radix_cache.RadixKey
        self._match_params = getattr(base_prefix_cache, "MatchPrefixParams", None)
        self._insert_params = getattr(base_prefix_cache, "InsertParams", None)
        self._evict_params = getattr(base_prefix_cache, "EvictParams", None)
        if "params" in inspect.signature(radix_cache.RadixCache.__init__).parameters:
            params = cache_params(allocator, page_size=page_size, policy=policy, enable_kv_cache_events=enable_events)
            self.cache = radix_cache.RadixCache(params)
        else:
            self.cache = radix_cache.RadixCache(
                None, allocator, page_size, disable=False, enable_kv_cache_events=enable_events, eviction_policy=policy
            )
        self._insert_priority = "priority" in inspect.signature(self.cache.insert).parameters
        self._salted_keys = "cache_salt" in inspect.signature(radix_cache.RadixKey.__init__).parameters
        self._array_keys = isinstance(self.cache.root_node.key.token_ids, array)
        self._events = SglangEventTranslator(page_size, self.cache) if enable_events else None
        self._nodes: dict[int, Any] = {}
        self._locks: dict[int, Any] = {}  # kvref receipt -> SGLang's TreeLock, or (node, receipt)
        self._receipts = count(1)

    def _key(self, tokens: Sequence[int], namespace: Any) -> Any:
        salted = self._events is not None and self._salted_keys
        token_ids = array("q", tokens) if self._array_keys else list(tokens)
        return self._radix_key(token_ids, **key_namespace(namespace, salted))

    def take_events(self) -> list[Any]:
        """SGLang's ``take_events()``, rewritten in chapter 06's hashes by their content (RADIX-634)."""
        return [] if self._events is None else self._events.take()

    def match(self, tokens: Sequence[int], *, namespace: Any = None) -> MatchResult:
        """``match_prefix``; the prefix's slots are the path's KV indices (``device_indices`` before 0.5.22)."""
        key = self._key(tokens, namespace)
        found = self.cache.match_prefix(key if self._match_params is None else self._match_params(key=key))
        node = found.last_device_node
        if hasattr(found, "device_prefix_len"):
            slots = [int(s) for s in self.cache.path_device_indices(node).tolist()]
            length = int(found.device_prefix_len)
        else:
            slots = [int(s) for s in found.device_indices.tolist()]
            length = len(slots)
        ident = 0 if node is self.cache.root_node else int(node.id)
        self._nodes[ident] = node
        return MatchResult(slots, length, ident)

    def lock(self, node: int) -> LockReceipt:
        """``lock`` (a ``TreeLock``), or before 0.5.22 ``inc_lock_ref``, on the node a match returned."""
        receipt = LockReceipt(next(self._receipts), node)
        tree_node = self._node(node)
        if hasattr(self.cache, "lock"):
            self._locks[receipt.ident] = self.cache.lock(tree_node)
        else:
            taken = self.cache.inc_lock_ref(tree_node)
            self._locks[receipt.ident] = (tree_node, getattr(taken, "to_dec_params", lambda: None)())
        return receipt

    def unlock(self, receipt: LockReceipt) -> None:
        """``unlock`` of the receipt's ``TreeLock``, or before 0.5.22 ``dec_lock_ref`` of its node, as the
        scheduler calls it (SGLang checks nothing)."""
        held = self._locks[receipt.ident]
        if hasattr(self.cache, "unlock"):
            self.cache.unlock(held)
            return
        tree_node, release = held
        if release is None:
            self.cache.dec_lock_ref(tree_node)
        else:
            self.cache.dec_lock_ref(tree_node, release)

    def _node(self, ident: int) -> Any:
        return self.cache.root_node if ident == 0 else self._nodes[ident]

    def insert(self, tokens: Sequence[int], slots: Sequence[int], *, namespace: Any = None, priority: int = 0) -> int:
        """``insert``: the length already cached, which the caller's duplicates cover."""
        value = self._torch.tensor(list(slots), dtype=self._torch.int64)
        key = self._key(tokens, namespace)
        if self._insert_params is not None:
            return int(self.cache.insert(self._insert_params(key=key, value=value, priority=priority)).prefix_len)
        if self._insert_priority:
            return int(self.cache.insert(key, value, priority=priority))
        return int(self.cache.insert(key, value))

    def evict(self, num_tokens: int) -> int:
        """``evict``: the tokens it freed."""
        if self._evict_params is not None:
            return int(self.cache.evict(self._evict_params(num_tokens=num_tokens)).num_tokens_evicted)
        before = int(self.cache.evictable_size())
        self.cache.evict(num_tokens)
        return before - int(self.cache.evictable_size())

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
