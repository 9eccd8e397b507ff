"""Two source trees of kvref, one recorded call list: every answer, error and state the same.

``record`` drives a backend's pools (the list protocol and its array forms, every policy, events
on and off, paused holders, bad inputs mixed in, chapter 05's matrix of bad inputs), chapter 06's
token slots and radix tree on the list protocol, and its array surfaces (chapter 06's token slots,
chapter 01's block arrays) with calls drawn from a seeded generator, and writes each call with
what it answered: the value, or the error's class, rule and message, and a digest of the pool's
snapshot every few calls. ``replay`` runs the same calls, in a
separate process over the other tree, and stops at the first call whose answer or state differs.

Each run imports the tree it is given first on ``sys.path``::

    python scripts/differential_trees.py record --tree ../kvref-old --backend torch --out old-torch.jsonl
    python scripts/differential_trees.py replay --tree . --backend torch --calls old-torch.jsonl

The recorded file is the call list; the replay reads it and generates nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

POLICIES = ["lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access"]
HOLDERS = ["a", "b", "c", "d", None]


def use_tree(tree: str) -> None:
    """Put ``tree``'s packages first on the import path (kvref, the backends, the suite)."""
    root = Path(tree).resolve()
    for part in ("conformance", "backends", "."):
        sys.path.insert(0, str(root / part))


