"""Stateful models: every step goes to the implementation and to the oracle, side by side.

:func:`make_machine` builds a Hypothesis ``RuleBasedStateMachine`` for one target and policy.
Block ids are implementation-defined, so the machine keeps a renaming: ids that allocate returns
on both sides are paired by position, and a prefix hit on the implementation is followed on the
oracle (its ``prefer`` hook), since which copy of a hash a lookup returns is the implementation's
choice (PFX-308). A target with the ``exact-order`` profile must return the oracle's very ids.

After every step it checks conservation, no id twice, reference count = holders, generations,
cached set and events (replaying the events gives the resident hashes), statistics, prefix
closure where the policy promises it, and the implementation's own ``check_invariants``. A shadow
KV store records what each block holds; every hit must return blocks holding exactly the
requested prefix, so a stale or wrong hit fails the step it happens in. Every assertion message
starts with the id of the rule it checks.

The machine is assembled from one module per concern: :mod:`.core` (side-by-side calls, renaming,
shadow store), :mod:`.pool_steps`, :mod:`.cache_steps`, :mod:`.targeted_steps`, :mod:`.large_steps`
and :mod:`.observations`.
"""

from __future__ import annotations

from typing import Any

from kvref_conformance.machines.core import STEP_COUNTS, STEP_SECONDS, chain_hash, chain_hashes
from kvref_conformance.machines.large_steps import LARGE_RULES, LARGE_SIZES, LargeSteps
from kvref_conformance.machines.observations import Observations
from kvref_conformance.machines.targeted_steps import TARGETED_RULES, TargetedSteps
from kvref_conformance.target import Target

__all__ = ["STEP_COUNTS", "STEP_SECONDS", "DifferentialMachine", "chain_hash", "chain_hashes", "make_machine"]

#: Rules removed when the target or the machine leaves the prefix cache, or the batches, out.
CACHE_RULES = (
    "run_request",
    "reset",
    "lookup_is_pure_and_honest",
    "register_a_second_copy",
    "reoffer_a_hit_for_registration",
    "match_batch",
)
#: The batch machine's own rules; the caller-side rules of the targeted steps (a list written
#: over, a hit offered again, one chain matched by several holders in one call) live there too, so
#: the pool and cache machines draw exactly what they drew before (their known deviations are
#: found by those draws under the ci profile).
BATCH_RULES = (
    "allocate_batch",
    "free_batch",
    "match_batch",
    "scribble_on_a_returned_list",
    "reoffer_a_hit_for_registration",
)


class DifferentialMachine(TargetedSteps, LargeSteps, Observations):
    """The machine; :func:`make_machine` binds ``target``, ``policy`` and the features in play."""


def make_machine(
    target: Target,
    policy: str,
    *,
    cache: bool = True,
    batches: bool = False,
    targeted: bool = False,
    large: bool = False,
) -> type[DifferentialMachine]:
    """A machine class driving ``target`` under ``policy`` beside the oracle.

    ``cache=False`` leaves the prefix cache out (the pool alone); ``batches=True`` adds the
    batched forms to the steps; ``targeted=True`` adds the steps that make the situations random steps
    rarely reach on purpose (:mod:`.targeted_steps`), with the batched forms where the target has them;
    ``large=True`` draws pools of hundreds to thousands of blocks and adds the steps that take a share
    of the pool at once (:mod:`.large_steps`).
    """
    batches = batches or targeted
    kind = "large" if large else "targeted" if targeted else "batch" if batches else "cache" if cache else "pool"
    name = f"{target.name}:{kind}[{policy}]"
    attrs: dict[str, Any] = {
        "target": target,
        "policy": policy,
        "name": name,
        "use_cache": cache,
        "use_batches": batches,
    }
    # Rules of features left out are removed, not guarded: Hypothesis then never draws them.
    if not (cache and target.has("prefix-cache")):
        attrs.update(dict.fromkeys(CACHE_RULES))
    if not (batches and target.has("batching")):
        attrs.update(dict.fromkeys(BATCH_RULES))
    if not targeted:
        attrs.update(dict.fromkeys(TARGETED_RULES))
    if large:
        attrs["sizes"] = LARGE_SIZES
    else:
        attrs.update(dict.fromkeys(LARGE_RULES))
    if not target.has("pause"):
        attrs["toggle_pause"] = None
        attrs["a_paused_holder_calls_each_operation"] = None
    return type(f"Differential_{kind}_{policy.replace('-', '_')}", (DifferentialMachine,), attrs)
