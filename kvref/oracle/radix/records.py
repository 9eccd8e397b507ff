"""What the radix cache hands back (matches, lock receipts, statistics) and asks of its allocator (chapter 06)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LockReceipt", "MatchResult", "RadixStats", "TokenSlotAllocator"]


class TokenSlotAllocator(Protocol):
    """What the radix tree asks of its allocator: the oracle's, or a device backend's (RADIX-620)."""

    @property
    def page_size(self) -> int:
        """Slots per page."""

    @property
    def size(self) -> int:
        """Usable slots: ``num_pages * page_size``."""

    @property
    def num_pages(self) -> int:
        """Pages ``1 .. num_pages`` (page 0 is the padding page)."""

    def is_allocated(self, slot: int) -> bool:
        """Whether ``slot``'s page is allocated."""

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` slots in whole pages, or None."""

    def free(self, indices: Sequence[int]) -> None:
        """Return the pages ``indices`` fall in."""

    def available_size(self) -> int:
        """Slots of free and released pages."""


@dataclass(frozen=True)
class MatchResult:
    """The longest cached prefix of a key: its slots, its length in tokens and its last node (RADIX-622)."""

    slots: list[int]
    length: int
    node: int


@dataclass(frozen=True)
class LockReceipt:
    """What ``lock`` hands back and ``unlock`` takes: one lock on one node, usable once (RADIX-624)."""

    ident: int
    node: int


@dataclass(frozen=True)
class RadixStats:
    """Matches, tokens asked for and tokens hit (whole pages), tokens evicted, resets (RADIX-632)."""

    matches: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    evicted_tokens: int = 0
    resets: int = 0
