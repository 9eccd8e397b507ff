"""The longest prefix a request can take from the device and the tiers below it (TIER-1125)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvref.contract.errors import InvalidValueError
from kvref.contract.tiers import TierStore, as_tier_keys
from kvref.contract.validate import as_count

__all__ = ["TieredPrefix", "tiered_prefix"]


@dataclass(frozen=True, slots=True)
class TieredPrefix:
    """``length`` leading keys can be served: ``device`` of them from the device, ``per_tier[i]`` from tier ``i``."""

    length: int
    device: int
    per_tier: tuple[int, ...]


def tiered_prefix(keys: object, device_hits: object, tiers: Sequence[TierStore]) -> TieredPrefix | None:
    """The leading keys the device and ``tiers`` can serve, or None while a pending store decides it (TIER-1125).

    The first ``device_hits`` keys are cached on the device; each later key is served by the first
    tier listed that has it ready. The prefix ends at the first key no tier has; a key before that
    which some tier has pending and none has ready makes the answer None (retry when the store
    completes), as vLLM's connector defers such a lookup. Lookups are not uses (TIER-1103).
    """
    named = as_tier_keys(keys, op="tiered_prefix")
    on_device = as_count(device_hits, op="tiered_prefix", arg="device_hits", rule="TIER-1125")
    if on_device > len(named):
        raise InvalidValueError("TIER-1125", f"tiered_prefix: device_hits {on_device} exceeds the {len(named)} keys")
    per_tier = [0] * len(tiers)
    length = on_device
    deferred = False
    for key in named[on_device:]:
        answers = [tier.lookup(key) for tier in tiers]
        if "hit" in answers:
            per_tier[answers.index("hit")] += 1
        elif "pending" in answers:
            deferred = True
        else:
            break
        length += 1
    if deferred:
        return None
    return TieredPrefix(length, on_device, tuple(per_tier))
