"""SGLang's KV events rewritten in chapter 06's hashes (RADIX-634), by their content.

SGLang 0.5.23's ``KVCacheEventRecorder`` hashes a page with SHA-256 of its token bytes chained
through the node's hash values, and joins consecutive pages of one chain into one ``BlockStored``
(``block_hashes`` and ``token_ids`` of several pages, ``parent_block_hash`` of the first) and
consecutive removals into one ``BlockRemoved``. Hash values are each engine's own, so the
events are compared by what they say: each stored page is rehashed from its own tokens, chained
on the kvref hash of the page SGLang names as its parent, and salted with the event's
``cache_salt`` when it starts a chain (RADIX-636's salt is ``repr(namespace)``; the adapters
pass that as SGLang's cache salt in trees with events). A removal or a parent that names a hash
SGLang never stored cannot be rewritten; it comes out as a ``BlockRemoved`` (or a parent) of
:func:`unknown`, which no rule's hash equals, so the suite reports it in the step it happens.
The translator keeps no state beyond the hashes it has seen, and checks nothing.
"""

from __future__ import annotations

from typing import Any

from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvref.contract.hashing import ROOT_HASH, BlockExtraKeys, hash_block

__all__ = ["SglangEventTranslator", "key_namespace", "unknown"]


def unknown(sglang_hash: int) -> int:
    """The stand-in for an SGLang hash that no store named: negative, so never a chapter-02 hash."""
    return -1 - abs(int(sglang_hash))


def key_namespace(namespace: Any, salted: bool) -> dict[str, Any]:
    """How an adapter names ``namespace`` in SGLang's ``RadixKey``: as its ``extra_key`` (the LoRA
    path), or, where ``salted`` (a tree with events, on a release whose keys take a salt), as its
    ``cache_salt`` (``repr(namespace)``, RADIX-636's salt), the namespace SGLang's events carry."""
    if salted and namespace is not None:
        return {"cache_salt": repr(namespace)}
    return {"extra_key": namespace}


def _cache_salt(event: Any) -> Any:
    """A store's cache salt: ``BlockStored.cache_salt`` (0.5.21 on), ``BlockStoredWithMetadata``'s
    ``metadata.cache_salt`` (0.5.18), or None (earlier events carry none)."""
    salt = getattr(event, "cache_salt", None)
    return salt if salt is not None else getattr(getattr(event, "metadata", None), "cache_salt", None)


class SglangEventTranslator:
    """Rewrites one SGLang tree's event stream into kvref's ``BlockStored``/``BlockRemoved``/``AllBlocksCleared``."""

    def __init__(self, page_size: int, cache: Any) -> None:
        """A translator for SGLang's ``cache`` (made with ``enable_kv_cache_events``). Its constructor
        resets the new tree, which records an ``AllBlocksCleared``; that is taken here, before the
        first call: a router attached to the fresh cache reads an empty cache either way."""
        self._page = page_size
        self._hashes: dict[int, int] = {}  # SGLang's hash of a page -> kvref's
        self._cache = cache
        cache.take_events()

    def take(self) -> list[Any]:
        """The cache's ``take_events()``, rewritten (:meth:`translate`)."""
        return self.translate(self._cache.take_events())

    def translate(self, events: list[Any]) -> list[Any]:
        """kvref's events for ``events`` (what ``take_events`` of SGLang's cache returned), in order.

        An event it cannot read (a kind chapter 06 has no word for, a store whose hashes and
        pages do not pair up) is passed on as SGLang's object, which no kvref event equals.
        """
        out: list[Any] = []
        for event in events:
            kind = type(event).__name__
            if kind in ("BlockStored", "BlockStoredWithMetadata"):
                out.extend(self._stored(event))
            elif kind == "BlockRemoved":
                out.extend(BlockRemoved(self._hashes.get(h, unknown(h))) for h in event.block_hashes)
            elif kind == "AllBlocksCleared":
                out.append(AllBlocksCleared())
            else:  # an event kind chapter 06 has no word for: passed on, so a comparison shows it
                out.append(event)
        return out

    def _stored(self, event: Any) -> list[Any]:
        tokens = [int(t) for t in event.token_ids]
        pages = [tokens[i : i + self._page] for i in range(0, len(tokens), self._page)]
        if len(pages) != len(event.block_hashes):  # no page-for-hash reading: shown as SGLang wrote it
            return [event]
        sglang_parent = event.parent_block_hash
        parent = None if sglang_parent is None else self._hashes.get(sglang_parent, unknown(sglang_parent))
        cache_salt = _cache_salt(event)
        salt = BlockExtraKeys(cache_salt=cache_salt) if cache_salt is not None else None
        out: list[KVEvent] = []
        for sglang_hash, page in zip(event.block_hashes, pages, strict=True):
            ours = hash_block(ROOT_HASH if parent is None else parent, page, salt if parent is None else None)
            self._hashes[sglang_hash] = ours
            out.append(BlockStored(ours, parent))
            parent = ours
        return out
