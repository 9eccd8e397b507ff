"""A recorded KV-event stream read from its file, whichever form it is in (PFX-323).

kvref's JSON Lines (:func:`kvref.simulation.event_streams.read_json_lines`) begin with ``{``;
anything else is read as an engine's MessagePack messages
(:func:`kvref.simulation.engine_events.read_engine_stream`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvref.simulation.event_streams import StreamEvent, read_json_lines

__all__ = ["read_stream"]


def read_stream(path: Path, *, with_tokens: bool = False) -> Iterator[StreamEvent]:
    """The events of the stream recorded in ``path``, oldest first, in whichever form it was written;
    a line or message that is not an event stops the read with TraceError naming the file, the line
    or message, and what is wrong (PFX-323). ``with_tokens`` keeps an engine store's token ids
    (kvref's own form carries none)."""
    with path.open("rb") as probe:
        head = probe.read(64).lstrip()
    if head[:1] in (b"{", b""):
        yield from read_json_lines(path)
        return
    from kvref.simulation.engine_events import read_engine_stream

    yield from read_engine_stream(path, with_tokens=with_tokens)
