"""Tiers below the device in the serving replay (TIER-1126..TIER-1130): stores, loads, their times, the crossover.

:class:`TierCascade` holds one oracle tier store per ``--tier`` and answers the serving replay's
three questions: which blocks after a request's device hit the tiers serve and how long loading
them takes (:meth:`TierCascade.plan_load`), what to store when a step computes blocks (each into
the first tier, each block a tier evicts into the next, :meth:`TierCascade.store`), and what was
measured (:meth:`TierCascade.report`: per tier, requests and tokens served, loads that beat
recomputing and loads that lost, and the crossover).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvref.contract.errors import InvalidValueError
from kvref.oracle.tiers import OracleTierStore
from kvref.simulation.serving.model import MAX_COST_MS

__all__ = [
    "DEFAULT_KV_BYTES_PER_TOKEN",
    "TierCascade",
    "TierLine",
    "TierLoad",
    "TierReport",
    "TierSpec",
    "check_tier_names",
]

#: One token's K and V in an 8B Llama-style model: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes.
DEFAULT_KV_BYTES_PER_TOKEN = 131_072


@dataclass(frozen=True)
class TierSpec:
    """One tier: its name, slots (blocks), bandwidth in GB/s (10**9 bytes) and fixed latency per load in ms."""

    name: str
    blocks: int
    gbps: float
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise InvalidValueError("TIER-1130", f"--tier: a tier needs a name without ':', got {self.name!r}")
        if type(self.blocks) is not int or self.blocks < 1:
            raise InvalidValueError(
                "TIER-1130", f"--tier {self.name}: blocks must be a positive integer, got {self.blocks!r}"
            )
        for what, value, low, high in (
            ("bandwidth (GB/s)", self.gbps, 1e-6, 1e6),
            ("latency (ms)", self.latency_ms, 0.0, MAX_COST_MS),
        ):
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or not low <= value <= high:
                raise InvalidValueError(
                    "TIER-1130", f"--tier {self.name}: {what} must be a number from {low:g} to {high:g}, got {value!r}"
                )

    @classmethod
    def parse_sweep(cls, text: str) -> tuple[TierSpec, ...]:
        """``NAME:BLOCKS[,BLOCKS...]:GBPS[:LATENCY_MS]``: one tier per size given, for a sweep (TIER-1130)."""
        parts = text.split(":")
        if len(parts) < 2 or "," not in parts[1]:
            return (cls.parse(text),)
        sizes = parts[1].split(",")
        if len(set(sizes)) != len(sizes):
            raise InvalidValueError("TIER-1130", f"--tier {text!r}: a size is given twice")
        return tuple(cls.parse(":".join([parts[0], size, *parts[2:]])) for size in sizes)

    @classmethod
    def parse(cls, text: str) -> TierSpec:
        """``NAME:BLOCKS:GBPS[:LATENCY_MS]``, as ``--tier`` takes it (TIER-1130)."""
        parts = text.split(":")
        if len(parts) not in (3, 4) or not text.isascii():
            raise InvalidValueError(
                "TIER-1130", f"--tier {text!r}: expected NAME:BLOCKS:GBPS[:LATENCY_MS], e.g. host:20000:25:0.05"
            )
        name, blocks, gbps, *latency = parts
        try:
            return cls(name, int(blocks), float(gbps), float(latency[0]) if latency else 0.0)
        except ValueError as exc:
            if isinstance(exc, InvalidValueError):
                raise
            raise InvalidValueError(
                "TIER-1130", f"--tier {text!r}: BLOCKS must be an integer, GBPS and LATENCY_MS numbers"
            ) from None


@dataclass(frozen=True)
class TierLoad:
    """What a request loads: its keys from each tier (first tier first) and how long it takes, in microseconds."""

    keys: tuple[tuple[int, ...], ...]
    load_us: int
    recompute_us: int

    @property
    def blocks(self) -> int:
        """Blocks loaded from every tier together."""
        return sum(len(keys) for keys in self.keys)


@dataclass(frozen=True)
class TierLine:
    """One tier's share of a replay (TIER-1129); ``crossover_blocks`` is None where a load never pays."""

    name: str
    blocks: int
    gbps: float
    latency_ms: float
    requests: int
    tokens: int
    helped: int
    hurt: int
    load_ms: float
    stores: int
    evictions: int
    crossover_blocks: int | None
    load_ms_per_block: float
    recompute_ms_per_block: float


