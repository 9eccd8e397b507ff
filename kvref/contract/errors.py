"""The one exception tree of kvref.

Every error an implementation raises for bad input or an impossible request is a subclass of
:class:`KVRefError`, carries the id of the spec rule it enforces in :attr:`KVRefError.rule`, and
starts its message with that id (``"[POOL-104] ..."``). Raising one leaves the state exactly as it
was before the call (ERR-501). Where a Python built-in exception has the same meaning
(``TypeError``, ``ValueError``, ``LookupError``), the kvref class also derives from it, so callers
that catch the built-in keep working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendUnavailableError",
    "BlockIdError",
    "BlockStateError",
    "CacheInUseError",
    "ConfigError",
    "HashConflictError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidValueError",
    "FreeGroupError",
    "InvariantViolation",
    "KVRefError",
    "NotHeldError",
    "OutOfBlocksError",
    "PausedHolderError",
    "PoolUnusableError",
    "ReservedBlockError",
    "SpecError",
    "StaleBlockError",
    "TierStateError",
    "UnknownHashError",
]


class KVRefError(Exception):
    """Base of every kvref error; ``rule`` names the spec rule that was enforced (ERR-502)."""

    rule: str

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as it is, whatever a subclass's constructor takes: an error raised in a worker
        process reaches the parent with its own class, rule and message."""
        return (_restored, (type(self), self.args, dict(self.__dict__)))


def _restored(cls: type[KVRefError], args: tuple[Any, ...], state: dict[str, Any]) -> KVRefError:
    error = Exception.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class InvalidArgumentError(KVRefError):
    """An argument has the wrong type or value for the operation (ERR-503)."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument is not of an accepted type: a float, bool, str or None where an int is due."""


class InvalidValueError(InvalidArgumentError, ValueError):
    """An argument has an accepted type but a value outside its domain (negative count, ...)."""


class FreeGroupError(InvalidValueError):
    """A free group opened while one is open, or closed when none is (RADIX-607)."""


class BlockIdError(InvalidArgumentError, IndexError):
    """A block id lies outside ``[0, num_blocks)`` (POOL-103)."""


class ReservedBlockError(InvalidArgumentError):
    """A reserved block (the null/dummy block) was passed where a usable block is due (POOL-118)."""


class BlockStateError(KVRefError):
    """A block is in the wrong state for the operation (free where in use is due, ...)."""


class NotHeldError(BlockStateError):
    """A holder released a reference it does not hold (POOL-108)."""


class StaleBlockError(BlockStateError):
    """A block reference carries a generation older than the block's current one (POOL-111)."""


class TierStateError(BlockStateError):
    """A tier's key is in the wrong state for a load or its completion (TIER-1113, TIER-1115)."""


class OutOfBlocksError(KVRefError):
    """``allocate`` asked for more blocks than are free or evictable; nothing was taken (POOL-105)."""


class PausedHolderError(KVRefError):
    """A paused holder asked for new blocks, or a pause/resume call was out of turn (POOL-114)."""


class HashConflictError(KVRefError):
    """A registration contradicts the cache: a block hashed twice, or a hash with two parents."""


class UnknownHashError(KVRefError, LookupError):
    """A registration names a parent hash that is not resident in the cache (PFX-304)."""


class CacheInUseError(KVRefError):
    """``reset`` was called while some block is in use (PFX-313)."""


class PoolUnusableError(KVRefError, RuntimeError):
    """An earlier call was interrupted from inside (ERR-515): the pool refuses every call since."""


class InvariantViolation(KVRefError):
    """``check_invariants`` found a state the spec forbids; ``rule`` names the invariant broken."""


class ConfigError(KVRefError, ValueError):
    """A configuration value (file, environment or argument) is invalid; names key and source."""


class BackendUnavailableError(KVRefError, LookupError):
    """A backend name is unknown or its package cannot load here; the message says how to fix it."""


class SpecError(KVRefError):
    """The spec text breaks one of its own form rules (SPEC-001, SPEC-002)."""
