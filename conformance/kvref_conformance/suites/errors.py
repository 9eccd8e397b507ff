"""Chapter 05, errors and atomicity: the bad-input matrix over every public operation.

Each case of :mod:`kvref_conformance.suites.bad_inputs` runs one bad call on a pool that holds
blocks, caches a chain and has events and statistics to lose, and checks the specific error, the
rule it cites and that the observable state is exactly as before (ERR-501, ERR-502).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import ConfigError, KVRefError, PoolUnusableError, StaleBlockError
from kvref_conformance.observe import observe
from kvref_conformance.suites.bad_inputs import CASES, World, int_kinds, make_world, needs
from kvref_conformance.suites.base import ConformanceSuite, fails_unchanged, requires, rule, skip_without
from kvref_conformance.target import Target

__all__ = ["ErrorSuite", "HashesOnce"]


def _outcome(call: Callable[[], Any]) -> str:
    """What a call did: the class and rule of the kvref error it raised, or that it answered."""
    try:
        call()
    except KVRefError as exc:
        return f"{type(exc).__name__} {exc.rule}"
    return "answered"


class HashesOnce:
    """A holder whose ``__hash__`` works once, when the call checks it, and raises ever after."""

    def __init__(self) -> None:
        self.hashed = 0

    def __hash__(self) -> int:
        self.hashed += 1
        if self.hashed > 1:
            raise RuntimeError("this holder's hash fails after the first")
        return 11

    def __eq__(self, other: object) -> bool:
        return other is self


#: Cases whose fault lies in one argument, by the start of their name: the argument the message names.
ARGUMENTS_AT_FAULT = {
    "allocate_many: negative": "counts[1]",
    "allocate_many: float": "counts[1]",
    "allocate_many: counts a str": "counts",
    "allocate_many: holders a str": "holders",
    "free_many: not a list": "block_lists",
    "free_many: entry wrong type": "block_lists[1]",
    "match_many: bad hash": "hash_lists[1]",
    "free: generation of wrong type": "generations",
    "free: generations too short": "generations",
    "free: element": "block_ids[1]",
    "free: ids": "block_ids",
    "acquire: element": "block_ids[0]",
    "acquire: ids": "block_ids",
    "register: float hash": "block_hashes[0]",
    "register: second block bad": "block_hashes[1]",
    "register: parent of wrong type": "parent_hash",
    "lookup: bad parent": "parent_hash",
    "match: unhashable holder": "holder",
    "allocate: unhashable holder": "holder",
}


def argument_at_fault(case: str) -> str | None:
    """The argument a bad-input case's message must name (ERR-521), where one argument is at fault."""
    return next((arg for start, arg in ARGUMENTS_AT_FAULT.items() if case.startswith(start)), None)


