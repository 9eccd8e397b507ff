"""The machine's steps at scale: pools of hundreds to thousands of blocks, filled in a few calls.

A pool of a handful of blocks never reaches what depends on size: the free stack wrapping around
after thousands of blocks came and went, a prefix index growing past its first table and rebuilt
after mass evictions, eviction windows over long orders, one allocation evicting hundreds of
blocks. These steps take a share of the pool at once (a tenth to nearly all of it) and run
requests of as many blocks along one of two long chains, so that a request hits what an earlier
one cached. The machine that has them draws its pool from :data:`LARGE_SIZES`.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from kvref.contract.hashing import ROOT_HASH, hash_block
from kvref_conformance.machines.cache_steps import CacheSteps
from kvref_conformance.machines.core import holders_st
from kvref_conformance.machines.pool_steps import PoolSteps

__all__ = ["LARGE_RULES", "LARGE_SIZES", "LargeSteps", "long_chain_hashes"]

#: The pool sizes of the machine with these steps: two orders of magnitude above the others'.
LARGE_SIZES = (300, 3000)

#: The share of the pool one step takes.
shares_st = st.sampled_from([0.1, 0.3, 0.6, 0.95])
#: Which of the two long chains a request runs: the second request of one is a hit along it.
long_chains_st = st.integers(0, 1)
#: The first token of long chain ``i`` is ``LONG_FIRST_TOKEN + i``: the short chains use 0..2 only.
LONG_FIRST_TOKEN = 1_000

_LONG_HASHES: dict[int, list[int]] = {}


def long_chain_hashes(chain: int, n: int) -> list[int]:
    """The first ``n`` block hashes of long chain ``chain``: block ``i`` holds token ``i`` after the
    chain's first token, each hash chained on the one before it (built once, extended as needed)."""
    hashes = _LONG_HASHES.setdefault(chain, [])
    while len(hashes) < n:
        i = len(hashes)
        parent, token = (ROOT_HASH, LONG_FIRST_TOKEN + chain) if i == 0 else (hashes[-1], i)
        hashes.append(hash_block(parent, [token], algorithm="xxh3_64"))
    return hashes[:n]


class LargeSteps(PoolSteps, CacheSteps):
    """Steps that take a share of the pool at once: an allocation, and a request of a long chain."""

    @rule(holder=holders_st, share=shares_st)
    def allocate_a_share_of_the_pool(self, holder: object, share: float) -> None:
        """One allocation of a share of what is available: evicts hundreds of cached blocks at once
        when the free stack runs short (EVICT-408), and wraps the free stack around."""
        self.tick()
        self.allocate_for(holder, max(1, int(share * self.oracle.num_available)))

    @rule(holder=holders_st, chain=long_chains_st, share=shares_st)
    def run_a_long_request(self, holder: object, chain: int, share: float) -> None:
        """A request of a share of the pool's blocks along one long chain: its cached prefix is a hit,
        the rest is allocated and registered, thousands of hashes in a large pool (PFX-307)."""
        self.tick()
        n = max(1, int(share * self.oracle.num_usable))
        contents = [(LONG_FIRST_TOKEN + chain, i) for i in range(n)]
        self.serve(holder, long_chain_hashes(chain, n), contents, f"long chain {chain} of {n} blocks")


#: The large machine's own rules, removed from every other machine.
LARGE_RULES = ("allocate_a_share_of_the_pool", "run_a_long_request")
