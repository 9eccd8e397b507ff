"""SGLang's KV slot allocators driven through kvref's BlockPool protocol, the way SGLang's scheduler drives them.

SGLang (checked with ``sglang==0.5.23``) hands out KV slots from ``TokenToKVPoolAllocator``
(one token per slot) and ``PagedTokenToKVPoolAllocator`` (pages of ``page_size`` tokens): both
keep a free list of page ids in a torch tensor, ``alloc(n_tokens)`` returns token indices (or
None when short), ``free(token_indices)`` gives them back, ``available_size()`` counts free
tokens. Slot (page) 0 is the padding slot and never handed out. Reference counts and prefix
sharing live in SGLang's ``RadixCache``, not in these allocators, so the adapter is a
:class:`~kvref_conformance.adapter.ForeignPoolAdapter`: it keeps holders and generations, as the
scheduler's request-to-token pool does, and passes the allocator's answers through unchanged.

A kvref block is one page: block ``b`` is page ``b`` (tokens ``b*page_size .. b*page_size +
page_size - 1``). Devices: ``cpu`` only here (the allocators run on any torch device; the suite
runs where the CPU build of torch is).

Install: ``pip install --no-deps sglang==0.5.23`` plus its small pure-Python imports under the
torch 2.13.0 constraint (``nox -s peer-sglang`` does it); a plain ``pip install sglang`` does not
resolve here (its CUDA pins).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import cache
from importlib import metadata
from typing import Any

from kvref.contract.errors import ConfigError
from kvref_conformance.adapter import ForeignPoolAdapter
from kvref_conformance.peers.sglang_radix import installed_release

__all__ = ["SglangAllocatorAdapter", "SglangBackend", "SglangSlots", "backend", "backend_paged"]

INSTALL = "use `nox -s peer-sglang` (sglang==0.5.23 installed --no-deps; see README)"

#: Tokens per page for the paged backend: small, so the suite's small pools still have pages.
PAGE_SIZE = 4


class SglangAllocatorAdapter(ForeignPoolAdapter):
    """kvref's BlockPool over an SGLang token or paged allocator (see the module doc)."""

    def __init__(
        self, num_blocks: int, *, page_size: int = 1, reserved_ids: Sequence[int] = (0,), paused_limit: int = 0
    ):
        super().__init__(num_blocks, reserved_ids=reserved_ids, paused_limit=paused_limit)
        if 0 not in self._reserved:
            raise ConfigError("CONF-904", "sglang: slot 0 is SGLang's padding slot; reserved_ids must contain 0")
        import torch
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

        self._torch = torch
        self.page_size = page_size
        size = (self._n - 1) * page_size
        if page_size == 1:
            self.allocator: Any = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu", None, False)
        self._offsets = torch.arange(page_size, dtype=torch.int64)
        extra = [b for b in self._reserved if b != 0]
        if extra:  # take every page, keep the extra reserved ones, give the rest back
            everything = self._take(self._foreign_free()) or []
            self._give_back([b for b in everything if b not in extra])

    name = "sglang"

    def _take(self, count: int) -> list[int] | None:
        tokens = self.allocator.alloc(count * self.page_size)
        if tokens is None:
            return None
        pages: list[int] = (tokens[:: self.page_size] // self.page_size).tolist()
        return pages

    def _give_back(self, ids: list[int]) -> None:
        pages = self._torch.tensor(ids, dtype=self._torch.int64)
        self.allocator.free((pages[:, None] * self.page_size + self._offsets).reshape(-1))

    def _foreign_free(self) -> int:
        return int(self.allocator.available_size()) // self.page_size

    def capabilities(self) -> frozenset[str]:
        """A plain block pool (the prefix cache is SGLang's RadixCache, not adapted yet)."""
        return frozenset({"pause", "policy-lru"})


class SglangSlots:
    """SGLang's allocator as chapter 06's token-slot allocator: lists in, lists out, nothing checked here.

    The suite calls SGLang's own ``alloc``, ``free``, ``free_group_begin``/``end``,
    ``available_size`` and ``clear`` as its scheduler does; every check (or its absence) is SGLang's.
    """

    def __init__(self, size: int, *, page_size: int, sort: bool) -> None:
        import torch
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

        self._torch = torch
        self.size = size
        self.page_size = page_size
        if page_size == 1:
            self.allocator: Any = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, sort)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu", None, sort)

    def alloc(self, need_size: int) -> list[int] | None:
        """``allocator.alloc``: the slot indices as a list, or None."""
        got = self.allocator.alloc(need_size)
        return None if got is None else [int(s) for s in got.tolist()]

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int]) -> Any:
        """A prefill step as SGLang's scheduler allocates it (``alloc_for_extend``): ``alloc`` of the step's
        tokens on pages of one slot (``alloc_token_slots``), else the paged allocator's ``alloc_extend``
        with the lengths on the host and on the device (both the CPU here) and each request's
        ``last_loc`` (``-1`` for an empty prefix, as the scheduler passes it)."""
        torch = self._torch
        pre = torch.tensor(list(prefix_lens), dtype=torch.int64)
        seq = torch.tensor(list(seq_lens), dtype=torch.int64)
        tokens = int((seq - pre).sum())
        if self.page_size == 1:
            got = self.allocator.alloc(tokens)
        else:
            last = torch.tensor(list(last_locs), dtype=torch.int64)
            got = self.allocator.alloc_extend(pre, pre.clone(), seq, seq.clone(), last, tokens)
        return None if got is None else [int(s) for s in got.tolist()]

    def alloc_decode(self, seq_lens: Sequence[int], last_locs: Sequence[int]) -> Any:
        """A decode step as SGLang's scheduler allocates it (``alloc_for_decode``): ``alloc`` of one slot per
        request on pages of one slot, else the paged allocator's ``alloc_decode`` of the new lengths."""
        torch = self._torch
        if self.page_size == 1:
            got = self.allocator.alloc(len(seq_lens))
        else:
            seq = torch.tensor(list(seq_lens), dtype=torch.int64)
            got = self.allocator.alloc_decode(seq, seq.clone(), torch.tensor(list(last_locs), dtype=torch.int64))
        return None if got is None else [int(s) for s in got.tolist()]

    def free(self, indices: Sequence[int]) -> None:
        """``allocator.free`` of the indices as an int64 tensor."""
        self.allocator.free(self._torch.tensor(list(indices), dtype=self._torch.int64))

    def free_group_begin(self) -> None:
        """``allocator.free_group_begin``."""
        self.allocator.free_group_begin()

    def free_group_end(self) -> None:
        """``allocator.free_group_end``."""
        self.allocator.free_group_end()

    def available_size(self) -> int:
        """``allocator.available_size()``."""
        return int(self.allocator.available_size())

    def clear(self) -> None:
        """``allocator.clear``."""
        self.allocator.clear()

    @property
    def num_pages(self) -> int:
        """Pages ``1 .. num_pages`` (page 0 is the padding page)."""
        return self.size // self.page_size

    def is_allocated(self, slot: int) -> bool:
        """Whether ``slot``'s page is on none of SGLang's lists (an observation): its free list and the
        pages freed but not yet merged into it (``release_pages``, or from 0.5.20 the paged
        allocator's ``staged_pages``, a list of tensors)."""
        page = slot // self.page_size
        staged = getattr(self.allocator, "staged_pages", None) or []
        lists = [p for p in (self.allocator.free_pages, self.allocator.release_pages, *staged) if p is not None]
        return 0 < page <= self.num_pages and not any(page in self._torch.as_tensor(p).tolist() for p in lists)


