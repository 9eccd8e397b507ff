"""Capabilities: what an implementation declares it offers, and the groups of them backends share.

A test that needs a capability is skipped, with the description below, on an implementation
that does not declare it (chapter 09). :mod:`kvref.contract.protocol` re-exports every name here.
"""

from __future__ import annotations

__all__ = [
    "ARRAY_CAPABILITIES",
    "CAPABILITIES",
    "DATA_CAPABILITIES",
    "SLOT_CAPABILITIES",
    "STANDARD_CAPABILITIES",
    "TIER_CAPABILITIES",
]

#: Capability names an implementation may declare, with the one-line description a test suite
#: prints when it skips a test for want of the capability.
CAPABILITIES: dict[str, str] = {
    "block-pool": "offers chapter 01's block pool (create); a test that names no other capability needs it",
    "prefix-cache": "registers full blocks under their hash and serves longest-prefix hits",
    "events": "reports KV events (stored, removed, all cleared)",
    "batching": "offers allocate_many, free_many and match_many over a whole scheduler step",
    "id-arrays": (
        "returns ids as arrays too: allocate_ids, match_ids, allocate_many_ids and free_many_ids (POOL-116, POOL-117, "
        "POOL-123)"
    ),
    "pause": "tracks paused holders against a soft limit",
    "evict": "evicts ahead of an allocation, all or nothing (evict: Megatron-Core's evict_lru_blocks, EVICT-412)",
    "clear": "drops every reference, pause and registration at once, blocks in use included (clear, POOL-124)",
    "invariants": "can verify its own invariants (check_invariants)",
    "snapshot": "can return its whole observable state for before/after comparison",
    "hashing": "computes block hashes of token ids itself (hash_blocks)",
    "request-prefix": "matches a request's cached prefix leaving its last token uncomputed (match_request)",
    "token-slots": "hands out token slots in pages (create_slots: chapter 06's allocator)",
    "slot-versions": "its token slots carry versions that detect a stale (slot, version) pair (RADIX-608)",
    "slot-order": "hands out token slots in chapter 06's order (RADIX-610)",
    "slot-batches": "allocates token slots for a whole scheduler step in one call (alloc_many, RADIX-612)",
    "slot-extend": "extends requests' prefixes by a step's tokens (alloc_extend, alloc_decode: RADIX-613..615)",
    "radix-cache": "offers chapter 06's radix cache over its token-slot allocator (create_radix)",
    "radix-receipts": "refuses a second unlock of one lock receipt, changing nothing (RADIX-624)",
    "radix-capacity": "its radix cache takes a capacity in tokens that every insert enforces (RADIX-633)",
    "radix-events": "its radix cache reports a KV event per page stored or evicted (take_events, RADIX-634..RADIX-637)",
    "radix-priority": "its radix cache offers the priority policy: lowest insert priority evicted first (RADIX-628)",
    "slot-arrays": "offers chapter 06's allocator with the array surface (create_slot_arrays: ERR-510..ERR-514)",
    "block-arrays": "offers chapter 01's block pool with the array surface (create_block_arrays: ERR-517..ERR-520)",
    "block-tables": "grows a batch's block tables on its block array surface in one call (create_block_tables)",
    "request-manager": "offers chapter 07's request-level manager (its own, or kvref's over its prefix cache)",
    "manager-common-prefix": "counts the blocks every scheduled request shares (get_num_common_prefix_blocks, REQ-718)",
    "context-duties": "runs its engine's own request path over its allocator (create_context, REQ-740..REQ-745)",
    "manager-sliding-window": "serves sliding-window KV cache groups beside full attention (REQ-730..REQ-734)",
    "manager-pools": "gives each KV cache group a pool and budget of its own (REQ-735)",
    "manager-mamba": "serves mamba KV cache groups beside full attention (REQ-757..REQ-759)",
    "manager-share-last-block": "matches a prompt of whole blocks up to its last block, as Megatron-Core (REQ-705)",
    "error-order": "raises, for a call breaking several rules, the error of the first check broken (ERR-509)",
    "fault-containment": "refuses every call after one interrupted from inside (ERR-515)",
    "data-plane": "offers chapter 08's data plane (data_plane: KV buffers, request table, states, routing)",
    "data-device-checks": "its KV buffers check device slots on the device (checks='device', DATA-815..DATA-817)",
    "cuda-graph": "keeps the arrays of graph_arrays() at fixed addresses, read by captured CUDA graphs (CONF-908)",
    "replay": "replays a batch of requests against its own prefix cache in one call (replay_requests)",
    "policy-lru": "evicts by release order (lru)",
    "policy-lru-leaf": "evicts least recently released leaves only (lru-leaf)",
    "policy-lru-leaf-access": "evicts least recently accessed leaves only (lru-leaf-access)",
    "policy-ref-zero": "drops a hashed block when its last reference goes (ref-zero)",
    "policy-fifo": "evicts by registration order (fifo)",
    "tier-store": "offers chapter 11's tier store (create_tier: lookup, two-phase store and load, lru)",
    "tier-arc": "its tier store offers the arc policy (TIER-1118..TIER-1122)",
    "tier-events": "its tier store reports stored and removed events (TIER-1123)",
    "event-index": "rebuilds caches from their KV-event streams and answers prefix queries, as a router (PFX-328)",
}

#: What a backend with chapter 06's token-slot allocator (``create_slots``) declares beside its pools'.
SLOT_CAPABILITIES: frozenset[str] = frozenset(
    {
        "token-slots",
        "slot-versions",
        "slot-order",
        "slot-batches",
        "slot-extend",
        "radix-cache",
        "radix-receipts",
        "radix-capacity",
        "radix-events",
        "radix-priority",
    }
)

#: What a backend with chapter 11's tier store (``create_tier``) declares beside its pools'.
TIER_CAPABILITIES: frozenset[str] = frozenset({"tier-store", "tier-arc", "tier-events"})
#: The array surfaces (chapter 05, ERR-510) and the batched step over them (REQ-750), which only device backends offer.
ARRAY_CAPABILITIES: frozenset[str] = frozenset({"slot-arrays", "block-arrays", "block-tables"})
#: What a backend with chapter 08's data plane (``data_plane``) declares beside its pools'.
DATA_CAPABILITIES: frozenset[str] = frozenset({"data-plane", "data-device-checks"})
#: What an implementation of the whole protocol declares: every capability but ``replay``, which
#: is a fast path an implementation may add (TRACE-1019), ``cuda-graph``, which only a pool in
#: CUDA memory can have (CONF-908), ``id-arrays``, the array forms of the calls, which only
#: the array backends have, and ``event-index``, a router's index, which only the oracle offers
#: beside its pools. The oracle and the array backends share it.
STANDARD_CAPABILITIES: frozenset[str] = frozenset(CAPABILITIES) - {
    "replay",
    "id-arrays",
    "cuda-graph",
    "context-duties",
    "event-index",
    *SLOT_CAPABILITIES,
    *ARRAY_CAPABILITIES,
    *DATA_CAPABILITIES,
    *TIER_CAPABILITIES,
}
