"""The oracle's token radix cache over a token-slot allocator (chapter 06, RADIX-620..RADIX-633).

Keys are token sequences in a namespace (an adapter id, a cache salt: any hashable; different
namespaces never share a node, RADIX-620). Each node holds whole pages of tokens and the slots
they occupy; the tree owns those slots until it evicts them, and then returns each to the
allocator exactly once. Matches and inserts see a key only up to its last whole page.

What the caller owns: the slots it allocated and did not hand to the tree. ``insert`` returns
how much of the key was already cached; the slots the caller passed for that part are not taken
(RADIX-623), so the caller frees those that are not the tree's own (its duplicates).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from dataclasses import fields
from itertools import count
from typing import Any, SupportsIndex

from kvref.contract.errors import (
    CacheInUseError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    UnknownHashError,
)
from kvref.contract.events import KVEvent
from kvref.contract.validate import IntsLike, as_block_id_list, as_count, as_token_ids
from kvref.oracle.radix.events import PageEvents
from kvref.oracle.radix.invariants import check_tree
from kvref.oracle.radix.nodes import EvictableLeaves, Node, as_radix_policy, page_key
from kvref.oracle.radix.records import LockReceipt, MatchResult, RadixStats, TokenSlotAllocator
from kvref.oracle.radix.slot_checks import check_new_slots

__all__ = ["OracleRadixCache"]


#: What the tree asks of its allocator (chapter 06's allocator: the oracle's or a device backend's).
_ALLOCATOR_API = ("page_size", "num_pages", "is_allocated", "alloc", "free", "available_size")


#: Positions of RadixStats' fields in the tree's counters (RADIX-632).
_MATCHES, _QUERIED, _HIT, _EVICTED, _RESETS = range(len(fields(RadixStats)))


class OracleRadixCache:
    """Token radix tree, strict and plain (chapter 06): match, insert, lock/unlock, evict, reset.

    ``OracleRadixCache(allocator, *, policy="lru", max_tokens=None)``: pages are
    ``allocator.page_size`` tokens; ``policy`` is one of ``lru``, ``lfu``, ``fifo``, ``mru``,
    ``priority`` (RADIX-628); ``max_tokens``, when given, is a capacity every insert enforces by
    evicting (RADIX-633, a node-counting ``max_capacity`` counted in tokens); ``enable_events`` keeps a KV
    event per page stored or evicted for :meth:`take_events` (RADIX-634).
    """

    def __init__(
        self,
        allocator: TokenSlotAllocator,
        *,
        policy: str = "lru",
        max_tokens: SupportsIndex | None = None,
        enable_events: bool = False,
    ) -> None:
        # Any allocator of chapter 06's shape will do (the oracle's, or a device backend's).
        missing = [a for a in _ALLOCATOR_API if not hasattr(allocator, a)]
        if missing:
            raise InvalidValueError(
                "RADIX-620", f"OracleRadixCache: {allocator!r} is not a token-slot allocator (it lacks {missing})"
            )
        self.allocator = allocator
        self._page = allocator.page_size
        self._policy = as_radix_policy(policy)
        self._max_tokens = (
            None
            if max_tokens is None
            else as_count(max_tokens, op="OracleRadixCache", arg="max_tokens", rule="RADIX-633")
        )
        if self._max_tokens == 0:
            raise InvalidValueError("RADIX-633", "OracleRadixCache: max_tokens must be None or at least 1, got 0")
        self._ids = count(1)
        self._clock = 0
        self._roots: dict[Hashable, Node] = {}
        self._nodes: dict[int, Node] = {}
        self._owner: dict[int, Node] = {}  # slot -> the node holding it
        self._receipts: dict[int, Node | None] = {}
        self._leaves = EvictableLeaves(self._policy)
        self._protected = 0
        self._counts = [0] * len(fields(RadixStats))  # RadixStats' fields in order, read by ``stats``
        if not isinstance(enable_events, bool):
            raise InvalidTypeError(
                "RADIX-634", f"OracleRadixCache: enable_events must be a bool, got {enable_events!r}"
            )
        self._events = PageEvents(self._page, enabled=enable_events)

    # ------------------------------------------------------------------ sizes

    @property
    def page_size(self) -> int:
        """Tokens per page, the allocator's (RADIX-621)."""
        return self._page

    @property
    def policy(self) -> str:
        """The eviction policy (RADIX-628)."""
        return self._policy

    @property
    def max_tokens(self) -> int | None:
        """The capacity every insert enforces (RADIX-633), or None for none."""
        return self._max_tokens

    def total_size(self) -> int:
        """Tokens cached: evictable plus protected (RADIX-625)."""
        return len(self._owner)

    def protected_size(self) -> int:
        """Tokens of locked nodes, which eviction never frees (RADIX-625)."""
        return self._protected

    def evictable_size(self) -> int:
        """Tokens of unlocked nodes (RADIX-625)."""
        return len(self._owner) - self._protected

    @property
    def stats(self) -> RadixStats:
        """Cumulative statistics (RADIX-632)."""
        return RadixStats(*self._counts)

    # ---------------------------------------------------------------- helpers

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _root(self, namespace: Hashable, op: str, *, create: bool = True) -> Node | None:
        """The root of ``namespace``; made on first insert, never by a match."""
        try:
            root = self._roots.get(namespace)
        except TypeError:
            raise InvalidTypeError("ERR-503", f"{op}: namespace {namespace!r} is not hashable") from None
        if root is None and create:
            root = Node(next(self._ids), namespace, array("Q"), [], None)
            self._roots[namespace] = root
            self._nodes[root.ident] = root
        return root

    def _aligned(self, tokens: IntsLike, op: str) -> array[int]:
        """The key's tokens up to its last whole page (RADIX-621), checked (ERR-503, ERR-504)."""
        key = as_token_ids(tokens, op=op)
        whole = len(key) // self._page * self._page
        return key if whole == len(key) else key[:whole]

    def _common(self, child: Node, key: array[int], at: int) -> int:
        """Tokens ``child`` shares with ``key[at:]``, in whole pages (its first page is known to match).

        One comparison of the whole run first (the common case: the key goes through the node),
        else a bisection over whole pages: a shared prefix of ``low`` tokens, none of ``high``,
        compared a slice at a time, so no Python step per token or page.
        """
        ps, tokens = self._page, child.tokens
        n = min(len(tokens), len(key) - at)  # both whole pages
        if key[at : at + n] == (tokens if n == len(tokens) else tokens[:n]):
            return n
        low, high = ps, n
        while high - low > ps:
            middle = low + (high - low) // (2 * ps) * ps
            if key[at + low : at + middle] == tokens[low:middle]:
                low = middle
            else:
                high = middle
        return low

    def _walk(self, root: Node, key: array[int], touch: int) -> tuple[Node, int]:
        """The deepest node whose path is a prefix of ``key``, splitting a node the prefix ends inside.

        Returns the node and the matched length (a whole number of pages). ``touch`` stamps the
        access time of every node passed (RADIX-629).
        """
        ps, node, at = self._page, root, 0
        while at < len(key):
            child = node.children.get(page_key(key, at, ps))
            if child is None:
                break
            size = len(child.tokens)
            same = self._common(child, key, at)
            if same < size:
                child = self._split(child, same)
            child.access = touch
            self._leaves.offer(child)
            node, at = child, at + same
            if same < size:
                break
        return node, at

    def _split(self, child: Node, at: int) -> Node:
        """Cut ``child`` after ``at`` tokens: a new node takes the first part and keeps its keys (RADIX-627)."""
        parent: Node = child.parent  # type: ignore[assignment]  # a split node is never a root
        head = Node(
            next(self._ids),
            child.namespace,
            child.tokens[:at],
            child.slots[:at],
            parent,
            locks=child.locks,
            access=child.access,
            created=child.created,
            hits=child.hits,
            priority=child.priority,
        )
        self._nodes[head.ident] = head
        parent.children[page_key(head.tokens, 0, self._page)] = head
        child.tokens, child.slots, child.parent = child.tokens[at:], child.slots[at:], head
        head.children[page_key(child.tokens, 0, self._page)] = child
        for slot in head.slots:
            self._owner[slot] = head
        return head

    # ------------------------------------------------------------ operations

    def match(self, tokens: IntsLike, *, namespace: Hashable = None) -> MatchResult:
        """The longest cached prefix of ``tokens`` in ``namespace``, in whole pages (RADIX-622).

        Its slots are exactly those inserted for those tokens; its node is the one the prefix
        ends at (a node the prefix ends inside is split there, RADIX-627), for ``lock``. Every
        node passed counts as accessed (RADIX-629); nothing is pinned.
        """
        key = self._aligned(tokens, "match")
        root = self._root(namespace, "match", create=False)
        counts = self._counts
        counts[_MATCHES] += 1
        counts[_QUERIED] += len(key)
        if root is None:
            return MatchResult([], 0, 0)
        node, length = self._walk(root, key, self._tick())
        if node.is_root:
            return MatchResult([], 0, 0)
        counts[_HIT] += length
        node.hits += 1
        if self._policy == "lfu":  # the only key that counts hits; the walk offered the rest
            self._leaves.offer(node)
        self._leaves.compact(len(self._nodes))
        slots: list[int] = []
        for n in reversed(list(node.path())):
            slots.extend(n.slots)
        return MatchResult(slots, length, node.ident)

    def insert(
        self, tokens: IntsLike, slots: IntsLike, *, namespace: Hashable = None, priority: SupportsIndex = 0
    ) -> int:
        """Cache ``tokens`` -> ``slots``; returns how many leading tokens were cached already (RADIX-623).

        Only the part not yet cached is stored, with its slots, which the tree then owns; the
        values already there are kept. ``tokens`` and ``slots`` pair up and cover whole pages
        (RADIX-621); the new slots must be whole allocated pages the tree does not hold (RADIX-626).
        Under a capacity the insert then evicts down to it, by the policy (RADIX-633).
        """
        op = "insert"
        key = as_token_ids(tokens, op=op)
        vals = as_block_id_list(slots, op=op, arg="slots")
        if len(key) != len(vals):
            raise InvalidValueError("ERR-506", f"{op}: {len(key)} tokens for {len(vals)} slots; they must pair up")
        if len(key) % self._page:
            raise InvalidValueError(
                "RADIX-621", f"{op}: {len(key)} tokens is not a whole number of pages of {self._page}"
            )
        prio = as_count(priority, op=op, arg="priority")
        root: Node = self._root(namespace, op)  # type: ignore[assignment]  # made when missing
        _, have = self._peek(root, key)
        check_new_slots(vals[have:], allocator=self.allocator, owner=self._owner, op=op)
        now = self._tick()
        node, have = self._walk(root, key, now)
        for n in node.path():  # a path's priority is the highest any insert through it gave (RADIX-628)
            if n.priority < prio:
                n.priority = prio
                self._leaves.offer(n)
        if have < len(key):
            leaf = Node(
                next(self._ids),
                namespace,
                key[have:],
                vals[have:],
                node,
                access=now,
                created=now,
                priority=prio,
            )
            self._nodes[leaf.ident] = leaf
            node.children[page_key(leaf.tokens, 0, self._page)] = leaf
            for slot in leaf.slots:
                self._owner[slot] = leaf
            self._leaves.offer(node)  # no longer a leaf
            self._leaves.offer(leaf)
            self._events.stored(leaf)
        self._leaves.compact(len(self._nodes))
        over = 0 if self._max_tokens is None else len(self._owner) - self._max_tokens
        if over > 0:  # back down to the capacity (RADIX-633)
            self.evict(over)
        return have

    def _peek(self, root: Node, key: array[int]) -> tuple[Node, int]:
        """How much of ``key`` is cached, without splitting or touching anything."""
        ps, node, at = self._page, root, 0
        while at < len(key):
            child = node.children.get(page_key(key, at, ps))
            if child is None:
                break
            same = self._common(child, key, at)
            at += same
            if same < len(child.tokens):
                break
            node = child
        return node, at

    def lock(self, node: SupportsIndex) -> LockReceipt:
        """Lock ``node`` and its ancestors against eviction; returns the receipt ``unlock`` takes (RADIX-624)."""
        target = self._node(node, "lock")
        receipt = LockReceipt(next(self._ids), 0 if target is None else target.ident)
        self._receipts[receipt.ident] = target
        if target is None:
            return receipt
        for n in target.path():
            if n.locks == 0:
                self._protected += len(n.tokens)
            n.locks += 1
            self._leaves.offer(n)
        return receipt

    def unlock(self, receipt: LockReceipt) -> None:
        """Release the lock ``receipt`` stands for; a receipt not held (used, never given) is an error (RADIX-624)."""
        if not isinstance(receipt, LockReceipt) or receipt.ident not in self._receipts:
            raise NotHeldError("RADIX-624", f"unlock: {receipt!r} is not a lock held on this tree; nothing unlocked")
        target = self._receipts.pop(receipt.ident)
        if target is None:
            return
        for n in target.path():
            n.locks -= 1
            if n.locks == 0:
                self._protected -= len(n.tokens)
            self._leaves.offer(n)

    def _node(self, value: object, op: str) -> Node | None:
        """The node ``value`` names; None for 0, the empty prefix (a lock on it locks nothing)."""
        ident = as_count(value, op=op, arg="node")
        if ident == 0:
            return None
        node = self._nodes.get(ident)
        if node is None or not node.alive:
            raise UnknownHashError("RADIX-624", f"{op}: node {ident} is not in the tree (evicted, or never made)")
        return node

    def evict(self, num_tokens: SupportsIndex) -> int:
        """Free unlocked leaves in policy order until ``num_tokens`` are freed or none is left (RADIX-628).

        Frees whole nodes, so it may free up to one node's tokens less one more than asked;
        returns the tokens freed, ``>= min(num_tokens, evictable_size())``. A parent left childless
        and unlocked becomes a leaf in its turn. Every slot goes back to the allocator once.
        """
        want = as_count(num_tokens, op="evict", arg="num_tokens")
        freed = 0
        while freed < want:
            leaf = self._leaves.pop()
            if leaf is None:
                break
            try:
                freed += self._remove(leaf)
            except KVRefError:
                self._leaves.offer(leaf)  # still cached: the allocator refused its slots
                raise
        self._counts[_EVICTED] += freed
        return freed

    def _remove(self, leaf: Node) -> int:
        """Free ``leaf``'s slots, then forget it; a free the allocator refuses leaves the tree as it was."""
        self.allocator.free(leaf.slots)  # first: slots freed behind the tree's back make it raise here
        self._events.removed(leaf)
        parent: Node = leaf.parent  # type: ignore[assignment]  # never a root
        del parent.children[page_key(leaf.tokens, 0, self._page)]
        leaf.alive = False
        del self._nodes[leaf.ident]
        for slot in leaf.slots:
            del self._owner[slot]
        self._leaves.offer(parent)
        return len(leaf.slots)

    def reset(self) -> None:
        """Free every cached slot and forget every node; refused while any lock is held (RADIX-630)."""
        if self._receipts:
            raise CacheInUseError("RADIX-630", f"reset: {len(self._receipts)} lock(s) held; unlock them first")
        slots = sorted(self._owner)
        if slots:
            self.allocator.free(slots)
        for node in self._nodes.values():
            node.alive = False
        self._roots.clear()
        self._nodes.clear()
        self._owner.clear()
        self._leaves.clear()
        self._events.cleared()
        self._counts[_RESETS] += 1

    # ------------------------------------------------------------ read-only views

    def node_tokens(self, node: SupportsIndex) -> tuple[int, ...]:
        """The whole key from the root to ``node``."""
        target = self._node(node, "node_tokens")
        out: list[int] = []
        for n in reversed(list(target.path()) if target is not None else []):
            out.extend(n.tokens)
        return tuple(out)

    def cached_slots(self) -> frozenset[int]:
        """Every slot the tree holds."""
        return frozenset(self._owner)

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the tree: every node's key, slots, locks and keys (ERR-501)."""
        nodes = {
            n.ident: (n.namespace, tuple(n.tokens), tuple(n.slots), n.parent.ident if n.parent else None, n.locks)
            for n in self._nodes.values()
        }
        return {
            "nodes": nodes,
            "receipts": sorted(self._receipts),
            "protected": self._protected,
            "stats": RadixStats(*self._counts),
        }

    def check_invariants(self) -> None:
        """Every invariant of chapter 06's tree; raises InvariantViolation naming the rule."""
        check_tree(
            self, list(self._nodes.values()), self._owner, [n for n in self._receipts.values() if n], self._protected
        )

    def take_events(self) -> list[KVEvent]:
        """The KV events since the last call, one per page, oldest first; none unless enabled (RADIX-634)."""
        return self._events.take()

    def __repr__(self) -> str:
        return (
            f"OracleRadixCache(page_size={self._page}, policy={self._policy!r}, nodes={len(self._nodes)}, "
            f"evictable={self.evictable_size()}, protected={self._protected})"
        )