#: The oldest release whose allocators the adapter drives (their ``need_sort`` argument), the
#: oldest whose ``RadixCache`` it drives (``RadixKey``; each release's own calls, see
#: ``peers/sglang_radix.py``), and the oldest whose paged step allocation runs on a CPU (before it,
#: the paged ``alloc_extend`` runs only as a Triton kernel).
OLDEST_ALLOCATOR = (0, 5, 1)
OLDEST_RADIX = (0, 5, 5)
OLDEST_EXTEND = (0, 5, 22)


@cache
def _radix_cache_imports() -> bool:
    """Whether SGLang's ``RadixCache`` imports here (it needs ``transformers``; ``nox -s peer-sglang`` has it)."""
    try:
        from kvref_conformance.peers.sglang_radix import load_radix_cache

        load_radix_cache()
    except Exception:  # SGLang's import chain raises more than ImportError when a dependency is missing
        return False
    return True


@cache
def _radix_offers_priority() -> bool:
    """Whether the installed release's radix caches evict under ``priority`` (its ``PriorityStrategy``)."""
    import sglang.srt.mem_cache.evict_policy as evict_policy

    return hasattr(evict_policy, "PriorityStrategy")


@cache
def _unified_cache_imports() -> bool:
    """Whether ``UnifiedRadixCache`` imports here (it needs ``openai`` and ``partial_json_parser`` besides)."""
    if not _radix_cache_imports():
        return False
    try:
        import sglang.srt.mem_cache.unified_radix_cache  # noqa: F401
    except Exception:  # as above
        return False
    return True


