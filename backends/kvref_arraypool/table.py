"""An open-addressing hash table over non-negative int64 keys, with batched probes (STATE-006).

Keys and values live in two device arrays of a power-of-two capacity; a slot holds a key, or
``EMPTY`` (never used) or ``TOMB`` (deleted). Every operation takes a whole batch of keys and
probes all of them at once, one vectorized round per probe step (linear probing after a 64-bit
mix), so a batch costs a handful of array operations however large it is. Deleting leaves a
tombstone; an insert that would take live keys plus tombstones past 60% of the capacity first
rebuilds the table in place (or grows it, doubling until the keys fill at most 30%, for a table
with ``growable=True``), so probe sequences stay short.

A table built with ``growable=False`` never reallocates its arrays: their addresses are fixed for
the pool's lifetime, which is what lets a captured CUDA graph read them (spec chapter 09,
CONF-908).
"""

from __future__ import annotations

import numpy as np

from kvref_arraypool.host_arrays import count_true, positions
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["EMPTY", "TOMB", "HashTable"]

EMPTY = -1
TOMB = -2
_MIX = 0xFF51AFD7ED558CCD - (1 << 64)  # murmur3's fmix64 constant as a signed int64
_MAX_LOAD = 0.6
_WIDTH = 8  # slots probed per round after the first (8 measured best on NumPy)


def _pow2_at_least(n: int) -> int:
    """The smallest power of two that is at least ``n`` and at least 16."""
    return max(16, 1 << (n - 1).bit_length()) if n > 1 else 16


