"""What the oracle's radix tree shows without changing anything: keys, slots, a snapshot, its self-check.

:class:`TreeViews` is a mixin of :class:`~kvref.oracle.radix.tree.OracleRadixCache`, reading the
nodes, the slot owners, the lock receipts and the protected count the tree keeps.
"""

from __future__ import annotations

from typing import Any, SupportsIndex

from kvref.oracle.radix.invariants import check_tree
from kvref.oracle.radix.nodes import Node
from kvref.oracle.radix.records import RadixStats

__all__ = ["TreeViews"]


class TreeViews:
    """``node_tokens``, ``cached_slots``, ``snapshot`` and ``check_invariants`` (RADIX-620..RADIX-633)."""

    _nodes: dict[int, Node]
    _owner: dict[int, Node]
    _receipts: dict[int, Node | None]
    _protected: int
    _counts: list[int]  # RadixStats' fields, in order

    def _node(self, value: object, op: str) -> Node | None:
        raise NotImplementedError

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
            n.ident: (n.namespace, n.tokens, tuple(n.slots), n.parent.ident if n.parent else None, n.locks)
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
