"""Megatron-Core's ``KVBlockAllocator`` driven through kvref's protocol, the way its dynamic context drives it.

Megatron-Core (checked with ``megatron-core==0.19.2``) keeps its inference KV blocks in
``megatron.core.inference.contexts.kv_block_allocator.KVBlockAllocator``: a stack of block ids
(``block_bag``), one reference count per block, a dict from hash to block, and, under the
``lru`` policy, a leaf-first eviction keyed by each block's last-access step. Hashing and
matching live in ``DynamicInferenceContext``; this adapter does that part the way the context
does it (``_find_kv_match_count`` and ``add_request``): a lookup finds the last hash of the
chain that is in the dict and takes every block before it, matched blocks get their reference
counts bumped and their timestamps set, new full blocks are registered with their parents' hashes
(0 for a root). The engine advances ``prefix_cache_lru_clock`` once per step; here every call
that touches blocks is one step.

Mapping: Megatron's dummy block is its *last* block; kvref's reserved null block is block 0. A
kvref id ``b`` is Megatron's ``(b - 1) mod n``, so kvref's block 0 is Megatron's dummy (block ids
are the implementation's to choose, POOL-115). kvref hashes ``h`` become ``h + 1`` (Megatron
reserves 0 for "no parent" and -1 for "no hash"). Holders, generations and argument checks are
kept here. Policies: ``ref-zero`` (Megatron's ``REF_ZERO``) and ``lru-leaf-access`` (its ``LRU``,
which stamps blocks when they are allocated or matched, never at release: EVICT-411). No
KV events. Megatron-Core 0.18+ declares Python >= 3.12 only because of a compiled dataset helper;
the allocator is pure Python, so ``nox -s peer-megatron`` unpacks the wheel onto the path.
Releases before 0.18 put the allocator's tensors on ``torch.cuda.current_device()``; where torch has
no CUDA, the adapter answers that question with the CPU while the allocator is built or reset
(:func:`current_device_on_cpu`): the bookkeeping is the same on either device. Megatron's own block
hash (``compute_block_hashes_batched``, which its requests hash their prompts with) is offered as
``hash_blocks`` (chapter 02).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Hashable, Iterator, Sequence
from importlib import metadata
from typing import Any, SupportsIndex

from kvref.contract.errors import (
    CacheInUseError,
    ConfigError,
    OutOfBlocksError,
)
from kvref.contract.events import KVEvent, PrefixCacheStats
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
)
from kvref_conformance.adapter import HeldReferences, checked_registration
from kvref_conformance.peers.engine_ids import EngineIds

__all__ = ["MegatronBackend", "MegatronBlockAllocator", "backend"]

INSTALL = "use `nox -s peer-megatron` (unpacks megatron-core 0.19.2's allocator; see README)"
_CAPABILITIES = frozenset(
    {"prefix-cache", "pause", "evict", "clear", "policy-ref-zero", "policy-lru-leaf-access", "hashing"}
)


@contextlib.contextmanager
def current_device_on_cpu(torch: Any) -> Iterator[None]:
    """While it lasts, ``torch.cuda.current_device()`` answers ``"cpu"`` where torch has no CUDA (releases
    before 0.18 place the allocator's tensors there); with CUDA, nothing changes."""
    if torch.cuda.is_available():
        yield
        return
    asked = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = asked


class _Context:
    """The two things ``KVBlockAllocator`` reads from its context: the LRU clock and request counts."""

    def __init__(self) -> None:
        self.prefix_cache_lru_clock = 0
        self.paused_request_count = 0
        self.total_request_count = 0


class MegatronBlockAllocator(HeldReferences):
    """kvref's PrefixCache over Megatron-Core's ``KVBlockAllocator`` (see the module doc)."""

    name = "megatron"

    def __init__(
        self,
        num_blocks: int,
        *,
        policy: str = "ref-zero",
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> None:
        import torch
        from megatron.core.inference.config import PrefixCachingEvictionPolicy
        from megatron.core.inference.contexts.kv_block_allocator import KVBlockAllocator

        op = "megatron"
        self._n, self._reserved = as_pool_shape(num_blocks, reserved_ids, op=op)
        if self._reserved != (0,):
            raise ConfigError(
                "CONF-904", f"{op}: Megatron reserves exactly one (dummy) block; reserved_ids must be (0,)"
            )
        self._policy = as_policy(policy)
        chosen = {
            EvictionPolicy.REF_ZERO: PrefixCachingEvictionPolicy.REF_ZERO,
            EvictionPolicy.LRU_LEAF_ACCESS: PrefixCachingEvictionPolicy.LRU,
        }.get(self._policy)
        if chosen is None:
            raise ConfigError("CONF-904", f"{op}: Megatron offers ref-zero and lru-leaf-access, not {policy!r}")
        self._torch = torch
        self.context = _Context()
        with current_device_on_cpu(torch):
            self.allocator = KVBlockAllocator(
                self.context, self._n, 0, enable_prefix_caching=True, prefix_caching_eviction_policy=chosen
            )
        # Releases before 0.19 register hashes without their parents (and evict by timestamp only).
        self._with_parents = "parent_hashes" in inspect.signature(self.allocator.register_kv_block_hashes).parameters
        self._start_references(paused_limit, op)
        self._requests = self._queries = self._hits = self._evictions = self._resets = 0

    # ------------------------------------------------------------ id and hash mapping

    def _m(self, b: int) -> int:
        return (b - 1) % self._n

    def _k(self, m: int) -> int:
        return (m + 1) % self._n

    def _tensor(self, ids: list[int]) -> Any:
        return self._torch.tensor([self._m(b) for b in ids], dtype=self._torch.int64)

    def _step(self) -> None:
        self.context.prefix_cache_lru_clock += 1

    # ------------------------------------------------------------ observation (from Megatron)

    @property
    def num_free(self) -> int:
        """Megatron's ``total_avail`` (blocks in the bag)."""
        return int(self.allocator.total_avail)

    @property
    def num_cached(self) -> int:
        """Megatron's ``get_evictable_block_count()``."""
        return int(self.allocator.get_evictable_block_count())

    @property
    def num_in_use(self) -> int:
        """Blocks with a Megatron reference count above 0."""
        return int((self.allocator.block_ref_counts > 0).sum())

    @property
    def num_available(self) -> int:
        """Free, plus evictable under lru-leaf-access (Megatron's ``is_memory_available`` arithmetic)."""
        if self._policy is EvictionPolicy.REF_ZERO:
            return self.num_free
        return self.num_free + self.num_cached

    @property
    def policy(self) -> EvictionPolicy:
        """ref-zero or lru-leaf-access."""
        return self._policy

    def capabilities(self) -> frozenset[str]:
        """Prefix cache, the two policies, paused holders (kept here), evict and clear."""
        return _CAPABILITIES

    def ref_count(self, block_id: SupportsIndex) -> int:
        """Megatron's own reference count (0 for the dummy block)."""
        b = self._id(block_id, "ref_count")
        return 0 if b == 0 else int(self.allocator.block_ref_counts[self._m(b)])

    def hash_blocks(self, tokens: Sequence[int], block_size: int) -> list[int]:
        """Megatron's own hashes of the full blocks of ``tokens`` (``compute_block_hashes_batched``, which its
        requests hash their prompts with), in this adapter's numbering (Megatron's minus one, as
        :meth:`block_hash`). Megatron's block hashes take no cache salt, adapter or image: the call has no
        argument for them."""
        import torch
        from megatron.core.inference.inference_request import compute_block_hashes_batched

        prompt = torch.tensor(list(tokens), dtype=torch.int64)
        return [int(h) - 1 for h in compute_block_hashes_batched(prompt, block_size)]

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash Megatron's ``block_hashes`` holds for the block, or None."""
        b = self._id(block_id, "block_hash")
        h = int(self.allocator.block_hashes[self._m(b)]) if b else -1
        return None if h < 1 else h - 1

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """Reserved, in use, cached (hashed, no reference) or free."""
        b = self._id(block_id, "block_state")
        if b == 0:
            return BlockState.RESERVED
        if self.ref_count(b) > 0:
            return BlockState.IN_USE
        return BlockState.CACHED if self.block_hash(b) is not None else BlockState.FREE

    def resident_hashes(self) -> frozenset[int]:
        """Keys of Megatron's hash-to-block dict."""
        return frozenset(h - 1 for h in self.allocator.kv_hash_to_block_id)

    def take_events(self) -> list[KVEvent]:
        """Megatron emits no KV events."""
        return []

    @property
    def stats(self) -> PrefixCacheStats:
        """Counted here (Megatron's context keeps no prefix-cache statistics)."""
        return PrefixCacheStats(self._requests, self._queries, self._hits, self._evictions, self._resets)

    # ------------------------------------------------------------ allocation and release

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> Sequence[int]:
        """``allocate_memory_blocks(count)`` (evicting leaf-first under lru-leaf-access); None is OutOfBlocksError."""
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        self.paused.refuse(holder, n, "allocate")
        if n == 0:
            return []
        self._step()
        cached_before = self.num_cached
        got = self.allocator.allocate_memory_blocks(n)
        if got is None:
            raise OutOfBlocksError("POOL-105", f"allocate: Megatron has no room for {n} blocks")
        ids = [self._k(int(m)) for m in got.tolist()]
        self._evictions += cached_before - self.num_cached
        self._record_references(ids, holder, allocated=True)  # passed through unchanged: the suite judges them
        return EngineIds(got, self._k)  # what Megatron returned, renamed as it is read

    def free(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """``release_memory_blocks`` with every occurrence (Megatron scatters the decrements)."""
        ids = as_block_id_list(block_ids, op="free")
        holder = as_holder(holder, op="free")
        self._check(ids, holder, generations, "free", sharing=False)
        if not ids:
            return
        self._record_release(ids, holder)
        self._step()
        hashed_before = len(self.allocator.kv_hash_to_block_id)
        self.allocator.release_memory_blocks(self._tensor(ids).to(self._torch.int32))
        if self._policy is EvictionPolicy.REF_ZERO:
            self._evictions += hashed_before - len(self.allocator.kv_hash_to_block_id)

    def _pin(self, ids: list[int], holder: Hashable) -> None:
        """What ``add_request`` does to matched blocks: bump the counts, stamp the time."""
        if not ids:
            return
        self._step()
        tensor = self._tensor(ids)
        counts = self.allocator.block_ref_counts
        counts.scatter_add_(0, tensor, self._torch.ones(len(ids), dtype=counts.dtype))
        self.allocator.update_timestamps(tensor)
        self._record_references(ids, holder)

    def acquire(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """Share blocks: the reference-count bump the context applies to matched blocks (POOL-110)."""
        ids = as_block_id_list(block_ids, op="acquire")
        holder = as_holder(holder, op="acquire")
        self.paused.refuse(holder, len(ids), "acquire")
        self._check(ids, holder, generations, "acquire", sharing=True)
        self._pin(ids, holder)

    # ------------------------------------------------------------ prefix cache

    def register(
        self, block_ids: IntsLike, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None
    ) -> None:
        """``register_kv_block_hashes(ids, hashes, parents)`` with the chain's parents (0 for the root)."""
        table = self.allocator.kv_hash_to_block_id
        ids, hs, parent = checked_registration(
            self, block_ids, block_hashes, parent_hash, parent_resident=lambda h: h + 1 in table
        )
        if not ids:
            return
        chain = [0 if parent is None else parent + 1] + [h + 1 for h in hs]
        if self._with_parents:
            self.allocator.register_kv_block_hashes([self._m(b) for b in ids], chain[1:], chain[:-1])
        else:
            self.allocator.register_kv_block_hashes([self._m(b) for b in ids], chain[1:])

    def lookup(self, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None) -> list[int]:
        """``_find_kv_match_count``: the last hash of the chain found in the dict, and every block before it.

        Megatron relies on prefix closure and searches from the end; a chain always starts at the
        root, so ``parent_hash`` is checked for type only.
        """
        hs = as_hash_list(block_hashes, op="lookup")
        if parent_hash is not None:
            as_hash(parent_hash, op="lookup", arg="parent_hash")
        table = self.allocator.kv_hash_to_block_id
        for i in range(len(hs) - 1, -1, -1):
            if hs[i] + 1 in table:
                return [self._k(table[h + 1]) for h in hs[: i + 1]]
        return []

    def match(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> list[int]:
        """``lookup``, then pin the hit as ``add_request`` does (PFX-309)."""
        hs = as_hash_list(block_hashes, op="match")
        holder = as_holder(holder, op="match")
        self.paused.refuse(holder, len(hs), "match")
        hit = self.lookup(hs, parent_hash=parent_hash)
        self._pin(hit, holder)
        self._requests += 1
        self._queries += len(hs)
        self._hits += len(hit)
        return hit

    def reset(self) -> None:
        """Megatron's ``reset()``, refused while a block is in use (PFX-313)."""
        in_use = self.num_in_use
        if in_use:
            raise CacheInUseError("PFX-313", f"reset: {in_use} block(s) in use")
        with current_device_on_cpu(self._torch):
            self.allocator.reset()
        self._resets += 1

    def clear(self) -> None:
        """Megatron's ``reset()`` as its engine calls it to start over, blocks in use included (POOL-124);
        the caller-side record of holders and pauses goes with it, generations stay."""
        with current_device_on_cpu(self._torch):
            self.allocator.reset()
        self._holders.clear()
        self._held.clear()
        self.paused.clear()
        self._resets += 1

    def evict(self, count: SupportsIndex) -> bool:
        """``evict_lru_blocks(count)`` (EVICT-412): what its allocation would evict, or False and nothing."""
        n = as_count(count, op="evict")
        cached_before = self.num_cached
        done = bool(self.allocator.evict_lru_blocks(n))
        self._evictions += cached_before - self.num_cached
        return done


class MegatronBackend:
    """The ``megatron`` entry point."""

    name = "megatron"

    def version(self) -> str:
        """The megatron-core version on the path."""
        try:
            return metadata.version("megatron-core")
        except metadata.PackageNotFoundError:
            try:
                from megatron.core.package_info import __version__

                # Its package_info appends the git commit of the current directory, whatever repository that is.
                return str(__version__).split("+", 1)[0]
            except Exception:
                return "not installed"

    def availability(self) -> str | None:
        """None when the allocator imports; else why not and how to get it."""
        try:
            import megatron.core.inference.contexts.kv_block_allocator  # noqa: F401
        except ModuleNotFoundError as exc:
            if exc.name == "megatron" or (exc.name or "").startswith("megatron."):
                return f"{exc.name} is not installed; {INSTALL}"
            return f"a module it imports is missing ({exc}); {INSTALL}"
        except Exception as exc:  # Megatron raises more than ImportError when its environment is off
            return f"megatron-core's allocator does not import ({type(exc).__name__}: {exc}); {INSTALL}"
        return None

    def device(self, requested: str | None = None) -> str:
        """Megatron's allocator keeps its bookkeeping on the CPU."""
        if requested not in (None, "cpu", "host"):
            raise ConfigError("CONF-907", f"backend 'megatron' keeps its state on the cpu, not on {requested!r}")
        return "cpu"

    def capabilities(self) -> frozenset[str]:
        """Prefix cache, ref-zero and lru-leaf-access, paused holders; its context's request path (context-duties)."""
        return _CAPABILITIES | {"context-duties"}

    def create_context(self, *, device: str | None = None, **settings: Any) -> Any:
        """``DynamicInferenceContext``'s request path over a new ``KVBlockAllocator`` (chapter 07's context duties)."""
        from kvref_conformance.peers.megatron_context import MegatronContextEngine

        self.device(device)
        return MegatronContextEngine(**settings)

    def create(
        self,
        num_blocks: int,
        *,
        policy: str = "ref-zero",
        device: str | None = None,
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> MegatronBlockAllocator:
        """A new adapter over a new ``KVBlockAllocator``."""
        self.device(device)
        return MegatronBlockAllocator(
            num_blocks, policy=policy, reserved_ids=reserved_ids, paused_limit=paused_limit, enable_events=enable_events
        )


#: Megatron-Core's KVBlockAllocator (entry point ``megatron``).
backend = MegatronBackend()
