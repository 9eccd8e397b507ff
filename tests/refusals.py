"""One check for every refusal test: the error's class, its rule, and the words its message starts with.

A refused call must raise the specific error of the rule it breaks, with a message that starts
``[RULE] call: ...`` and names what was wrong (ERR-521). Tests that hold a room to its exact words
(the oracle rooms' error tests) call :func:`refused` instead of repeating these lines.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvref.contract.errors import KVRefError

__all__ = ["refused"]


def refused(case: str, call: Callable[[], object], error: type[KVRefError], rule_id: str, says: str) -> KVRefError:
    """Run ``call``; it must raise ``error`` under ``rule_id`` with a message starting ``[rule_id] says``.

    Returns the error, for checks of its own. ``case`` names the call in the failure's report.
    """
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert raised.value.rule == rule_id, f"{case}: raised {message!r}; the rule it breaks is {rule_id}"
    assert message.startswith(f"[{rule_id}] {says}"), f"[ERR-521] {case}: {message!r} does not start {says!r}"
    return raised.value