@dataclass(frozen=True)
class TierReport:
    """The tiers of a serving replay (TIER-1129): one line per tier and the bytes of a token."""

    kv_bytes_per_token: int
    lines: tuple[TierLine, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TierReport:
        """The report ``dataclasses.asdict`` wrote."""
        return cls(int(data["kv_bytes_per_token"]), tuple(TierLine(**line) for line in data["lines"]))


def check_tier_names(specs: Sequence[TierSpec]) -> None:
    """Refuse two tiers of one name (TIER-1130): the report names each tier."""
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise InvalidValueError("TIER-1130", f"--tier: each tier needs its own name, got {names}")


class TierCascade:
    """The tiers below one serving replay's device pool, first tier first (TIER-1126..TIER-1129)."""

    def __init__(
        self, specs: Sequence[TierSpec], *, block_size: int, kv_bytes_per_token: int, prefill_ms_per_token: float
    ) -> None:
        check_tier_names(specs)
        if type(kv_bytes_per_token) is not int or kv_bytes_per_token < 1:
            raise InvalidValueError(
                "TIER-1130", f"--kv-bytes-per-token must be a positive integer, got {kv_bytes_per_token!r}"
            )
        self.specs = tuple(specs)
        self.stores = [OracleTierStore(spec.blocks, policy="lru", medium=spec.name) for spec in specs]
        self.block_size = block_size
        self.kv_bytes_per_token = kv_bytes_per_token
        block_bytes = kv_bytes_per_token * block_size
        #: microseconds to move one block from each tier, and to recompute one block
        self.block_us = [block_bytes / (spec.gbps * 1e9) * 1e6 for spec in specs]
        self.recompute_block_us = prefill_ms_per_token * 1000 * block_size
        count = len(specs)
        self._requests = [0] * count
        self._tokens = [0] * count
        self._helped = [0] * count
        self._hurt = [0] * count
        self._load_us = [0.0] * count
        self._stores = [0] * count
        self._evictions = [0] * count

    def plan_load(self, keys: Sequence[int], device_blocks: int) -> TierLoad | None:
        """The blocks after the ``device_blocks`` hit that the tiers serve, each from the first tier with it
        ready, until the first key no tier has ready; None when they serve none (TIER-1127, TIER-1128)."""
        per_tier: list[list[int]] = [[] for _ in self.stores]
        for key in keys[device_blocks:]:
            tier = next((i for i, store in enumerate(self.stores) if store.lookup(key) == "hit"), None)
            if tier is None:
                break
            per_tier[tier].append(key)
        blocks = sum(len(k) for k in per_tier)
        if not blocks:
            return None
        load = sum(
            spec.latency_ms * 1000 + len(k) * us
            for spec, k, us in zip(self.specs, per_tier, self.block_us, strict=True)
            if k
        )
        return TierLoad(tuple(tuple(k) for k in per_tier), math.ceil(load), math.ceil(blocks * self.recompute_block_us))

    def start_load(self, request: str, load: TierLoad, *, counted: bool = True) -> None:
        """Pin the load's keys in their tiers and, for a ``counted`` request (not in the warm-up), count
        what each tier serves (TIER-1128, TIER-1129)."""
        for i, (store, keys) in enumerate(zip(self.stores, load.keys, strict=True)):
            if keys:
                store.prepare_load(list(keys), request=request)
                if not counted:
                    continue
                part_us = self.specs[i].latency_ms * 1000 + len(keys) * self.block_us[i]
                helped = part_us < len(keys) * self.recompute_block_us  # this tier's part against its recompute
                self._requests[i] += 1
                self._tokens[i] += len(keys) * self.block_size
                self._helped[i] += helped
                self._hurt[i] += not helped
                self._load_us[i] += part_us

    def end_load(self, request: str, load: TierLoad) -> None:
        """The load has ended: its keys are unpinned (TIER-1128)."""
        for store, keys in zip(self.stores, load.keys, strict=True):
            if keys:
                store.complete_load(list(keys), request=request)

    def store(self, request: str, keys: Sequence[int]) -> None:
        """Store computed blocks into the first tier, and what each tier evicts into the next (TIER-1126)."""
        moving = list(keys)
        for i, store in enumerate(self.stores):
            if not moving:
                return
            plan = store.prepare_store(moving, request=request)
            if plan is None:  # every slot pinned: the blocks are not stored (vLLM skips such a store)
                return
            store.complete_store(list(plan.keys), request=request)
            self._stores[i] += len(plan.keys)
            self._evictions[i] += len(plan.evicted)
            moving = list(plan.evicted)

    def finish(self, request: str) -> None:
        """The request ended: its uses reach each tier's policy (TIER-1116)."""
        for store in self.stores:
            store.finish_request(request)

    def crossover(self, tier: int) -> int | None:
        """The fewest blocks from which loading them from ``tier`` alone beats recomputing them (TIER-1129)."""
        gain = self.recompute_block_us - self.block_us[tier]
        if gain <= 0:
            return None
        return math.floor(self.specs[tier].latency_ms * 1000 / gain) + 1

    def report(self) -> TierReport:
        """What the replay's tiers served (TIER-1129)."""
        lines = tuple(
            TierLine(
                name=spec.name,
                blocks=spec.blocks,
                gbps=spec.gbps,
                latency_ms=spec.latency_ms,
                requests=self._requests[i],
                tokens=self._tokens[i],
                helped=self._helped[i],
                hurt=self._hurt[i],
                load_ms=self._load_us[i] / 1000,
                stores=self._stores[i],
                evictions=self._evictions[i],
                crossover_blocks=self.crossover(i),
                load_ms_per_block=self.block_us[i] / 1000,
                recompute_ms_per_block=self.recompute_block_us / 1000,
            )
            for i, spec in enumerate(self.specs)
        )
        return TierReport(self.kv_bytes_per_token, lines)
