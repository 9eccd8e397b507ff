"""The machine's pool steps: allocate, free, share, bad releases, pause, the batched forms (chapter 01).

Each step runs on the implementation and on the oracle; they must agree on success or on the
error, and what succeeds is checked against the references the machine handed out.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.stateful import rule

from kvref.contract.protocol import BlockState
from kvref_conformance.machines.core import MachineCore, holders_st

__all__ = ["PoolSteps"]


class PoolSteps(MachineCore):
    """Steps over the pool alone: references handed out, shared, released, refused, batched."""

    @rule(holder=holders_st, count=st.integers(0, 7))
    def allocate(self, holder: object, count: int) -> None:
        self.tick()
        self.allocate_for(holder, count)

    def allocate_for(self, holder: object, count: int) -> None:
        """``allocate(count, holder=holder)`` on both sides; fresh blocks for ``holder`` (POOL-104, POOL-105)."""
        kind, got, want = self.both(
            f"allocate({count}, holder={holder!r})",
            lambda: self.call_allocate(count, holder),
            lambda: self.oracle.allocate(count, holder=holder),
        )
        if kind == "ok":
            self.fresh(got, want, holder, f"allocate({count})")

    @rule(holder=holders_st, data=st.data())
    def free_some(self, holder: object, data: st.DataObject) -> None:
        self.tick()
        refs = self.refs[holder]
        if not refs:
            return
        picked = data.draw(st.lists(st.sampled_from(range(len(refs))), unique=True, max_size=len(refs)))
        ids = [refs[i] for i in picked]
        kind, _, _ = self.both(
            f"free({ids}, holder={holder!r})",
            lambda: self.impl.free(ids, holder=holder),
            lambda: self.oracle.free(self.rename(ids), holder=holder),
        )
        assert kind == "ok", "the oracle refused a valid free"
        for i in sorted(picked, reverse=True):
            del refs[i]

    @rule(holder=holders_st, data=st.data())
    def share_twice_then_free_both_in_one_call(self, holder: object, data: st.DataObject) -> None:
        """A holder takes a second reference to one of its blocks and frees both in one call:
        a release written as a scatter (``ref[ids] -= 1``) drops only one (POOL-107)."""
        self.tick()
        refs = self.refs[holder]
        if not refs or holder in self.paused:
            return
        a = data.draw(st.sampled_from(refs))
        self.both(
            f"acquire([{a}], holder={holder!r})",
            lambda: self.impl.acquire([a], holder=holder),
            lambda: self.oracle.acquire([self.i2o[a]], holder=holder),
        )
        refs.append(a)
        ids = [b for b in refs if b == a]
        kind, _, _ = self.both(
            f"free({ids}, holder={holder!r})",
            lambda: self.impl.free(ids, holder=holder),
            lambda: self.oracle.free(self.rename(ids), holder=holder),
        )
        assert kind == "ok"
        self.refs[holder] = [b for b in refs if b != a]

    @rule(holder=holders_st, data=st.data())
    def bad_release(self, holder: object, data: st.DataObject) -> None:
        """Free what the holder does not hold: another's block, a free block, twice, or reserved."""
        self.tick()
        others = [a for h, refs in self.refs.items() if h != holder for a in refs if a not in self.refs[holder]]
        mine = self.refs[holder]
        choices: list[tuple[str, list[int]]] = [("reserved", list(self.impl.reserved_ids[:1]))]
        free_now = [b for b in range(self.impl.num_blocks) if self.impl.block_state(b) is BlockState.FREE]
        if free_now:
            choices.append(("a free block", [data.draw(st.sampled_from(free_now))]))
        if others:
            choices.append(("another holder's block", [data.draw(st.sampled_from(others))]))
        if mine:
            a = data.draw(st.sampled_from(mine))
            choices.append(("one reference too many", [a] * (mine.count(a) + 1)))
        label, ids = data.draw(st.sampled_from(choices))
        if not ids:
            return
        before = self.impl_view()
        if label == "a free block":  # free blocks carry no pairing: any free block of the oracle will do
            free_o = [b for b in range(self.oracle.num_blocks) if self.oracle.block_state(b) is BlockState.FREE]
            mapped = free_o[:1]
        else:
            mapped = [self.i2o.get(a, a) for a in ids]
        kind, _, _ = self.both(
            f"free({ids}, holder={holder!r}) [{label}]",
            lambda: self.impl.free(ids, holder=holder),
            lambda: self.oracle.free(mapped, holder=holder),
        )
        # agree() has already failed the step if only the oracle refused; both accepting would mean
        # the machine chose a valid release, a bug of the machine itself
        assert kind == "error", f"machine: the oracle accepted a release chosen to be invalid ({label})"
        assert self.impl_view() == before, f"[ERR-501] a refused free ({label}) changed the state"

    @rule(holder=holders_st, donor=holders_st, data=st.data())
    def share(self, holder: object, donor: object, data: st.DataObject) -> None:
        self.tick()
        refs = self.refs[donor]
        if not refs:
            return
        a = data.draw(st.sampled_from(refs))
        kind, _, _ = self.both(
            f"acquire([{a}], holder={holder!r})",
            lambda: self.impl.acquire([a], holder=holder),
            lambda: self.oracle.acquire([self.i2o[a]], holder=holder),
        )
        if kind == "ok":
            self.refs[holder].append(a)

    @rule(holder=holders_st)
    def release_all_tail_first(self, holder: object) -> None:
        self.tick()
        refs = self.refs[holder]
        kind, _, _ = self.both(
            f"free(all of {holder!r}, tail first)",
            lambda: self.impl.free(refs[::-1], holder=holder),
            lambda: self.oracle.free(self.rename(refs[::-1]), holder=holder),
        )
        assert kind == "ok"
        refs.clear()

    @rule(holder=holders_st)
    def toggle_pause(self, holder: object) -> None:
        self.tick()
        if holder in self.paused:
            self.both(f"resume({holder!r})", lambda: self.impl.resume(holder), lambda: self.oracle.resume(holder))
            self.paused.discard(holder)
        else:
            self.both(f"pause({holder!r})", lambda: self.impl.pause(holder), lambda: self.oracle.pause(holder))
            self.paused.add(holder)

    @rule(data=st.data())
    def scribble_on_a_returned_list(self, data: st.DataObject) -> None:
        """Write over ids the implementation returned, as a caller may: the pool must not see it (POOL-123)."""
        self.tick()
        if not self.handed:
            return
        returned, _, what = self.handed.pop(data.draw(st.integers(0, len(self.handed) - 1)))
        if len(returned) and hasattr(returned, "__setitem__"):  # a list or an array; a tuple is left alone
            returned[:] = [-1] * len(returned) if isinstance(returned, list) else -1  # a list or an array
            note_what = f"the caller wrote -1 over the ids {what} returned"
            self.both(note_what, lambda: self.impl.num_free, lambda: self.oracle.num_free)

    @rule(counts=st.lists(st.integers(0, 4), max_size=4), data=st.data())
    def allocate_batch(self, counts: list[int], data: st.DataObject) -> None:
        self.tick()
        self.admit(counts, [data.draw(holders_st) for _ in counts])

    def admit(self, counts: list[int], holders: Sequence[object]) -> None:
        """``allocate_many(counts, holders)`` on both sides: the same entries admitted (POOL-116), fresh blocks."""
        kind, got, want = self.both(
            f"allocate_many({counts}, holders={holders})",
            lambda: self.call_allocate_many(counts, holders),
            lambda: self.oracle.allocate_many(counts, holders=holders),
        )
        if kind != "ok":
            return
        assert [len(g) for g in got] == [len(w) for w in want], (
            f"[POOL-116] allocate_many admitted sizes {[len(g) for g in got]}, the spec admits {[len(w) for w in want]}"
        )
        flat = [a for g in got for a in g]
        assert len(set(flat)) == len(flat), f"[POOL-104] allocate_many handed out a block twice: {got}"
        for g, w, h in zip(got, want, holders, strict=False):
            self.fresh(g, w, h, "allocate_many")

    @rule(data=st.data())
    def free_batch(self, data: st.DataObject) -> None:
        """Free several holders' blocks in one call, a block shared by two of them included."""
        self.tick()
        entries = []
        for holder in data.draw(st.lists(holders_st, unique=True, max_size=3)):
            refs = self.refs[holder]
            if refs:
                picked = data.draw(st.lists(st.sampled_from(range(len(refs))), unique=True, max_size=len(refs)))
                entries.append((holder, picked))
        self.release_together(entries)

    def release_together(self, entries: Sequence[tuple[object, list[int]]]) -> None:
        """``free_many`` of each holder's references at the positions picked, on both sides (POOL-117)."""
        lists = [[self.refs[h][i] for i in picked] for h, picked in entries]
        holders = [h for h, _ in entries]
        kind, _, _ = self.both(
            f"free_many({lists}, holders={holders})",
            lambda: self.call_free_many(lists, holders),
            lambda: self.oracle.free_many([self.rename(x) for x in lists], holders=holders),
        )
        assert kind == "ok"
        for h, picked in entries:
            for i in sorted(picked, reverse=True):
                del self.refs[h][i]
