"""One lock around every call, for an application that shares a pool between threads (POOL-122).

kvref's pools, like the engines' own, are called by one thread at a time and take no lock. An
application that shares one (a scheduler thread and a metrics thread, say) wraps it:
``Locked(pool)`` has the pool's methods and properties, each call and each read made while
holding one re-entrant lock, so calls from different threads never interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Locked"]


class Locked:
    """``pool`` with every method call and attribute read serialized by one lock (POOL-122).

    Methods are wrapped when first read; an attribute read (a property such as ``num_free``) is
    made under the lock as well. ``Locked(pool).lock`` is the lock, for a caller that must make
    several calls as one.
    """

    def __init__(self, pool: Any) -> None:
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "lock", threading.RLock())

    def __getattr__(self, name: str) -> Any:
        with self.lock:
            value = getattr(self.pool, name)
        if not callable(value):
            return value
        method: Callable[..., Any] = value

        def locked_call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return method(*args, **kwargs)

        return locked_call

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Locked: set attributes on the pool itself, not on its wrapper ({name!r})")

    def __repr__(self) -> str:
        return f"Locked({self.pool!r})"
