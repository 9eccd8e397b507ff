"""Chapter 02, block hashing, for implementations that hash tokens themselves (``hashing``)."""

from __future__ import annotations

import random
from typing import Any

from kvref.contract.hashing import MultimodalItem
from kvref_conformance.suites.base import ConformanceSuite, first_policy, requires, rule
from kvref_conformance.target import Target

__all__ = ["HashingSuite"]

TOKENS = list(range(100, 148))  # three blocks of 16


@requires("hashing")
class HashingSuite(ConformanceSuite):
    """Rules of chapter 02, checked on the implementation's own ``hash_blocks``."""

    @staticmethod
    def hashes(impl: Target, tokens: list[int] = TOKENS, block_size: int = 16, **extra: Any) -> list[int]:
        pool = impl.create(4, policy=first_policy(impl))  # the policy does not matter to a hash
        result: list[int] = pool.hash_blocks(tokens, block_size, **extra)
        return result

    @rule("HASH-201")
    def test_only_full_blocks_get_a_hash(self, impl: Target) -> None:
        assert len(self.hashes(impl, TOKENS[:47])) == 2, "47 tokens in blocks of 16 are two full blocks"
        assert self.hashes(impl, TOKENS[:15]) == []

    @rule("HASH-202")
    def test_a_change_in_an_early_block_changes_every_later_hash(self, impl: Target) -> None:
        base = self.hashes(impl)
        changed = self.hashes(impl, [7, *TOKENS[1:]])
        assert all(x != y for x, y in zip(base, changed, strict=True)), f"{base} vs {changed}: hashes are not chained"
        assert self.hashes(impl, TOKENS[:32]) == base[:2], "a block's hash must not depend on later blocks"

    @rule("HASH-204")
    def test_the_cache_salt_isolates_the_whole_chain(self, impl: Target) -> None:
        base, salted = self.hashes(impl), self.hashes(impl, cache_salt="tenant-1")
        assert all(x != y for x, y in zip(base, salted, strict=True))
        assert self.hashes(impl, cache_salt="tenant-1") == salted

    @rule("HASH-205")
    def test_an_adapter_named_like_a_salt_or_an_image_never_collides(self, impl: Target) -> None:
        adapter = self.hashes(impl, adapter="x")[0]
        salt = self.hashes(impl, cache_salt="x")[0]
        image = self.hashes(impl, multimodal=[MultimodalItem("x", 0, 4)])[0]
        assert len({adapter, salt, image}) == 3, (
            f"[HASH-205] adapter 'x', cache salt 'x' and image 'x' hash alike: {adapter:#x}, {salt:#x}, {image:#x}"
        )

    @rule("HASH-206", "HASH-207")
    def test_hashes_are_deterministic_and_63_bit(self, impl: Target) -> None:
        first, second = self.hashes(impl), self.hashes(impl)
        assert first == second, "the same tokens hashed twice give different hashes"
        assert all(0 <= h < 2**63 for h in first)

    @rule("HASH-212")
    def test_distinct_blocks_of_small_token_ids_never_share_a_hash_and_every_bit_varies(self, impl: Target) -> None:
        draw = random.Random(212)
        blocks = sorted(
            {tuple(draw.randrange(32) for _ in range(4)) for _ in range(3000)}
        )  # small ids fold a weak hash
        firsts = [self.hashes(impl, list(block), block_size=4)[0] for block in blocks]
        chain = self.hashes(impl, [t for block in blocks for t in block], block_size=4)
        for name, found in (("first blocks", firsts), ("blocks of one chain", chain)):
            assert len(set(found)) == len(found), (
                f"[HASH-212] {len(found) - len(set(found))} of {len(found)} distinct {name} share a hash"
            )
            both = [bit for bit in range(63) if 0 < sum(h >> bit & 1 for h in found) < len(found)]
            assert len(both) == 63, (
                f"[HASH-212] bits {sorted(set(range(63)) - set(both))} of the {name}' hashes never vary"
            )

    @rule("HASH-210", "HASH-211")
    def test_images_and_adapters_enter_the_blocks_they_belong_to(self, impl: Target) -> None:
        base = self.hashes(impl)
        image = self.hashes(impl, multimodal=[MultimodalItem("img", 20, 4)])
        assert image[0] == base[0] and image[1] != base[1], "an image in block 1 must change block 1, not block 0"
        moved = self.hashes(impl, multimodal=[MultimodalItem("img", 21, 4)])
        assert moved[1] != image[1], "the same image at another offset must hash differently"
        assert self.hashes(impl, adapter="lora")[0] != base[0]
