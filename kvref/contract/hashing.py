"""Block hashing: chained, canonical, tagged (spec chapter 02, HASH-2xx).

A block's hash is ``H(encode(parent, tokens, extra_keys))``: ``parent`` is the previous block's
hash or :data:`ROOT_HASH` for the first block (HASH-202), ``encode`` is canonical CBOR of a fixed
shape (HASH-203), and the extra keys are a map from fixed integer tags to values, so an adapter
name can never be read as a cache salt or a multimodal identifier (HASH-205). Only full blocks
are hashed (HASH-201). The default ``sha256`` is stable across processes, machines and Python
versions (HASH-206); ``xxh3_64`` is a faster non-cryptographic option (HASH-208). Hash values are
63-bit non-negative integers (HASH-207).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import cbor2
import xxhash

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.validate import HASH_MAX, IntsLike, as_count, as_hash, as_int, as_list

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "EXTRA_KEY_TAGS",
    "ROOT_HASH",
    "BlockExtraKeys",
    "BlockHasher",
    "MultimodalItem",
    "block_extra_keys",
    "encode_block",
    "hash_block",
    "hash_group_key",
    "hash_token_blocks",
]

_MASK63 = HASH_MAX - 1

#: CBOR map tags of the extra keys (HASH-205). Never renumbered: a new field gets a new tag.
EXTRA_KEY_TAGS = {"adapter": 1, "cache_salt": 2, "multimodal": 3}


def _sha256(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") & _MASK63


def _xxh3_64(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data) & _MASK63


#: Digest functions by name. Each maps bytes to an int in ``[0, 2**63)``.
ALGORITHMS: dict[str, Callable[[bytes], int]] = {"sha256": _sha256, "xxh3_64": _xxh3_64}
DEFAULT_ALGORITHM = "sha256"

#: The fixed root of every hash chain (HASH-202): SHA-256 of a constant, never random.
ROOT_HASH: int = _sha256(b"kvref/root-hash/v1")


@dataclass(frozen=True, slots=True)
class MultimodalItem:
    """A multimodal input occupying ``length`` token positions from ``start`` in a request.

    ``identifier`` is the item's content hash or any string that names its content.
    """

    identifier: str
    start: int
    length: int

    def __post_init__(self) -> None:
        if not isinstance(self.identifier, str):
            raise InvalidTypeError("HASH-205", "MultimodalItem.identifier must be a str")
        if not self.identifier:
            raise InvalidValueError("HASH-205", "MultimodalItem.identifier must not be empty")
        as_count(self.start, op="MultimodalItem", arg="start")
        if as_count(self.length, op="MultimodalItem", arg="length") == 0:
            raise InvalidValueError("HASH-205", "MultimodalItem.length must be >= 1")


@dataclass(frozen=True, slots=True)
class BlockExtraKeys:
    """The extra keys of one block (HASH-204, HASH-205).

    ``adapter``: the adapter (LoRA) identity, on every block of an adapted request.
    ``cache_salt``: isolates tenants; only the first block of a request carries it.
    ``multimodal``: ``(identifier, offset)`` for each multimodal item that overlaps the block,
    ``offset`` being the item's start relative to the block's first token (may be negative).
    """

    adapter: str | int | None = None
    cache_salt: str | None = None
    multimodal: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        _check_adapter_and_salt(self.adapter, self.cache_salt, "BlockExtraKeys")
        if not isinstance(self.multimodal, tuple):
            raise InvalidTypeError("HASH-205", "BlockExtraKeys.multimodal must be a tuple of (str, int) pairs")
        for pair in self.multimodal:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or type(pair[1]) is not int
            ):
                raise InvalidTypeError("HASH-205", f"BlockExtraKeys.multimodal entry {pair!r} is not (str, int)")

    def is_empty(self) -> bool:
        """True when the block has no extra key at all."""
        return self.adapter is None and self.cache_salt is None and not self.multimodal

    def to_cbor_map(self) -> dict[int, object]:
        """The tagged map that enters the canonical encoding; absent fields are left out."""
        out: dict[int, object] = {}
        if self.adapter is not None:
            out[EXTRA_KEY_TAGS["adapter"]] = self.adapter
        if self.cache_salt is not None:
            out[EXTRA_KEY_TAGS["cache_salt"]] = self.cache_salt
        if self.multimodal:
            out[EXTRA_KEY_TAGS["multimodal"]] = [[ident, off] for ident, off in self.multimodal]
        return out


def _check_adapter_and_salt(adapter: object, salt: object, op: str) -> None:
    if adapter is not None and (isinstance(adapter, bool) or not isinstance(adapter, (str, int))):
        raise InvalidTypeError("HASH-205", f"{op}: adapter must be a str or int, got {type(adapter).__name__}")
    if salt is not None and not isinstance(salt, str):
        raise InvalidTypeError("HASH-205", f"{op}: cache_salt must be a str, got {type(salt).__name__}")


def _digest_of(algorithm: object, op: str) -> Callable[[bytes], int]:
    digest = ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None
    if digest is None:
        raise InvalidValueError("HASH-209", f"{op}: unknown algorithm {algorithm!r}; known: {sorted(ALGORITHMS)}")
    return digest


def _check_tokens(tokens: object, op: str) -> list[int]:
    try:
        out = list(as_list(tokens, op=op, arg="tokens"))
    except InvalidTypeError:
        raise InvalidTypeError("HASH-203", f"{op}: tokens must be a sequence of ints") from None
    if not set(map(type, out)) <= {int}:  # exact ints, looked at in C; others are converted one by one
        out = [as_int(t, op=op, arg="token") for t in out]
    if out and min(out) < 0:
        raise InvalidValueError("HASH-203", f"{op}: token ids must be >= 0, got {min(out)}")
    return out


def _encode(parent: int, tokens: list[int], extras: dict[int, object]) -> bytes:
    # Every item is an int, a text string, a list or an int-keyed map built in ascending key
    # order, for which cbor2's default encoding already is the core deterministic one (minimal
    # ints, definite lengths, sorted keys); tests check it against canonical=True.
    return cbor2.dumps([parent, tokens, extras])


def encode_block(parent: int, tokens: Sequence[int], extra: BlockExtraKeys | None = None) -> bytes:
    """Canonical bytes of one block: CBOR ``[parent, [tokens...], {tag: value}]`` (HASH-203)."""
    parent = as_hash(parent, op="encode_block", arg="parent")
    toks = _check_tokens(tokens, "encode_block")
    if not toks:
        raise InvalidValueError("HASH-201", "encode_block: a block has at least one token")
    if extra is not None and not isinstance(extra, BlockExtraKeys):
        raise InvalidTypeError("HASH-205", f"encode_block: extra must be BlockExtraKeys, got {type(extra).__name__}")
    extras = extra.to_cbor_map() if extra is not None else {}
    return _encode(parent, toks, extras)


def hash_block(
    parent: int,
    tokens: Sequence[int],
    extra: BlockExtraKeys | None = None,
    *,
    algorithm: str = DEFAULT_ALGORITHM,
) -> int:
    """Hash one full block chained on ``parent`` (:data:`ROOT_HASH` for the first block)."""
    digest = _digest_of(algorithm, "hash_block")
    return digest(encode_block(parent, tokens, extra))


def hash_group_key(block_hash: int, group: int, *, algorithm: str = DEFAULT_ALGORITHM) -> int:
    """The key a block of hash ``block_hash`` is cached under in KV cache group ``group`` >= 1 (REQ-733):
    the digest of the CBOR array ``[block_hash, group]``. Two items where every block's encoding has
    three (HASH-203), so no group key is ever the hash of a block: with one-token blocks,
    ``hash_block(h, [g])`` would be the hash of the block after ``h`` holding token ``g``."""
    parent = as_hash(block_hash, op="hash_group_key", arg="block_hash")
    index = as_int(group, op="hash_group_key", arg="group")
    if index < 1:
        raise InvalidValueError(
            "REQ-733", f"hash_group_key: group must be >= 1 (group 0 keys by the hash), got {index}"
        )
    return _digest_of(algorithm, "hash_group_key")(cbor2.dumps([parent, index]))


def block_extra_keys(
    block_index: int,
    block_size: int,
    *,
    adapter: str | int | None = None,
    cache_salt: str | None = None,
    multimodal: Sequence[MultimodalItem] = (),
) -> BlockExtraKeys:
    """The extra keys of block ``block_index`` of a request (HASH-204, HASH-205)."""
    start = block_index * block_size
    end = start + block_size
    overlapping = sorted(
        (item for item in multimodal if item.start < end and item.start + item.length > start),
        key=lambda item: (item.start, item.identifier),
    )
    mm = tuple((item.identifier, item.start - start) for item in overlapping)
    return BlockExtraKeys(adapter=adapter, cache_salt=cache_salt if block_index == 0 else None, multimodal=mm)


def hash_token_blocks(
    token_ids: IntsLike,
    block_size: int,
    *,
    adapter: str | int | None = None,
    cache_salt: str | None = None,
    multimodal: Iterable[MultimodalItem] = (),
    algorithm: str = DEFAULT_ALGORITHM,
) -> list[int]:
    """Hashes of the full blocks of a request's tokens; a trailing partial block gets none."""
    hasher = BlockHasher(
        block_size,
        adapter=adapter,
        cache_salt=cache_salt,
        multimodal=multimodal,
        algorithm=algorithm,
    )
    return hasher.extend(token_ids)


