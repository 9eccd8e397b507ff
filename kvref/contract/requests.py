"""A request as the request-level manager sees it (spec chapter 07, REQ-702).

A :class:`Request` carries its id, its tokens (the prompt, then the output appended so far), its
extra keys and the chapter 02 hashes of its full blocks, kept up to date as tokens are appended
(REQ-702). ``num_computed_tokens``, ``status`` and ``num_preemptions`` belong to the scheduler:
it sets them, the manager reads them (and :meth:`RequestManager.preempt` does what a scheduler's
preemption does to them, REQ-714).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.hashing import DEFAULT_ALGORITHM, BlockExtraKeys, BlockHasher, MultimodalItem, block_extra_keys
from kvref.contract.validate import IntsLike, as_count, as_hash_list, as_int, as_list

__all__ = ["Request", "RequestStatus"]


class RequestStatus(StrEnum):
    """Where a request is in its life, as the scheduler keeps it."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


def _tokens(values: object, *, op: str, arg: str) -> list[int]:
    if type(values) is list and set(map(type, values)) <= {int} and (not values or min(values) >= 0):
        return list(values)  # exact ints, none negative, looked at in C
    out = [as_int(t, op=op, arg=arg, rule="REQ-702") for t in as_list(values, op=op, arg=arg)]
    if out and min(out) < 0:
        raise InvalidValueError("REQ-702", f"{op}: token ids must be >= 0, got {min(out)}")
    return out


class Request:
    """One request: tokens, extra keys and the hashes of its full blocks of ``block_size`` (REQ-702).

    ``prompt_token_ids`` must hold at least one token. ``adapter``, ``cache_salt`` and
    ``multimodal`` enter the hashes as chapter 02's extra keys (HASH-204, HASH-205);
    ``skip_reading_prefix_cache`` makes ``get_computed_blocks`` find nothing (REQ-704), as vLLM
    does for a request that wants prompt logprobs. ``algorithm`` is chapter 02's digest.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: IntsLike,
        *,
        block_size: int,
        adapter: str | int | None = None,
        cache_salt: str | None = None,
        multimodal: Iterable[MultimodalItem] = (),
        skip_reading_prefix_cache: bool = False,
        algorithm: str = DEFAULT_ALGORITHM,
    ) -> None:
        if not isinstance(request_id, str):
            raise InvalidTypeError("REQ-702", f"Request: request_id must be a str, got {type(request_id).__name__}")
        if not request_id:
            raise InvalidValueError("REQ-702", "Request: request_id must not be empty")
        prompt = _tokens(prompt_token_ids, op="Request", arg="prompt_token_ids")
        if not prompt:
            raise InvalidValueError("REQ-702", f"Request {request_id!r}: the prompt must hold at least one token")
        size = as_count(block_size, op="Request", arg="block_size")
        if size == 0:
            raise InvalidValueError("REQ-702", f"Request {request_id!r}: block_size must be >= 1")
        self._multimodal = tuple(multimodal)
        self._hasher = BlockHasher(
            size, adapter=adapter, cache_salt=cache_salt, multimodal=self._multimodal, algorithm=algorithm
        )
        self.request_id = request_id
        self.block_size = size
        self.adapter = adapter
        self.cache_salt = cache_salt
        self.skip_reading_prefix_cache = bool(skip_reading_prefix_cache)
        self.algorithm = algorithm
        self.prompt_token_ids: tuple[int, ...] = tuple(prompt)
        self.output_token_ids: list[int] = []
        self._all: list[int] = list(prompt)
        #: Tokens whose KV is computed and stored (the scheduler's count).
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        self._hasher.extend_checked(prompt)

    @classmethod
    def from_block_hashes(
        cls,
        request_id: str,
        num_prompt_tokens: int,
        block_hashes: IntsLike,
        *,
        block_size: int,
        algorithm: str = DEFAULT_ALGORITHM,
    ) -> Request:
        """A request whose prompt is known only by the hashes of its full blocks (a trace's block ids).

        Traces such as Mooncake's name each prompt block by an id and carry no tokens; REQ-702's
        hashes are then those ids (TRACE-1038). ``block_hashes`` must hold exactly
        ``num_prompt_tokens // block_size`` hashes in ``[0, 2**63)``; the prompt's tokens read as
        zeros (only events show them), and output tokens appended later chain from the last hash
        as chapter 02 chains them.
        """
        size = as_count(block_size, op="Request.from_block_hashes", arg="block_size")
        length = as_count(num_prompt_tokens, op="Request.from_block_hashes", arg="num_prompt_tokens", rule="REQ-702")
        if size == 0 or length == 0:
            raise InvalidValueError("REQ-702", f"Request {request_id!r}: block_size and num_prompt_tokens must be >= 1")
        hashes = as_hash_list(block_hashes, op="Request.from_block_hashes")
        if len(hashes) != length // size:
            raise InvalidValueError(
                "REQ-702",
                f"Request {request_id!r}: {len(hashes)} block hashes for {length} tokens in blocks of {size} "
                f"(its full blocks number {length // size})",
            )
        request = cls(request_id, [0], block_size=size, algorithm=algorithm)
        cls._adopt_named_prompt(request, length, hashes)
        return request

    def _adopt_named_prompt(self, length: int, hashes: list[int]) -> None:
        """Make the prompt ``length`` zeros whose full blocks hash to ``hashes`` (``from_block_hashes``)."""
        prompt = [0] * length
        self.prompt_token_ids = tuple(prompt)
        self._all = prompt
        size = self.block_size
        self._hasher = BlockHasher(size, algorithm=self.algorithm).resume(hashes, [0] * (length % size))

    @property
    def block_hashes(self) -> list[int]:
        """The hashes of the request's full blocks so far (REQ-702); do not modify."""
        return self._hasher.hashes

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt and output tokens, in order; do not modify."""
        return self._all

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self._all)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of the prompt."""
        return len(self.prompt_token_ids)

    def append_output_token_ids(self, token_ids: int | IntsLike) -> None:
        """Append sampled tokens; the hashes of blocks they complete join ``block_hashes`` (REQ-702)."""
        new = _tokens(
            [token_ids] if isinstance(token_ids, int) else token_ids, op="append_output_token_ids", arg="token_ids"
        )
        self.output_token_ids.extend(new)
        self._all.extend(new)
        self._hasher.extend_checked(new)

    def block_token_ids(self, index: int) -> tuple[int, ...]:
        """The tokens of full block ``index``."""
        size = self.block_size
        return tuple(self._all[index * size : (index + 1) * size])

    def block_extra_keys(self, index: int) -> BlockExtraKeys:
        """The extra keys that entered the hash of block ``index`` (HASH-204)."""
        return block_extra_keys(
            index, self.block_size, adapter=self.adapter, cache_salt=self.cache_salt, multimodal=self._multimodal
        )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.num_tokens} tokens, computed={self.num_computed_tokens}, "
            f"{self.status.value}, preemptions={self.num_preemptions})"
        )
