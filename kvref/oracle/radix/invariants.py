"""Every invariant of chapter 06's radix tree, checked over its nodes (RADIX-611, RADIX-620..RADIX-627).

Reads the tree; changes nothing. Raises :class:`~kvref.contract.errors.InvariantViolation` naming
the rule broken, with what was seen and what the rule expects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from kvref.contract.errors import InvariantViolation
from kvref.oracle.radix.nodes import Node, page_key

__all__ = ["check_tree"]


def _fail(rule: str, message: str) -> InvariantViolation:
    return InvariantViolation(rule, f"check_invariants: {message}")


def check_tree(tree: Any, nodes: list[Node], owner: Mapping[int, Node], locked: Iterable[Node], protected: int) -> None:
    """Node shape, slot ownership, lock counts, sizes, and the allocator's own invariants."""
    ps = tree.page_size
    held = 0
    for node in nodes:
        if not node.alive:
            raise _fail("RADIX-620", f"node {node.ident} is listed but was removed")
        if node.is_root:
            if node.tokens or node.slots or node.locks:
                raise _fail("RADIX-620", f"root {node.ident} holds tokens, slots or locks")
            continue
        if not node.tokens or len(node.tokens) % ps or len(node.slots) != len(node.tokens):
            raise _fail(
                "RADIX-621",
                f"node {node.ident} holds {len(node.tokens)} tokens and {len(node.slots)} slots; "
                f"both must be the same positive multiple of the page ({ps})",
            )
        parent = node.parent
        if parent is None or not parent.alive or parent.children.get(page_key(node.tokens, 0, ps)) is not node:
            raise _fail("RADIX-627", f"node {node.ident} is not its parent's child under its first page")
        if parent.namespace != node.namespace:
            raise _fail("RADIX-620", f"node {node.ident} shares a parent across namespaces")
        for slot in node.slots:
            if owner.get(slot) is not node:
                raise _fail("RADIX-626", f"slot {slot} of node {node.ident} is recorded as held by another node")
        held += len(node.slots)
    if held != len(owner):
        raise _fail("RADIX-626", f"{len(owner)} slots recorded as held, the nodes hold {held}: a slot in two places?")
    for slot in owner:
        if not tree.allocator.is_allocated(slot):
            raise _fail("RADIX-626", f"the tree holds slot {slot}, which the allocator counts as free")
    want: Counter[int] = Counter()
    for target in locked:
        for n in target.path():
            want[n.ident] += 1
    for node in nodes:
        if node.locks != want[node.ident]:  # a count below 0 differs from every count of receipts
            raise _fail(
                "RADIX-624", f"node {node.ident} counts {node.locks} locks; the receipts held give {want[node.ident]}"
            )
    locked_tokens = sum(len(n.tokens) for n in nodes if n.locks)
    if protected != locked_tokens:
        raise _fail("RADIX-625", f"protected size {protected}, the locked nodes hold {locked_tokens} tokens")
    check_allocator = getattr(tree.allocator, "check_invariants", None)
    if check_allocator is not None:  # the oracle's allocator has its own (RADIX-611); a device one's suite checks it
        check_allocator()