class HashTable:
    """int64 key -> int64 value, for keys in ``[0, 2**63)``; all operations batched.

    Callers guarantee what each method states about its keys (present, absent, distinct); the
    table does not re-check, since the pool has already validated them.
    """

    def __init__(self, ops: ArrayOps, capacity_hint: int, *, growable: bool) -> None:
        self.ops = ops
        self.growable = growable
        self.capacity = _pow2_at_least(int(capacity_hint / _MAX_LOAD) + 1)
        self.keys = ops.full(self.capacity, EMPTY)
        self.values = ops.zeros(self.capacity)
        self._offsets = ops.arange(_WIDTH)
        self._claim = ops.full(self.capacity + 1, -1)
        self.live = 0
        self.tombs = 0

    def _home(self, keys: Array) -> Array:
        """Each key's home slot: murmur3's fmix64 steps in int64 (in place on one fresh array)."""
        x = keys >> 33
        x ^= keys
        x *= _MIX
        x ^= x >> 33
        x &= self.capacity - 1
        return x

    def _window(self, slot: Array) -> Array:
        """The ``_WIDTH`` slots from each of ``slot`` on, one row per key."""
        return (slot[:, None] + self._offsets[None, :]) & (self.capacity - 1)

    def find_slots(self, keys: Array) -> Array:
        """The slot of each key, or -1 where the key is absent.

        The first probe is one slot per key (most keys sit at home); keys still unresolved then
        probe ``_WIDTH`` slots per round, so a long cluster costs a few rounds, not one per slot.
        """
        ops = self.ops
        n = len(keys)
        out = ops.full(n, -1)
        if n == 0:
            return out
        tkeys = self.keys
        slot = self._home(keys)
        seen = tkeys[slot]
        hit = seen == keys
        out = ops.where(hit, slot, out)  # no mask index: no wait
        go_on = ops.nonzero(~hit & (seen != EMPTY))
        pending = go_on
        slot = slot[go_on] + 1
        while len(pending):
            window = self._window(slot)
            seen2 = tkeys[window]
            want = keys[pending]
            found, first = ops.first_true((seen2 == want[:, None]) | (seen2 == EMPTY))
            at = window[ops.arange(len(pending)), first]  # where each search stopped (anywhere if it did not)
            is_key = found & (tkeys[at] == want)
            # Which searches stopped, and which of those at their key: the round's one host read.
            flags = ops.to_host(ops.concat([found, is_key]))
            stopped, hit_at = flags[: len(pending)], positions(flags[len(pending) :])
            if len(hit_at):
                hits = ops.asarray(hit_at)
                out[pending[hits]] = at[hits]
            rest = positions(~stopped)
            if len(rest) == 0:
                break
            going = ops.asarray(rest)
            pending = pending[going]
            slot = slot[going] + _WIDTH
        return out

    def find_near(self, keys: Array, default: int = -1) -> tuple[Array, Array]:
        """:meth:`find`'s values for keys that sit within ``_WIDTH`` slots of home, with no host read.

        Also, per key, whether its probe left that window without an answer (neither the key
        nor an empty slot in it): only for those may the value be wrong, and :meth:`find` must
        answer. The caller reads these flags with its own (one host read for a whole lookup).
        """
        ops = self.ops
        window = self._window(self._home(keys))
        seen = self.keys[window]
        stopped, first = ops.first_true((seen == keys[:, None]) | (seen == EMPTY))
        at = window[ops.arange(len(keys)), first]
        values = ops.where(stopped & (self.keys[at] == keys), self.values[at], default)
        return values, ~stopped

    def find(self, keys: Array, default: int = -1) -> Array:
        """The value of each key, or ``default`` where absent."""
        slots = self.find_slots(keys)
        found = slots >= 0
        return self.ops.where(found, self.values[self.ops.where(found, slots, 0)], default)

    def insert(self, keys: Array, values: Array) -> None:
        """Add distinct keys that are absent, with their values.

        The first round tries each key's home slot alone (at most 60% of the slots are taken, so
        most keys stop there); later rounds look for the first open slot (empty or deleted) in a
        window of ``_WIDTH``. Each round every pending key tries to claim its slot; of several
        claimants the highest pending index wins (a scatter-max, so the layout is the same on every
        device and run), the others go on from the next slot.
        """
        n = len(keys)
        if n == 0:
            return
        if self.live + self.tombs + n > _MAX_LOAD * self.capacity:
            self._rebuild(self.live + n)
        ops = self.ops
        mask = self.capacity - 1
        slot = self._home(keys)
        pending = ops.arange(n)
        tkeys = self.keys
        found = tkeys[slot] < 0
        at = ops.where(found, slot, self.capacity)  # a key with no open slot claims the spare slot past the table
        step: Array | int = 1
        while True:
            rest = self._claim_round(keys, values, pending, found, at)
            if len(rest) == 0:
                break
            left = ops.asarray(rest)
            pending = pending[left]
            slot = (slot[left] + (step if isinstance(step, int) else step[left])) & mask
            window = self._window(slot)
            found, first = ops.first_true(tkeys[window] < 0)
            at = ops.where(found, window[ops.arange(len(pending)), first], self.capacity)
            step = ops.where(found, first + 1, _WIDTH)
        self.live += n

    def _claim_round(self, keys: Array, values: Array, pending: Array, found: Array, at: Array) -> np.ndarray:
        """One round of :meth:`insert`: each pending key whose round ``found`` an open slot claims
        it (``at``; the spare slot past the table otherwise). Writes the winners; returns the
        positions in ``pending`` of the keys still without a slot (host)."""
        ops, tkeys = self.ops, self.keys
        claim = self._claim_scratch()
        ops.fill_at(claim, at, -1)  # the highest pending index wins a contested slot: the same winner on every
        ops.scatter_max(claim, at, pending)  # device and run (a plain scatter leaves it to the device)
        got = found & (claim[at] == pending)
        tomb = got & (tkeys[ops.where(found, at, 0)] == TOMB)
        # Which keys won a slot, and which of those slots held a tombstone: the round's one host read.
        flags = ops.to_host(ops.concat([got, tomb]))
        m = len(pending)
        won_at = positions(flags[:m])
        self.tombs -= count_true(flags[m:])
        if len(won_at):
            won = ops.asarray(won_at)
            ws, wk = at[won], pending[won]
            tkeys[ws] = keys[wk]
            self.values[ws] = values[wk]
        return positions(~flags[:m])

    def _claim_scratch(self) -> Array:
        """The claims of one insert round: a slot per table slot and one spare past them. Made with
        the table (and remade when it grows), so the table's memory is all there from the start."""
        if len(self._claim) != self.capacity + 1:
            self._claim = self.ops.full(self.capacity + 1, -1)
        return self._claim

    def set_at(self, slots: Array, values: Array) -> None:
        """Overwrite the values at ``slots`` (from :meth:`find_slots`)."""
        self.values[slots] = values

    def delete_at(self, slots: Array) -> None:
        """Delete the keys at distinct ``slots`` (from :meth:`find_slots`)."""
        n = len(slots)
        if n == 0:
            return
        self.ops.fill_at(self.keys, slots, TOMB)  # live + tombs stays as it was: only an insert can need a rebuild
        self.live -= n
        self.tombs += n

    def delete(self, keys: Array) -> None:
        """Delete distinct keys that are present."""
        self.delete_at(self.find_slots(keys))

    def items(self) -> tuple[Array, Array]:
        """All live keys and their values (slot order)."""
        live = self.keys >= 0
        return self.keys[live], self.values[live]

    def clear(self) -> None:
        """Remove every key, keeping the arrays."""
        self.keys[:] = EMPTY
        self.live = 0
        self.tombs = 0

    def _rebuild(self, need: int) -> None:
        keys, values = self.items()
        keys, values = self.ops.copy(keys), self.ops.copy(values)
        capacity = self.capacity
        if self.growable:  # doubled until the keys fill at most 30%: 10 * need <= 3 * capacity
            capacity = max(capacity, _pow2_at_least(-(-10 * need // 3)))
        elif need > _MAX_LOAD * capacity:  # pragma: no cover - sized by the pool so it cannot happen
            raise RuntimeError(f"hash table of capacity {capacity} cannot hold {need} keys")
        if capacity != self.capacity:
            self.capacity = capacity
            self.keys = self.ops.full(capacity, EMPTY)
            self.values = self.ops.zeros(capacity)
            self._claim_scratch()
        else:
            self.keys[:] = EMPTY
        self.live = 0
        self.tombs = 0
        if len(keys):
            self.insert(keys, values)