class SglangBackend:
    """The ``sglang`` (token allocator) and ``sglang-paged`` (pages of :data:`PAGE_SIZE`) entry points, with
    ``RadixCache`` as the radix cache; ``sglang-unified`` and ``sglang-unified-paged`` with ``UnifiedRadixCache``."""

    def __init__(self, name: str, *, page_size: int, unified: bool = False) -> None:
        self.name = name
        self.page_size = page_size
        self.unified = unified

    def version(self) -> str:
        """The installed sglang version."""
        try:
            return metadata.version("sglang")
        except metadata.PackageNotFoundError:
            return "not installed"

    def availability(self) -> str | None:
        """None when SGLang's allocators import; else why not and how to install them."""
        import importlib.util

        from kvref_conformance.peers.sglang_radix import make_sglang_importable

        try:
            if importlib.util.find_spec("sglang") is not None:
                with contextlib.suppress(ModuleNotFoundError):  # no transformers: SGLang's import says so
                    make_sglang_importable()
            import sglang.srt.mem_cache.allocator  # noqa: F401
        except ModuleNotFoundError as exc:
            if exc.name == "sglang" or (exc.name or "").startswith("sglang."):
                return f"{exc.name} is not installed; {INSTALL}"
            return f"a module it imports is missing ({exc}); {INSTALL}"
        except Exception as exc:  # SGLang raises more than ImportError when a dependency is missing
            return f"sglang's allocators do not import ({type(exc).__name__}: {exc}); {INSTALL}"
        if installed_release() < OLDEST_ALLOCATOR:
            oldest = ".".join(map(str, OLDEST_ALLOCATOR))
            return f"sglang {self.version()} is older than {oldest}, the oldest allocator the adapter drives; {INSTALL}"
        return None

    def device(self, requested: str | None = None) -> str:
        """The suite drives the allocators on the CPU."""
        if requested not in (None, "cpu", "host"):
            raise ConfigError("CONF-907", f"backend {self.name!r} runs on the cpu here, not on {requested!r}")
        return "cpu"

    def capabilities(self) -> frozenset[str]:
        """A plain block pool with paused holders kept by the adapter, and the allocator as chapter 06's.

        The token allocator hands slots out in chapter 06's order (``slot-order``); the paged one
        puts freed pages at the front of its free list when it does not sort, by design, so it is
        compared by counts only. Before :data:`OLDEST_RADIX` the radix cache has no ``RadixKey``, and
        before :data:`OLDEST_EXTEND` the paged ``alloc_extend`` runs only as a Triton kernel, so those
        releases are judged without them.
        """
        order = {"slot-order"} if self.page_size == 1 else set()
        imports = _unified_cache_imports() if self.unified else _radix_cache_imports()
        release = installed_release()
        # events rewritten by content (sglang_events)
        radix = {"radix-cache", "radix-events"} if imports and release >= OLDEST_RADIX else set()
        if radix and _radix_offers_priority():
            radix.add("radix-priority")
        extend = {"slot-extend"} if release >= OLDEST_EXTEND else set()
        return frozenset({"pause", "policy-lru", "token-slots", *extend, *order, *radix})

    def create_slots(
        self, size: int, *, page_size: int = 1, sort: bool = True, device: str | None = None
    ) -> SglangSlots:
        """SGLang's token allocator (``sglang``) or paged allocator (``sglang-paged``), driven directly."""
        self.device(device)
        if (page_size == 1) != (self.page_size == 1):
            kind = "pages of 1 slot (the token allocator)" if self.page_size == 1 else "pages of 2 or more slots"
            raise ConfigError(
                "CONF-904", f"backend {self.name!r} makes allocators of {kind}, not of pages of {page_size}"
            )
        return SglangSlots(size, page_size=page_size, sort=sort)

    def create_radix(
        self,
        size: int,
        *,
        page_size: int = 1,
        policy: str = "lru",
        sort: bool = True,
        device: str | None = None,
        enable_events: bool = False,
    ) -> tuple[SglangSlots, Any]:
        """SGLang's allocator and its ``RadixCache`` (or ``UnifiedRadixCache``) over it, driven as its scheduler
        drives them; ``enable_events`` turns on SGLang's ``enable_kv_cache_events``."""
        from kvref_conformance.peers.sglang_radix import SglangRadixTree
        from kvref_conformance.peers.sglang_unified import SglangUnifiedTree

        slots = self.create_slots(size, page_size=page_size, sort=sort, device=device)
        tree = SglangUnifiedTree if self.unified else SglangRadixTree
        return slots, tree(slots.allocator, page_size=page_size, policy=policy, enable_events=enable_events)

    def create(
        self,
        num_blocks: int,
        *,
        policy: str = "lru",
        device: str | None = None,
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> SglangAllocatorAdapter:
        """A new adapter over a new allocator of ``num_blocks - 1`` pages (page 0 is padding)."""
        self.device(device)
        if policy != "lru":
            raise ConfigError("CONF-904", f"backend {self.name!r} keeps no cache; policy {policy!r} means nothing")
        return SglangAllocatorAdapter(
            num_blocks, page_size=self.page_size, reserved_ids=reserved_ids, paused_limit=paused_limit
        )


#: ``TokenToKVPoolAllocator`` (entry point ``sglang``).
backend = SglangBackend("sglang", page_size=1)
#: ``PagedTokenToKVPoolAllocator`` with pages of :data:`PAGE_SIZE` tokens (entry point ``sglang-paged``).
backend_paged = SglangBackend("sglang-paged", page_size=PAGE_SIZE)
#: The token allocator with ``UnifiedRadixCache``, what SGLang's scheduler builds for most models
#: (entry point ``sglang-unified``).
backend_unified = SglangBackend("sglang-unified", page_size=1, unified=True)
#: The paged allocator with ``UnifiedRadixCache`` (entry point ``sglang-unified-paged``).
backend_unified_paged = SglangBackend("sglang-unified-paged", page_size=PAGE_SIZE, unified=True)
