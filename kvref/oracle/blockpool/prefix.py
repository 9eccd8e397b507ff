"""The oracle's hash prefix index: registration, lookups and KV events (chapter 03).

``copies`` maps each resident hash to its blocks, oldest first; ``parent`` each resident hash to
its parent hash (None: the root); ``children`` each hash to the number of resident hashes whose
parent it is. Under lru-leaf and lru-leaf-access, ``kept`` counts the hashes eviction must keep a
copy of (:class:`KeptHashes`). ``register`` checks the whole call before it changes anything: a plain pass finds
whether anything is wrong, and the caller's explainer names the first thing (ERR-509).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvref.contract.checks import HashEntry
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvref.contract.policies import EvictionPolicy
from kvref.oracle.blockpool.blocks import BlockLists
from kvref.oracle.blockpool.orders import CacheOrders

__all__ = ["KeptHashes", "PrefixIndex"]

_FIFO = EvictionPolicy.FIFO


class KeptHashes:
    """The resident hashes a prefix-closed policy must keep one copy of: those with no copy in use
    but a descendant with one (POOL-106), counted step by step.

    A hash is *busy* when it has a copy in use or a busy child; it is *kept* when it is busy only
    through a child. ``gain(h)`` is called when a copy of ``h`` comes into use, ``lose(h)`` when one
    goes out of use; each walks up the tree only while a hash changes between busy and not, so a
    chain pinned from its root or released from its tail costs O(1) a block. ``count`` is how many
    hashes are kept; ``check_invariants`` recounts it from the in-use blocks.
    """

    def __init__(self, parent: dict[int, int | None]) -> None:
        self.parent = parent
        self.in_use: dict[int, int] = {}  # hash -> its copies in use
        self.busy_children: dict[int, int] = {}  # hash -> its busy children, when any
        self.count = 0

    def gain(self, h: int) -> None:
        """A copy of resident hash ``h`` came into use."""
        copies = self.in_use.get(h, 0)
        self.in_use[h] = copies + 1
        if copies:
            return
        if h in self.busy_children:
            self.count -= 1  # it was kept; now it is busy through its own copy
        else:
            self._child_busy(self.parent[h])

    def lose(self, h: int) -> None:
        """A copy of resident hash ``h`` went out of use."""
        copies = self.in_use[h] - 1
        if copies:
            self.in_use[h] = copies
            return
        del self.in_use[h]
        if h in self.busy_children:
            self.count += 1  # still busy through a child: kept now
        else:
            self._child_idle(self.parent[h])

    def _child_busy(self, p: int | None) -> None:
        busy_children, in_use, parent = self.busy_children, self.in_use, self.parent
        while p is not None:
            busy = busy_children.get(p, 0)
            busy_children[p] = busy + 1
            if busy or p in in_use:
                return  # p was busy already
            self.count += 1
            p = parent[p]

    def _child_idle(self, p: int | None) -> None:
        busy_children, in_use, parent = self.busy_children, self.in_use, self.parent
        while p is not None:
            busy = busy_children[p] - 1
            if busy:
                busy_children[p] = busy
                return
            del busy_children[p]
            if p in in_use:
                return  # p stays busy through its own copy
            self.count -= 1
            p = parent[p]

    def clear(self) -> None:
        """Nothing in use: nothing kept."""
        self.in_use.clear()
        self.busy_children.clear()
        self.count = 0


class PrefixIndex:
    """Resident hashes with their copies, parents and children; the KV events they make (PFX-301..PFX-321)."""

    def __init__(self, blocks: BlockLists, orders: CacheOrders, *, enable_events: bool) -> None:
        self.blocks = blocks
        self.orders = orders
        self.copies: dict[int, list[int]] = {}
        self.parent: dict[int, int | None] = {}
        self.children: dict[int, int] = {}
        self.events_on = enable_events
        self.events: list[KVEvent] = []
        self.kept = KeptHashes(self.parent) if orders.policy.prefix_closed else None

    def hash_entry(self, block_hash: int) -> HashEntry | None:
        """What the index knows of ``block_hash``: resident, its parent, whether it has resident
        children; None when neither (the explainers' view, :mod:`kvref.contract.checks`)."""
        resident = block_hash in self.parent
        has_children = block_hash in self.children
        if not resident and not has_children:
            return None
        return HashEntry(resident, self.parent.get(block_hash), has_children)

    def register(self, ids: list[int], hs: list[int], parent: int | None, explain: Callable[[], None]) -> None:
        """Register ``ids[i]`` under ``hs[i]``, chained after ``parent`` (PFX-301, PFX-317).

        Blocks must be in use (PFX-302) and unhashed (PFX-303); a resident hash keeps its parent
        (PFX-306). Where the plain pass finds anything that may be wrong, ``explain()`` names it
        and raises; a cycle risk that closes no cycle lets it return, and the call goes on.
        """
        blocks = self.blocks
        n, reserved, ref, hashes = blocks.n, blocks.is_reserved, blocks.ref, blocks.hash
        parents, children = self.parent, self.children
        prev = parent
        pending: dict[int, int | None] = {}  # hashes this call makes resident -> their parent
        for b, h in zip(ids, hs, strict=True):
            known = parents if h in parents else pending
            if (
                b < 0
                or b >= n
                or reserved[b]
                or ref[b] == 0
                or hashes[b] is not None
                or h == prev
                or (known[h] != prev if h in known else h in children)  # a cycle risk is looked at closely
            ):
                explain()
                break  # a cycle risk that closes no cycle: the whole call was checked, and it is fine
            pending.setdefault(h, prev)
            prev = h
        hashed_in_use, registered, fifo = self.orders.hashed_in_use, self.orders.registered, self.orders.policy is _FIFO
        kept = self.kept
        prev = parent
        for b, h in zip(ids, hs, strict=True):
            hashes[b] = h
            hashed_in_use.add(b)
            copies = self.copies.get(h)
            if copies is None:
                self.copies[h] = [b]
                parents[h] = prev
                if prev is not None:
                    children[prev] = children.get(prev, 0) + 1
                if self.events_on:
                    self.events.append(BlockStored(h, prev))
            else:
                copies.append(b)
                if len(copies) == 2:
                    self.orders.may_be_leaves(copies[:1])  # no longer its hash's last copy
            if fifo:
                registered[b] = None
            if kept is not None:
                kept.gain(h)  # registered blocks are in use (PFX-302)
            prev = h

    def unregister(self, blocks: Iterable[int], *, keep_tree: bool = True) -> None:
        """Remove the hash registration of each of ``blocks`` in order; a hash leaves with its last copy.

        The blocks leave the evictable and registration orders too; their caller puts them on
        the free stack or hands them out. Callers pass hashed blocks only. ``keep_tree=False``
        leaves ``parent`` and ``children`` to a caller that rebuilds them afterwards (the
        one-call replay); eviction under lru-leaf reads them, so it always keeps them.
        """
        hashes, copies, parents, children = self.blocks.hash, self.copies, self.parent, self.children
        evictable, registered = self.orders.evictable, self.orders.registered
        events = self.events if self.events_on else None
        for b in blocks:
            h: int = hashes[b]  # type: ignore[assignment]
            hashes[b] = None
            found = copies[h]
            if len(found) > 1:
                found.remove(b)
            else:
                del copies[h]
                parent = parents.pop(h) if keep_tree else None
                if parent is not None:
                    left = children[parent] - 1
                    if left:
                        children[parent] = left
                    else:
                        del children[parent]
                        self.orders.may_be_leaves(copies.get(parent, ()))  # its last resident child left
                if events is not None:
                    events.append(BlockRemoved(h))
            evictable.pop(b, None)
            if registered:
                registered.pop(b, None)

    def lookup(self, hs: list[int], parent: int | None, prefer: Sequence[int] | None = None) -> list[int]:
        """Blocks of the longest prefix of ``hs`` resident with its chain's parents (PFX-307, PFX-321):
        the oldest copy of each hash, or the copy ``prefer[i]`` names (PFX-308)."""
        out: list[int] = []
        copies, parents = self.copies, self.parent
        for i, h in enumerate(hs):
            found = copies.get(h)
            if found is None or parents[h] != parent:
                break
            if prefer is not None and i < len(prefer) and prefer[i] in found:
                out.append(prefer[i])
            else:
                out.append(found[0])
            parent = h
        return out

    def clear(self) -> None:
        """Forget every hash (the blocks' own hashes are the caller's); all-cleared with events on."""
        self.copies.clear()
        self.parent.clear()
        self.children.clear()
        if self.kept is not None:
            self.kept.clear()
        if self.events_on:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first, and forget them (PFX-315)."""
        events, self.events = self.events, []
        return events
