"""Block ids an engine returned as a view of its own state, renamed into kvref's ids each time they are read."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["EngineIds"]


class EngineIds(Sequence[int]):
    """The block ids ``allocate_memory_blocks`` returned, renamed into kvref's ids each time they are read.

    Megatron-Core returns a slice of its ``block_bag``, a view: passing it through as it is, and not
    a copy, lets the suite see what a caller that keeps it sees (POOL-123).
    """

    def __init__(self, view: Any, rename: Callable[[int], int]) -> None:
        self._view = view
        self._rename = rename

    def tolist(self) -> list[int]:
        """The ids as the view holds them now."""
        return [self._rename(int(m)) for m in self._view.tolist()]

    def __getitem__(self, index: Any) -> Any:
        return self.tolist()[index]

    def __iter__(self) -> Iterator[int]:
        """The ids as the view holds them now, read once (not one whole read per item)."""
        return iter(self.tolist())

    def __len__(self) -> int:
        return int(self._view.numel())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self.tolist() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[int]) -> list[int]:
        return self.tolist() + list(other)

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return list(other) + self.tolist()

    def __repr__(self) -> str:
        return repr(self.tolist())
