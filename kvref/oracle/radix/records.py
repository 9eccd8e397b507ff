"""What the radix cache hands back: match results, lock receipts, statistics (chapter 06)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LockReceipt", "MatchResult", "RadixStats"]


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
