"""Chapter 05 on kvref's own pools: validation survives ``python -O`` and uses no assert, and every
refusal's message has its exact form.

The bad-input matrix over every operation lives in the conformance suite
(``kvref_conformance.suites.errors``), whose ERR-521 check passes any wording that names the rule;
here the oracle's and the array core's messages (the CuPy backend, on NumPy where there is no
CUDA, and torch) are held to the form ``[RULE] call: ...`` with the argument at fault named.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kvref.contract.errors import KVRefError
from kvref.oracle import OracleBlockPool
from kvref_conformance.suites.bad_inputs import CASES, make_world
from kvref_conformance.suites.errors import argument_at_fault
from kvref_conformance.target import Target

rule = pytest.mark.rule


@rule("ERR-507")
def test_validation_holds_under_python_dash_o() -> None:
    code = (
        "from kvref.oracle import OracleBlockPool\n"
        "from kvref.contract.errors import NotHeldError\n"
        "p = OracleBlockPool(4)\n"
        "[b] = p.allocate(1)\n"
        "p.free([b])\n"
        "try:\n    p.free([b])\nexcept NotHeldError:\n    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "refused", f"under -O a double free was not refused: {out.stdout!r}"


@rule("ERR-507")
def test_no_source_file_validates_with_assert() -> None:
    import ast
    from pathlib import Path

    import kvref

    root = Path(kvref.__file__).parent
    offenders = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert not offenders, f"assert statements in kvref (stripped under -O): {offenders}"


#: kvref's pools whose messages are held to the form: the oracle and the array core on two libraries.
BACKENDS = ["oracle", "cupy", "torch"]


def pool_on(backend: str, num_blocks: int, **settings: Any) -> Any:
    """A pool of ``backend`` (torch skipped where it is not installed)."""
    if backend == "torch":
        pytest.importorskip("torch")
    return Target.from_backend(backend).create(num_blocks, **settings)


@rule("ERR-502", "ERR-521")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_each_bad_input_message_starts_with_its_rule_and_call_and_names_the_argument(case: str, backend: str) -> None:
    """Stricter than the suite's ERR-521 check, which any wording passes: kvref's messages all read
    ``[RULE] operation: ...`` and name the argument at fault as a word of its own."""
    name, call, _, rule_id = next(c for c in CASES if c[0] == case)
    if backend == "torch":
        pytest.importorskip("torch")
    world = make_world(Target.from_backend(backend))
    with pytest.raises(KVRefError) as raised:
        call(world)
    message, operation, argument = str(raised.value), name.split(":")[0], argument_at_fault(name)
    assert message.startswith(f"[{rule_id}] {operation}: "), (
        f"[ERR-521] {case}: {message!r} does not lead with its call"
    )
    assert argument is None or re.search(rf"(?<!\w){re.escape(argument)}(?!\w)", message), (
        f"[ERR-521] {case}: {message!r} does not name the argument at fault, {argument!r}"
    )


def _message(backend: str, call: Callable[[Any], object]) -> str:
    """The message ``call`` raises on a fresh bad-input world of ``backend``, object addresses blotted out."""
    with pytest.raises(KVRefError) as raised:
        call(make_world(Target.from_backend(backend)))
    return re.sub(r"0x[0-9a-f]+", "0x…", str(raised.value))


@rule("ERR-502", "ERR-521")
@pytest.mark.parametrize("backend", ["cupy", "torch"])
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_the_array_core_words_each_bad_input_as_the_oracle_does(case: str, backend: str) -> None:
    """Word for word, numbers included: the oracle's message is the reference's, and the array core
    (CuPy's and torch's pools) says the same of the same call."""
    if backend == "torch":
        pytest.importorskip("torch")
    call = next(c[1] for c in CASES if c[0] == case)
    said, expected = _message(backend, call), _message("oracle", call)
    assert said == expected, f"[ERR-521] {case} on {backend}: {said!r}; the oracle says {expected!r}"


def _in_use_reset(pool: OracleBlockPool) -> None:
    pool.allocate(1, holder="r")
    pool.reset()


def _paused_admission(pool: OracleBlockPool, many: str) -> None:
    pool.pause("p")
    if many == "allocate_many":
        pool.allocate_many([1], holders=["p"])
    else:
        pool.match_many([[1]], holders=["p"])


#: The pool is typed ``Any`` in the calls: they pass what the signatures refuse, on purpose.
OTHER_REFUSALS: list[tuple[str, Callable[[Any], object], str, str]] = [
    ("reset while a block is in use", _in_use_reset, "PFX-313", "reset: 1 block(s) in use"),
    (
        "allocate_many for a paused holder",
        lambda p: _paused_admission(p, "allocate_many"),
        "POOL-114",
        "allocate_many: holder 'p' is paused",
    ),
    (
        "match_many for a paused holder",
        lambda p: _paused_admission(p, "match_many"),
        "POOL-114",
        "match_many: holder 'p' is paused",
    ),
    (
        "replay_requests of a str",
        lambda p: p.replay_requests("ab"),
        "ERR-503",
        "replay_requests: block_lists must be a sequence of hash lists, got str",
    ),
    (
        "replay_requests of an int",
        lambda p: p.replay_requests(5),
        "ERR-503",
        "replay_requests: block_lists must be a sequence of hash lists, got int",
    ),
    (
        "replay_requests of a set",
        lambda p: p.replay_requests({(1,)}),
        "ERR-503",
        "replay_requests: block_lists must be an ordered sequence",
    ),
    (
        "holder_references of an unhashable holder",
        lambda p: p.holder_references([]),
        "ERR-503",
        "holder_references: holder",
    ),
    (
        "match_many of a str",
        lambda p: p.match_many("ab", holders=["a"]),
        "ERR-503",
        "match_many: hash_lists must be a sequence of integers, got str",
    ),
    (
        "match_request of a str",
        lambda p: p.match_request("ab", num_tokens=4, block_size=2),
        "ERR-503",
        "match_request: block_hashes must be a sequence of integers, got str",
    ),
]


@rule("ERR-502", "ERR-521", "PFX-313", "POOL-114")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("case", "call", "rule_id", "says"), OTHER_REFUSALS, ids=[c[0] for c in OTHER_REFUSALS])
def test_other_refusals_lead_with_their_rule_and_call(
    case: str, call: Callable[[Any], object], rule_id: str, says: str, backend: str
) -> None:
    pool = pool_on(backend, 8, policy="lru", paused_limit=2)
    if case.startswith("replay_requests") and not hasattr(pool, "replay_requests"):
        pytest.skip(f"the fused replay is the oracle's; {backend}'s pool replays through its calls")
    with pytest.raises(KVRefError) as raised:
        call(pool)
    message = str(raised.value)
    assert message.startswith(f"[{rule_id}] {says}"), f"[ERR-521] {case}: {message!r} does not start {says!r}"


@rule("PFX-308", "PFX-321")
def test_a_lookup_follows_the_copy_it_is_told_to_prefer() -> None:
    pool = OracleBlockPool(8)
    older, newer = pool.allocate(2, holder="a")
    pool.register([older], [7])
    pool.register([newer], [7])  # a second copy of hash 7
    assert pool.lookup([7]) == [older], "the oldest copy by default"
    assert pool.lookup([7], prefer=[newer]) == [newer], "the copy named in prefer"
    assert pool.lookup([7], prefer=[5]) == [older], "a preference for no copy of the hash is no preference"


@pytest.mark.rule("ERR-502")
def test_every_kvref_error_crosses_a_process_boundary_whole() -> None:
    """A sweep's worker raises a kvref error; pickled to the parent it keeps its class, rule,
    message and fields (an error that could not be pickled broke the whole process pool)."""
    import pickle

    from kvref.contract import errors

    for name in dir(errors):
        kind = getattr(errors, name)
        if isinstance(kind, type) and issubclass(kind, errors.KVRefError):
            error = kind.__new__(kind)
            errors.KVRefError.__init__(error, "ERR-502", f"a {name}")
            error.extra = 7  # type: ignore[attr-defined]
            back = pickle.loads(pickle.dumps(error))
            assert type(back) is kind and back.rule == "ERR-502" and str(back) == str(error), name
            assert back.extra == 7, f"{name} lost its fields on the way"  # type: ignore[attr-defined]
