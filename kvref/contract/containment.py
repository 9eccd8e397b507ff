"""Faults from inside an operation (ERR-515): the pool that cannot promise ERR-501 says so on every later call.

A bad argument is refused before anything changes (ERR-501). An exception that is not a kvref
error can come from inside an operation after it has begun to change the state: a holder whose
``__hash__`` or ``__eq__`` raises after it was accepted, an array library that fails to allocate
device memory half-way. Nothing then says what state the pool is in, so :func:`contain_faults`
makes it say so: the call raises :class:`~kvref.contract.errors.PoolUnusableError` (the original
exception as its cause), and so does every later call, instead of answering from a state that
may be torn. A call whose arguments do not fit the method's signature never began: its
``TypeError`` passes through and the pool stays usable.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from kvref.contract.errors import KVRefError, PoolUnusableError

__all__ = ["contain_faults"]

T = TypeVar("T", bound=type)


def _never_began(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException) -> bool:
    """Whether ``exc`` is the ``TypeError`` of a call whose arguments do not fit ``method``'s signature:
    such a call never began. Decided on the error path only, by binding the arguments again."""
    if not isinstance(exc, TypeError):
        return False
    try:
        inspect.signature(method).bind(*args, **kwargs)
    except TypeError:
        return True
    return False


def _guard(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        fault = self._kvref_fault
        if fault is not None:
            raise PoolUnusableError("ERR-515", f"{name}: the pool is unusable since {fault}")
        try:
            return method(self, *args, **kwargs)
        except PoolUnusableError as unusable:
            cause = unusable.__cause__
            if self._kvref_fault is not None and cause is not None and not isinstance(cause, KVRefError):
                # a guarded call this one made on this pool was interrupted: name the call the caller made
                self._kvref_fault = _fault(name, cause)
                raise _interrupted(name, cause) from cause
            raise
        except KVRefError:
            raise
        except Exception as exc:
            if _never_began(method, (self, *args), kwargs, exc):
                raise  # the call did not fit the method's signature: nothing ran, nothing changed
            self._kvref_fault = _fault(name, exc)
            raise _interrupted(name, exc) from exc

    return guarded


def _fault(name: str, exc: BaseException) -> str:
    """What a pool keeps once ``name`` was interrupted by ``exc``: every later call quotes it (ERR-515)."""
    return f"{name} was interrupted by {type(exc).__name__}: {exc}"


def _interrupted(name: str, exc: BaseException) -> PoolUnusableError:
    """The error of a call ``name`` that ``exc`` interrupted from inside (ERR-515)."""
    return PoolUnusableError(
        "ERR-515", f"{name}: interrupted from inside by {type(exc).__name__}: {exc}; the pool is unusable"
    )


def contain_faults(cls: T) -> T:
    """Guard every public method of ``cls`` (its own and inherited ones) as ERR-515 says.

    Properties and the methods of :class:`object` are left as they are; a guarded call costs one
    attribute read and one Python frame.
    """
    setattr(cls, "_kvref_fault", None)  # noqa: B010 - the class default every guard reads
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name)
        if inspect.isfunction(attr) and not getattr(attr, "__kvref_guarded__", False):
            guarded = _guard(name, attr)
            guarded.__kvref_guarded__ = True  # type: ignore[attr-defined]
            setattr(cls, name, guarded)
    return cls