def encode(value: Any) -> Any:
    """A JSON form of an answer: arrays and tensors as lists, tuples as lists, objects by repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))}
    if isinstance(value, set | frozenset):
        return sorted((encode(v) for v in value), key=repr)
    if hasattr(value, "tolist"):
        return encode(value.tolist())
    return repr(value)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(encode(value), sort_keys=True).encode()).hexdigest()[:16]


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    from kvref.contract.errors import KVRefError

    try:
        return {"value": encode(call())}
    except KVRefError as error:
        message = re.sub(r" at 0x[0-9a-f]+", " at 0x...", str(error))  # an object's address differs by process
        return {"error": type(error).__name__, "rule": getattr(error, "rule", None), "message": message}


# ---------------------------------------------------------------- the call list


def materialize(arg: Any) -> Any:
    """An argument as the call takes it: ``{"np": [...]}`` a NumPy int64 array, else as written."""
    import numpy as np

    if isinstance(arg, dict) and "np" in arg:
        return np.array(arg["np"], dtype=np.int64)
    if isinstance(arg, dict) and "np32" in arg:
        return np.array(arg["np32"], dtype=np.int32)
    return arg


def perform(target: Any, call: dict[str, Any]) -> Any:
    op = call["op"]
    args = [materialize(a) for a in call.get("args", [])]
    kwargs = {k: materialize(v) for k, v in call.get("kwargs", {}).items()}
    if not hasattr(target, op):  # an array form the oracle has not: answered alike by both trees
        return {"absent": op}
    if op == "free_many_ids":  # the ids come from the pool's own array type
        args[0] = target.ops.asarray(args[0]) if hasattr(target, "ops") else args[0]
    return getattr(target, op)(*args, **kwargs)


class PoolCalls:
    """Draws list-protocol calls on a pool from what its earlier answers were (recording only)."""

    def __init__(self, rng: random.Random, num_blocks: int) -> None:
        self.rng = rng
        self.n = num_blocks
        self.held: dict[Any, list[int]] = {}
        self.chains: list[list[int]] = []
        self.next_hash = 1
        self.gen = [0] * num_blocks  # each block's generation, as the answers tell it

    def note(self, call: dict[str, Any], result: dict[str, Any]) -> None:
        """What an answered call tells about the pool's holders and chains."""
        if "error" in result:
            return
        op, kw, value = call["op"], call.get("kwargs", {}), result["value"]
        if isinstance(value, dict) and "absent" in value:
            return
        if op in ("allocate", "allocate_ids"):
            self.renewed(value)
        elif op == "allocate_many":
            self.renewed([b for ids in value for b in ids])
        elif op == "allocate_many_ids":
            self.renewed(value[0])
        if op in ("allocate", "match", "allocate_ids", "match_request"):
            self.held.setdefault(kw.get("holder"), []).extend(value)
        elif op == "acquire":
            self.held.setdefault(kw.get("holder"), []).extend(call["args"][0])
        elif op in ("free",):
            self.drop(kw.get("holder"), call["args"][0])
        elif op in ("allocate_many", "match_many"):
            for h, ids in zip(kw["holders"], value, strict=False):  # the admitted holders
                self.held.setdefault(h, []).extend(ids)
        elif op == "allocate_many_ids":
            ids, offsets = value
            for i, h in enumerate(kw["holders"][: len(offsets) - 1]):  # the admitted holders
                self.held.setdefault(h, []).extend(ids[offsets[i] : offsets[i + 1]])
        elif op == "free_many":
            for h, ids in zip(kw["holders"], call["args"][0], strict=True):
                self.drop(h, ids)
        elif op == "free_many_ids":
            ids, offsets = call["args"][0]["np"], call["args"][1]
            for i, h in enumerate(kw["holders"]):
                self.drop(h, ids[offsets[i] : offsets[i + 1]])
        elif op in ("clear", "reset"):
            if op == "clear":
                self.held.clear()
            self.chains.clear()

    def renewed(self, ids: list[int]) -> None:
        for b in ids:
            self.gen[b] += 1

    def generations(self, ids: list[int], bad: bool) -> list[int]:
        """The current generation of each id (one off somewhere when ``bad``)."""
        gens = [self.gen[b] if 0 <= b < self.n else 0 for b in ids]
        if bad and gens:
            gens[self.rng.randrange(len(gens))] += self.rng.choice([-1, 1])
        return gens

    def drop(self, holder: Any, ids: Any) -> None:
        mine = self.held.get(holder, [])
        for b in next(iter(ids.values())) if isinstance(ids, dict) else ids:
            if b in mine:
                mine.remove(b)

    def some_held(self, holder: Any) -> list[int]:
        mine = self.held.get(holder, [])
        k = self.rng.randint(0, min(len(mine), 6))
        picked = self.rng.sample(mine, k) if k else []
        return picked

    def chain(self) -> list[int]:
        """A hash chain: a known chain's prefix, maybe continued with new hashes."""
        r = self.rng
        base: list[int] = []
        if self.chains and r.random() < 0.8:
            known = r.choice(self.chains)
            base = known[: r.randint(0, len(known))]
        extra = r.randint(0 if base else 1, 4)
        for _ in range(extra):
            base.append(self.next_hash)
            self.next_hash += 1
        return base

    def bad_id(self) -> Any:
        r = self.rng
        return r.choice([-1, self.n, self.n + 5, 0, r.randrange(1, self.n), 2**70])

    def draw(self) -> dict[str, Any]:
        r = self.rng
        h = r.choice(HOLDERS)
        bad = r.random() < 0.08
        pick = r.random()
        if pick < 0.16:
            count = r.choice([0, 1, 1, 2, 3, 5, 8, self.n // 2])
            if bad:
                count = r.choice([-1, 10**12, self.n + 1])
            return {"op": r.choice(["allocate", "allocate", "allocate_ids"]), "args": [count], "kwargs": {"holder": h}}
        if pick < 0.34:
            ids = self.some_held(h)
            if bad:
                ids = [*ids, r.choice([*ids, self.bad_id()]) if ids else self.bad_id()]
            r.shuffle(ids)
            kwargs: dict[str, Any] = {"holder": h}
            if r.random() < 0.15:
                kwargs["generations"] = self.generations(ids, bad)
            given: Any = ids
            if r.random() < 0.1 and all(0 <= b < 2**31 for b in ids):
                given = {"np32": ids}
            return {"op": "free", "args": [given], "kwargs": kwargs}
        if pick < 0.42:
            other = r.choice(HOLDERS)
            ids = self.some_held(other)
            if bad or not ids:
                ids = [*ids, self.bad_id()]
            kwargs = {"holder": h}
            if r.random() < 0.15:
                kwargs["generations"] = self.generations(ids, bad and r.random() < 0.5)
            return {"op": "acquire", "args": [ids], "kwargs": kwargs}
        if pick < 0.56:
            mine = self.held.get(h, [])
            if not mine:
                return {"op": "allocate", "args": [2], "kwargs": {"holder": h}}
            k = r.randint(1, min(len(mine), 4))
            ids = mine[-k:]
            chain = self.chain()
            parent_len = r.randint(0, max(0, len(chain) - 1))
            parent = chain[parent_len - 1] if parent_len else None
            hashes = chain[parent_len : parent_len + k]
            while len(hashes) < k:
                hashes.append(self.next_hash)
                self.next_hash += 1
            if bad:
                hashes = [*hashes[:-1], r.choice([-1, hashes[0], 2**64])]
            full = [*chain[:parent_len], *hashes]
            self.chains.append(full)
            kwargs = {} if parent is None else {"parent_hash": parent}
            return {"op": "register", "args": [ids, hashes], "kwargs": kwargs}
        if pick < 0.70:
            chain = self.chain()
            if bad:
                chain = [*chain, -3]
            op = r.choice(["match", "match", "lookup", "match_request"])
            after: dict[str, Any] = {}
            if op != "match_request" and len(chain) > 1 and r.random() < 0.25:  # a chain after a parent
                cut = r.randrange(1, len(chain))
                after, chain = {"parent_hash": chain[cut - 1]}, chain[cut:]
            if op == "lookup":
                return {"op": op, "args": [chain], "kwargs": after}
            if op == "match_request":
                size = 4
                return {
                    "op": op,
                    "args": [chain],
                    "kwargs": {"num_tokens": len(chain) * size + r.randint(0, 3), "block_size": size, "holder": h},
                }
            return {"op": op, "args": [chain], "kwargs": {"holder": h, **after}}
        if pick < 0.80:
            holders = r.sample(["a", "b", "c", "d"], r.randint(1, 3))
            form = r.choice(["allocate_many", "allocate_many_ids", "free_many", "free_many_ids", "match_many"])
            if form.startswith("allocate"):
                counts = [r.choice([0, 1, 2, 4]) for _ in holders]
                if bad:
                    counts[-1] = -1
                return {"op": form, "args": [counts], "kwargs": {"holders": holders}}
            if form == "match_many":
                return {"op": form, "args": [[self.chain() for _ in holders]], "kwargs": {"holders": holders}}
            lists = [self.some_held(x) for x in holders]
            if bad:
                lists[-1] = [*lists[-1], self.bad_id()]
            if form == "free_many":
                return {"op": form, "args": [lists], "kwargs": {"holders": holders}}
            flat = [b if b < 2**62 else self.n + 1 for ids in lists for b in ids]  # int64 arrays
            offsets = [0]
            for ids in lists:
                offsets.append(offsets[-1] + len(ids))
            return {"op": form, "args": [{"np": flat}, offsets], "kwargs": {"holders": holders}}
        if pick < 0.86:
            return {"op": "evict", "args": [r.choice([0, 1, 2, 5, -1 if bad else 3])], "kwargs": {}}
        if pick < 0.90:
            return {"op": r.choice(["pause", "resume"]), "args": [h], "kwargs": {}}
        if pick < 0.93:
            return {"op": "take_events", "args": [], "kwargs": {}}
        if pick < 0.95:
            return {"op": r.choice(["clear", "reset", "reset"]), "args": [], "kwargs": {}}
        query = r.choice(["ref_count", "generation", "block_state", "block_hash", "holders"])
        return {"op": query, "args": [r.randrange(-1, self.n + 1)], "kwargs": {}}


def pool_scenarios(calls_total: int, seed: int) -> Iterator[tuple[dict[str, Any], int]]:
    """One pool per scenario: every policy, events on and off, three sizes, until the calls run out."""
    rng = random.Random(seed)
    per = max(200, calls_total // 60)
    made = 0
    i = 0
    while made < calls_total:
        policy = POLICIES[i % len(POLICIES)]
        events = (i // len(POLICIES)) % 2 == 1
        size = [8, 32, 200][(i // (2 * len(POLICIES))) % 3]
        kwargs = {"policy": policy, "enable_events": events, "paused_limit": rng.choice([0, 2, 8])}
        yield {"num_blocks": size, **kwargs}, rng.randrange(2**32)
        made += per
        i += 1


def record_pools(backend: Any, calls_total: int, seed: int, emit: Callable[[dict[str, Any]], None]) -> int:
    per = max(200, calls_total // 60)
    done = 0
    for params, scenario_seed in pool_scenarios(calls_total, seed):
        emit({"pool": params})
        pool = backend.create(params["num_blocks"], **{k: v for k, v in params.items() if k != "num_blocks"})
        calls = PoolCalls(random.Random(scenario_seed), params["num_blocks"])
        for step in range(per):
            call = calls.draw()
            result = outcome(partial(perform, pool, call))
            calls.note(call, result)
            line = {"call": call, **result}
            if step % 25 == 24:
                line["state"] = digest(pool.snapshot())
                pool.check_invariants()
            emit(line)
            done += 1
        emit({"end": digest(pool.snapshot())})
    return done


def record_matrix(backend: Any, emit: Callable[[dict[str, Any]], None]) -> int:
    """Chapter 05's matrix of bad inputs, on a fresh world per case and policy: answer and state after."""
    from kvref_conformance.suites.bad_inputs import CASES

    done = 0
    for policy in POLICIES:
        for name, case, _, _ in CASES:
            result = matrix_case(backend, policy, case)
            emit({"case": f"{policy}: {name}", **result})
            done += 1
    return done


def matrix_case(backend: Any, policy: str, case: Callable[[Any], Any]) -> dict[str, Any]:
    """One case of the matrix on a fresh world (a world that cannot be built under the policy is its answer)."""
    from kvref_conformance.suites.bad_inputs import make_world

    target: Any = _PolicyTarget(backend, policy)
    built = outcome(lambda: make_world(target))
    if "error" in built:
        return built
    world = make_world(target)
    return {**outcome(lambda: case(world)), "state": digest(world.pool.snapshot())}


class _PolicyTarget:
    """The little of a conformance target that ``make_world`` reads, with the policy fixed."""

    def __init__(self, backend: Any, policy: str) -> None:
        self.backend, self.policy = backend, policy

    def has(self, capability: str) -> bool:
        return capability in {"prefix-cache", "events", "batching", "pause"}

    def create(self, num_blocks: int, **kwargs: Any) -> Any:
        kwargs["policy"] = self.policy
        return self.backend.create(num_blocks, **kwargs)


def _first_policy_patch() -> None:
    from kvref_conformance.suites import bad_inputs

    setattr(bad_inputs, "first_policy", lambda impl: impl.policy)  # noqa: B010 - the world takes the scenario's policy


def record_slots(backend: Any, calls_total: int, seed: int, emit: Callable[[dict[str, Any]], None]) -> int:
    """Chapter 06's allocator on the array surface and the block pool's array surface: fused calls."""
    rng = random.Random(seed)
    done = 0
    per = max(200, calls_total // 8)
    for page_size, sort in [(1, True), (1, False), (4, True), (16, False)]:
        size = 64 * page_size
        emit({"slots": [size, page_size, sort]})
        slots = backend.create_slot_arrays(size, page_size=page_size, sort=sort)
        held: list[int] = []
        for step in range(per):
            pick = rng.random()
            bad = rng.random() < 0.06
            call: dict[str, Any]
            if pick < 0.4:
                call = {"op": "alloc", "args": [rng.choice([0, 1, page_size, 3 * page_size, size + 1 if bad else 2])]}
            elif pick < 0.75:
                k = rng.randint(0, min(len(held), 3 * page_size))
                ids = held[:k]
                if bad and ids:
                    ids = [*ids, ids[0]]
                call = {"op": "free", "args": [{"np": ids}]}
            elif pick < 0.9:
                k = rng.randint(0, min(len(held), page_size))
                call = {"op": "free_then_alloc", "args": [{"np": held[:k]}, rng.choice([1, page_size])]}
            else:
                call = {"op": "check", "args": []}
            result = outcome(partial(perform_slots, slots, call))
            if "error" not in result and call["op"] in ("alloc", "free_then_alloc"):
                if call["op"] == "free_then_alloc":
                    del held[: len(call["args"][0]["np"])]
                if result["value"]:
                    held.extend(result["value"])
            elif "error" not in result and call["op"] == "free" and not bad:
                del held[: len(call["args"][0]["np"])]
            elif "error" in result or bad:
                held = list(encode(slots.allocated_pages()))  # resync: which pages are out
                held = [p * page_size + j for p in held for j in range(page_size)]
            line = {"call": call, **result}
            if step % 25 == 24:
                line["state"] = digest(slots.snapshot())
            emit(line)
            done += 1
        emit({"end": digest(slots.snapshot())})
    for reserved in [(0,), ()]:
        emit({"blocks": list(reserved)})
        pool = backend.create_block_arrays(48, max_requests=8, reserved_ids=reserved)
        owned: dict[int, list[int]] = {}
        for step in range(per):
            pick = rng.random()
            bad = rng.random() < 0.06
            slot = rng.randrange(8)
            if pick < 0.4:
                call = {"op": "allocate", "args": [[rng.choice([0, 1, 2, 5])], [slot]]}
            elif pick < 0.75:
                mine = owned.get(slot, [])
                ids = mine[: rng.randint(0, len(mine))]
                if bad:
                    ids = [*ids, rng.randrange(48)]
                call = {"op": "free", "args": [{"np": ids}, slot]}
            elif pick < 0.9:
                other = owned.get(rng.randrange(8), [])
                ids = other[: rng.randint(0, len(other))]
                call = {"op": "acquire", "args": [{"np": ids}, slot]}
            else:
                call = {"op": "check", "args": []}
            result = outcome(partial(perform_slots, pool, call))
            if "error" not in result and not bad:
                if call["op"] == "allocate":
                    owned.setdefault(slot, []).extend(result["value"][0])
                elif call["op"] == "free":
                    for b in call["args"][0]["np"]:
                        owned[slot].remove(b)
                elif call["op"] == "acquire":
                    mine = owned.setdefault(slot, [])
                    mine.extend(b for b in call["args"][0]["np"] if b not in mine)
            if "error" in result or bad:
                owned = {s: [b for b in range(48) if s in pool.holders(b)] for s in range(8)}
            line = {"call": call, **result}
            if step % 25 == 24:
                line["state"] = digest(pool.snapshot())
            emit(line)
            done += 1
        emit({"end": digest(pool.snapshot())})
    return done


def record_slot_lists(backend: Any, calls_total: int, seed: int, emit: Callable[[dict[str, Any]], None]) -> int:
    """Chapter 06's allocator on the list protocol (``create_slots``): allocations, frees (double,
    foreign and out-of-range ones among them), free groups, merges, versions and the queries."""
    rng = random.Random(seed)
    done = 0
    per = max(200, calls_total // 4)
    for page_size, sort in [(1, True), (1, False), (4, True), (16, False)]:
        size = 64 * page_size
        emit({"slot_lists": [size, page_size, sort]})
        slots = backend.create_slots(size, page_size=page_size, sort=sort)
        for step in range(per):
            held = [s for s in range(size + page_size) if slots.is_allocated(s)]
            pick = rng.random()
            bad = rng.random() < 0.06
            call: dict[str, Any]
            if pick < 0.3:
                call = {
                    "op": "alloc",
                    "args": [rng.choice([0, page_size, 3 * page_size, size + page_size, 1 if bad else 2 * page_size])],
                }
            elif pick < 0.4:
                call = {
                    "op": "alloc_many",
                    "args": [[rng.choice([0, page_size, 2 * page_size]) for _ in range(rng.randint(0, 3))]],
                }
            elif pick < 0.7:
                ids = rng.sample(held, rng.randint(0, min(len(held), 3 * page_size)))
                if bad:
                    ids = [*ids, rng.choice([0, -1, size + page_size, *(ids[:1] or [page_size])])]
                call = {"op": "free", "args": [ids]}
            elif pick < 0.8:
                call = {"op": rng.choice(["free_group_begin", "free_group_end", "merge_and_sort_free"]), "args": []}
            elif pick < 0.92:
                slot = rng.randrange(-1 if bad else 0, size + page_size)
                query = rng.choice(["version", "is_allocated", "is_current"])
                call = {"op": query, "args": [slot, rng.randrange(3)] if query == "is_current" else [slot]}
            else:
                call = {"op": rng.choice(["check_invariants", "free_order", "available_size"]), "args": []}
            line = {"call": call, **outcome(partial(perform_slot_lists, slots, call))}
            if step % 25 == 24:
                line["state"] = digest(slots.snapshot())
            emit(line)
            done += 1
        emit({"end": digest(slots.snapshot())})
    return done


class RadixWorld:
    """Chapter 06's radix tree with its allocator, driven as a scheduler drives it: a call names
    nodes by the idents matches gave and receipts by their place in the list of locks taken."""

    def __init__(self, backend: Any, params: dict[str, Any]) -> None:
        self.allocator, self.tree = backend.create_radix(params.pop("size"), **params)
        self.receipts: list[Any] = []

    def cache(self, tokens: list[int], namespace: str, priority: int, spoil: str) -> Any:
        """Allocate for ``tokens``, insert them, free the slots of the part cached already."""
        taken = self.allocator.alloc(len(tokens)) if spoil != "unallocated" else None
        if taken is None and spoil != "unallocated":
            return None
        slots = list(range(1, len(tokens) + 1)) if taken is None else list(taken)
        if spoil == "short":
            slots = slots[:-1]
        try:
            have = self.tree.insert(tokens, slots, namespace=namespace, priority=priority)
        except Exception:
            if taken is not None and len(taken):
                self.allocator.free(taken)
            raise
        if have and taken is not None:  # the duplicates this call allocated
            self.allocator.free(slots[:have])
        return [have, slots]

    def match(self, tokens: list[int], namespace: str) -> Any:
        return self.tree.match(tokens, namespace=namespace)

    def lock(self, node: int) -> Any:
        self.receipts.append(self.tree.lock(node))
        return len(self.receipts) - 1

    def unlock(self, index: int) -> Any:
        return self.tree.unlock(self.receipts[index] if index < len(self.receipts) else None)

    def query(self, name: str, *args: Any) -> Any:
        got = getattr(self.tree, name)
        return got(*args) if callable(got) else got

    def snapshot(self) -> Any:
        return [self.tree.snapshot(), self.allocator.snapshot()]


def record_radix(backend: Any, calls_total: int, seed: int, emit: Callable[[dict[str, Any]], None]) -> int:
    """Chapter 06's radix tree over its allocator: caching (inserts of shared prefixes, bad ones
    among them), matches, locks and unlocks by the nodes matches gave, evictions, resets, events
    and the queries, under every policy, pages 1 and 4, with and without a capacity."""
    rng = random.Random(seed)
    done = 0
    configs = [
        (policy, page_size, max_tokens)
        for policy in ("lru", "lfu", "fifo", "mru", "priority")
        for page_size, max_tokens in ((1, None), (4, None), (1, 96))
    ]
    per = max(100, calls_total // len(configs))
    for policy, page_size, max_tokens in configs:
        params = {"size": 256 * page_size, "page_size": page_size, "policy": policy, "max_tokens": max_tokens}
        params["enable_events"] = rng.random() < 0.5
        emit({"radix": params})
        world = RadixWorld(backend, dict(params))
        stems = [[rng.randrange(50) for _ in range(rng.randint(1, 6) * page_size)] for _ in range(6)]
        nodes: list[int] = [0]
        for step in range(per):
            pick = rng.random()
            namespace = rng.choice(["a", "a", "b"])
            tokens = rng.choice(stems) + [rng.randrange(50) for _ in range(rng.randint(0, 4) * page_size)]
            call: dict[str, Any]
            if pick < 0.35:
                spoil = rng.choice(["", "", "", "", "", "", "short", "unallocated"])
                if spoil == "" and rng.random() < 0.04:
                    tokens = [*tokens[:-1], -1] if tokens else [-1]
                call = {"op": "cache", "args": [tokens, namespace, rng.randrange(3), spoil]}
            elif pick < 0.65:
                call = {"op": "match", "args": [tokens[: rng.randint(0, len(tokens))], namespace]}
            elif pick < 0.75:
                call = {"op": "lock", "args": [rng.choice(nodes)]}
            elif pick < 0.85:
                call = {"op": "unlock", "args": [rng.randrange(len(world.receipts))] if world.receipts else [0]}
            elif pick < 0.92:
                call = {"op": "query", "args": ["evict", rng.choice([0, 1, page_size * 3, 50])]}
            else:
                name = rng.choice(["reset", "take_events", "stats", "check_invariants", "total_size", "protected_size"])
                call = {"op": "query", "args": [name]}
            result = outcome(partial(perform_slot_lists, world, call))
            made = re.search(r"node=(\d+)", str(result.get("value")))
            if call["op"] == "match" and made:
                nodes.append(int(made.group(1)))
            line = {"call": call, **result}
            if step % 25 == 24:
                line["state"] = digest(world.snapshot())
            emit(line)
            done += 1
        emit({"end": digest(world.snapshot())})
    return done


def perform_slot_lists(target: Any, call: dict[str, Any]) -> Any:
    return getattr(target, call["op"])(*call["args"])


def perform_slots(target: Any, call: dict[str, Any]) -> Any:
    args = [materialize(a) for a in call["args"]]
    if call["op"] in ("free", "free_then_alloc", "acquire") and args:
        args[0] = target.ops.asarray(args[0])
    return getattr(target, call["op"])(*args)


# ---------------------------------------------------------------- record and replay


def record(args: argparse.Namespace) -> None:
    use_tree(args.tree)
    _first_policy_patch()
    from kvref.config.registry import load_backend

    backend: Any = load_backend(args.backend)
    started = time.perf_counter()
    with open(args.out, "w") as out:

        def emit(line: dict[str, Any]) -> None:
            out.write(json.dumps(line) + "\n")

        pools = record_pools(backend, args.calls, args.seed, emit)
        matrix = record_matrix(backend, emit)
        has_surfaces = hasattr(backend, "create_slot_arrays")
        slots = record_slots(backend, args.calls // 10, args.seed + 1, emit) if has_surfaces else 0
        slots += record_slot_lists(backend, args.calls // 10, args.seed + 2, emit)
        slots += record_radix(backend, args.calls, args.seed + 3, emit)
    took = time.perf_counter() - started
    print(f"recorded {pools} pool calls, {matrix} bad-input cases, {slots} array-surface calls in {took:.0f} s")


def replay(args: argparse.Namespace) -> int:
    use_tree(args.tree)
    _first_policy_patch()
    from kvref.config.registry import load_backend
    from kvref_conformance.suites.bad_inputs import CASES

    backend: Any = load_backend(args.backend)
    cases = dict((name, case) for name, case, _, _ in CASES)
    target: Any = None
    kind = ""
    compared = 0
    started = time.perf_counter()
    with open(args.calls) as recorded:
        lines = recorded.readlines()
    for number, text in enumerate(lines, 1):
        line = json.loads(text)
        got: dict[str, Any]
        if "pool" in line:
            params = line["pool"]
            target = backend.create(params["num_blocks"], **{k: v for k, v in params.items() if k != "num_blocks"})
            kind = "pool"
            continue
        if "slots" in line:
            size, page_size, sort = line["slots"]
            target, kind = backend.create_slot_arrays(size, page_size=page_size, sort=sort), "slots"
            continue
        if "radix" in line:
            target, kind = RadixWorld(backend, dict(line["radix"])), "slot_lists"
            continue
        if "slot_lists" in line:
            size, page_size, sort = line["slot_lists"]
            target, kind = backend.create_slots(size, page_size=page_size, sort=sort), "slot_lists"
            continue
        if "blocks" in line:
            target = backend.create_block_arrays(48, max_requests=8, reserved_ids=tuple(line["blocks"]))
            kind = "slots"
            continue
        if "end" in line:
            got = {"end": digest(target.snapshot())}
            expected = {"end": line["end"]}
        elif "case" in line:
            policy, _, name = line["case"].partition(": ")
            got = matrix_case(backend, policy, cases[name])
            expected = {k: v for k, v in line.items() if k != "case"}
        else:
            call = line["call"]
            run = {"pool": perform, "slot_lists": perform_slot_lists}.get(kind, perform_slots)
            got = outcome(partial(run, target, call))
            if "state" in line:
                got["state"] = digest(target.snapshot())
                if kind == "pool":
                    target.check_invariants()
            expected = {k: v for k, v in line.items() if k != "call"}
        if got != expected:
            print(f"line {number}: differs\n  call:     {line.get('call', line.get('case'))}")
            print(f"  recorded: {expected}\n  now:      {got}")
            return 1
        compared += 1
    took = time.perf_counter() - started
    print(f"{compared} answers and states compared, no difference ({took:.0f} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="draw calls, run them on --tree, write calls and answers")
    rec.add_argument("--tree", required=True)
    rec.add_argument("--backend", required=True)
    rec.add_argument("--calls", type=int, default=100_000)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="run a recorded call list on --tree and compare")
    rep.add_argument("--tree", required=True)
    rep.add_argument("--backend", required=True)
    rep.add_argument("--calls", required=True)
    args = parser.parse_args()
    if args.command == "record":
        record(args)
        return 0
    return replay(args)


if __name__ == "__main__":
    sys.exit(main())