class ErrorSuite(ConformanceSuite):
    """Rules of chapter 05 (errors and atomicity), for any implementation."""

    @rule("ERR-501", "ERR-502", "ERR-503", "ERR-504", "ERR-506", "ERR-521")
    @pytest.mark.parametrize(("name", "call", "error", "rule_id"), CASES, ids=[c[0] for c in CASES])
    def test_bad_input_raises_its_specific_error_and_changes_nothing(
        self, impl: Target, name: str, call: Callable[[World], Any], error: type[KVRefError], rule_id: str
    ) -> None:
        for capability in needs(name):
            skip_without(impl, capability)
        world = make_world(impl)
        exc = fails_unchanged(world.pool, lambda: call(world), error, rule_id)
        operation, argument = name.split(":")[0], argument_at_fault(name)
        assert operation in str(exc), f"[ERR-521] the message {str(exc)!r} of {name!r} does not name {operation!r}"
        assert argument is None or argument in str(exc), (
            f"[ERR-521] the message {str(exc)!r} of {name!r} does not name the argument at fault, {argument!r}"
        )

    @rule("POOL-112")
    @pytest.mark.parametrize("op", ["free", "acquire"])
    def test_block_0_when_usable_has_its_generation_checked_like_any_other(self, impl: Target, op: str) -> None:
        try:
            pool = self.pool(impl, 6, reserved_ids=(5, 2))
        except ConfigError as refused:  # an engine whose block 0 is its null block: nothing to check
            pytest.skip(f"the target keeps block 0 reserved: {refused}")
        pool.allocate(4, holder="h")
        stale = [pool.generation(0) + 1]
        fails_unchanged(
            pool, lambda: getattr(pool, op)([0], holder="h", generations=stale), StaleBlockError, "POOL-112"
        )

    @rule("ERR-515")
    @requires("fault-containment")
    def test_a_call_interrupted_from_inside_leaves_the_pool_refusing_every_later_call(self, impl: Target) -> None:
        world = make_world(impl)
        pool = world.pool
        holder = HashesOnce()
        with pytest.raises(PoolUnusableError, match="ERR-515") as caught:
            pool.allocate(1, holder=holder)  # accepted, then its hash fails inside the call
        assert isinstance(caught.value.__cause__, RuntimeError), "the holder's own exception is the cause"
        later = {
            "allocate": lambda: pool.allocate(1, holder="fresh"),
            "free": lambda: pool.free(world.held[:1], holder="r"),
            "ref_count": lambda: pool.ref_count(world.held[0]),
        }
        if impl.has("invariants"):  # an implementation without self-checks may offer fault containment
            later["check_invariants"] = pool.check_invariants
        answers = {name: _outcome(call) for name, call in later.items()}
        wrong = {name: got for name, got in answers.items() if got != "PoolUnusableError ERR-515"}
        assert not wrong, f"after a call was interrupted from inside, these answered instead of ERR-515: {wrong}"

    @rule("ERR-502")
    def test_errors_are_kvref_errors_and_matching_builtins(self, impl: Target) -> None:
        world = make_world(impl)
        with pytest.raises(TypeError):
            world.pool.allocate(1.5)
        with pytest.raises(ValueError, match="ERR-504"):
            world.pool.allocate(-1)
        with pytest.raises(IndexError):
            world.pool.free([10**6], holder="r")

    @rule("PFX-307")
    @requires("prefix-cache")
    def test_unknown_hashes_are_a_miss_not_an_error(self, impl: Target) -> None:
        world = make_world(impl)
        assert world.pool.lookup([999, 1]) == []
        assert world.pool.match([999], holder="z") == []

    @rule("ERR-505")
    @pytest.mark.parametrize("kind", int_kinds(), ids=lambda k: getattr(k, "__name__", "tensor"))
    def test_numpy_and_torch_integers_are_accepted_as_plain_ints(
        self, impl: Target, kind: Callable[[int], object]
    ) -> None:
        plain, other = make_world(impl), make_world(impl)
        caching = impl.has("prefix-cache")
        for w, conv in ((plain, int), (other, kind)):
            got = w.pool.allocate(conv(2), holder="k")
            w.pool.acquire([conv(b) for b in got], holder="j")
            gens = [conv(w.pool.generation(b)) for b in got]
            w.pool.free([conv(b) for b in got], holder="k", generations=gens)
            if caching:
                w.pool.register([conv(got[0])], [conv(40)], parent_hash=conv(3))
                w.pool.match([conv(1), conv(2)], holder="q")
            assert w.pool.ref_count(conv(got[0])) == 1
        assert observe(plain.pool) == observe(other.pool)

    @rule("ERR-505")
    def test_id_arrays_and_tensors_are_accepted_as_sequences(self, impl: Target) -> None:
        w = make_world(impl)
        ids = w.pool.allocate(2, holder="a")
        w.pool.free(np.array(ids[::-1], dtype=np.int32), holder="a")
        try:
            import torch
        except ImportError:
            return
        ids = w.pool.allocate(2, holder="a")
        w.pool.free(torch.tensor(ids), holder="a")
        self.check(w.pool)