class BlockHasher:
    """Incremental hashing of one request whose tokens arrive over time (decode, chat turns).

    ``extend(tokens)`` appends tokens and returns the hashes of the blocks that became full;
    ``hashes`` holds every full block's hash so far. Equal inputs give equal hashes to
    :func:`hash_token_blocks`, however the tokens were split across calls.
    """

    def __init__(
        self,
        block_size: int,
        *,
        adapter: str | int | None = None,
        cache_salt: str | None = None,
        multimodal: Iterable[MultimodalItem] = (),
        algorithm: str = DEFAULT_ALGORITHM,
    ) -> None:
        size = as_count(block_size, op="BlockHasher", arg="block_size")
        if size == 0:
            raise InvalidValueError("HASH-201", "BlockHasher: block_size must be >= 1")
        _digest_of(algorithm, "BlockHasher")
        _check_adapter_and_salt(adapter, cache_salt, "BlockHasher")
        if isinstance(multimodal, (MultimodalItem, str)) or multimodal is None:
            raise InvalidTypeError("HASH-205", "BlockHasher: multimodal must be a sequence of MultimodalItem")
        items = tuple(multimodal)
        for item in items:
            if not isinstance(item, MultimodalItem):
                raise InvalidTypeError("HASH-205", "BlockHasher: multimodal items must be MultimodalItem")
        self.block_size = size
        self.algorithm = algorithm
        self._adapter = adapter
        self._salt = cache_salt
        self._mm = items
        self._has_extras = adapter is not None or cache_salt is not None or bool(self._mm)
        self._pending: list[int] = []
        self.hashes: list[int] = []

    def resume(self, hashes: list[int], pending: list[int]) -> BlockHasher:
        """Take ``hashes`` as the full blocks already hashed and ``pending`` as the tokens after them; return self.

        For a request whose prompt is known only by its blocks' names (a trace's block ids,
        TRACE-1038): later tokens chain from the last of ``hashes`` exactly as if this hasher had
        hashed those blocks itself (HASH-201). Only a hasher that has seen no token may resume;
        ``hashes`` are taken as given (the caller checks them) and ``pending`` must hold fewer
        than ``block_size`` tokens.
        """
        if self.hashes or self._pending:
            raise InvalidValueError("HASH-201", "BlockHasher.resume: this hasher has already hashed tokens")
        if len(pending) >= self.block_size:
            raise InvalidValueError(
                "HASH-201", f"BlockHasher.resume: {len(pending)} pending tokens fill a block of {self.block_size}"
            )
        self._pending = _check_tokens(pending, "BlockHasher.resume")
        self.hashes = list(hashes)
        return self

    def extend(self, tokens: IntsLike) -> list[int]:
        """Append tokens; return the hashes of the blocks they completed (HASH-201)."""
        return self.extend_checked(_check_tokens(tokens, "BlockHasher.extend"))

    def extend_checked(self, tokens: list[int]) -> list[int]:
        """``extend`` for tokens already checked: a list of non-negative ints (a caller's own checks, REQ-702)."""
        pending = self._pending
        pending.extend(tokens)
        size = self.block_size
        full = len(pending) // size
        if not full:
            return []
        digest = ALGORITHMS[self.algorithm]
        new: list[int] = []
        parent = self.hashes[-1] if self.hashes else ROOT_HASH
        for k in range(full):
            index = len(self.hashes)
            extras = (
                block_extra_keys(
                    index, size, adapter=self._adapter, cache_salt=self._salt, multimodal=self._mm
                ).to_cbor_map()
                if self._has_extras
                else {}
            )
            parent = digest(_encode(parent, pending[k * size : (k + 1) * size], extras))
            self.hashes.append(parent)
            new.append(parent)
        del pending[: full * size]
        return new
