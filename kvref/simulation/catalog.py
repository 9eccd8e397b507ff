"""The public traces kvref knows, and fetching them with their checksum checked (TRACE-1044).

``kvref traces list`` prints the catalog; ``kvref traces fetch NAME`` downloads a trace into a
cache directory (``$KVREF_TRACE_CACHE``, else ``~/.cache/kvref/traces``), checks its SHA-256 and
only then gives it its name there. ``kvref serve-replay NAME`` takes a catalog name as well as a
path, and refuses a cached file whose checksum differs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvref.simulation.traces import TraceError

__all__ = ["CATALOG", "CatalogTrace", "cache_directory", "catalog_trace", "fetch_trace", "resolve_trace", "sha256_of"]


@dataclass(frozen=True)
class CatalogTrace:
    """One public trace: where it lives, under which licence, how big it is and its SHA-256."""

    name: str
    url: str
    source: str
    licence: str
    size_bytes: int
    sha256: str
    format: str  # "jsonl" (Mooncake's format) or "azure-csv"
    description: str

    @property
    def filename(self) -> str:
        """The file's name in the cache directory."""
        return self.url.rsplit("/", 1)[-1]


_MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/"
_AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"

#: The traces ``kvref traces fetch`` knows, by name.
CATALOG: tuple[CatalogTrace, ...] = (
    CatalogTrace(
        "mooncake-conversation",
        _MOONCAKE + "conversation_trace.jsonl",
        "kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl",
        "Apache-2.0",
        3_029_533,
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        "jsonl",
        "12,031 chat requests over an hour; prompt blocks of 512 tokens named by prefix-chained ids",
    ),
    CatalogTrace(
        "mooncake-synthetic",
        _MOONCAKE + "synthetic_trace.jsonl",
        "kvcache-ai/Mooncake, FAST25-release/traces/synthetic_trace.jsonl",
        "Apache-2.0",
        1_136_313,
        "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
        "jsonl",
        "3,993 requests, long prompts; same format",
    ),
    CatalogTrace(
        "azure-code-2023",
        _AZURE + "AzureLLMInferenceTrace_code.csv",
        "Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_code.csv",
        "CC-BY-4.0",
        320_117,
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        "azure-csv",
        "8,819 coding requests over an hour: arrival, context and output lengths, no token ids",
    ),
    CatalogTrace(
        "azure-conv-2023",
        _AZURE + "AzureLLMInferenceTrace_conv.csv",
        "Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_conv.csv",
        "CC-BY-4.0",
        719_188,
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        "azure-csv",
        "19,366 conversation requests over an hour; same columns",
    ),
)


def catalog_trace(name: str) -> CatalogTrace | None:
    """The catalog entry called ``name``, or None."""
    return next((t for t in CATALOG if t.name == name), None)


def cache_directory() -> Path:
    """Where fetched traces live: ``$KVREF_TRACE_CACHE``, else ``~/.cache/kvref/traces``."""
    configured = os.environ.get("KVREF_TRACE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "kvref" / "traces"


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _refuse_mismatch(where: Path | str, entry: CatalogTrace, found: str) -> TraceError:
    return TraceError(
        "TRACE-1044",
        f"{where}: SHA-256 {found} but the catalog's {entry.name} has {entry.sha256}; "
        "the file is not the published trace (delete it and fetch again)",
    )


def fetch_trace(
    name: str,
    *,
    directory: Path | None = None,
    url: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Download catalog trace ``name`` (from ``url`` instead, for mirrors and tests) and return its path.

    The download goes to a temporary file beside the target; only a file whose SHA-256 matches
    the catalog's is renamed to the trace's name (TRACE-1044). An existing good copy is kept.
    ``progress(done_bytes, total_bytes)`` is called as bytes arrive.
    """
    entry = catalog_trace(name)
    if entry is None:
        raise TraceError("TRACE-1044", f"no trace called {name!r} in the catalog; known: {[t.name for t in CATALOG]}")
    folder = directory or cache_directory()
    target = folder / entry.filename
    source = url or entry.url
    if target.exists():
        if sha256_of(target) == entry.sha256:
            return target
        target.unlink()  # a copy that is not the published trace keeps no name (TRACE-1044)
    folder.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{entry.filename}.", dir=folder)
    part = Path(temporary)
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(source, timeout=60) as response:
            done = 0
            while chunk := response.read(1 << 16):
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, entry.size_bytes)
        found = sha256_of(part)
        if found != entry.sha256:
            raise _refuse_mismatch(source, entry, found)
        shutil.move(part, target)
    except (OSError, ValueError) as exc:  # ValueError: urlopen's answer to a malformed URL
        if isinstance(exc, TraceError):
            raise
        raise TraceError("TRACE-1044", f"fetching {name} from {source} failed: {exc}") from None
    finally:
        part.unlink(missing_ok=True)
    return target


def resolve_trace(name_or_path: str) -> tuple[Path, CatalogTrace | None]:
    """A trace argument as a file: a path as given, or a catalog name's fetched copy, checksum checked.

    A catalog name whose copy is missing is refused with the command that fetches it; a copy
    whose checksum differs is refused (TRACE-1044).
    """
    entry = catalog_trace(name_or_path)
    if entry is None:
        return Path(name_or_path), None
    path = cache_directory() / entry.filename
    if not path.exists():
        raise TraceError(
            "TRACE-1044", f"{entry.name} is not fetched yet: run `kvref traces fetch {entry.name}` (it goes to {path})"
        )
    found = sha256_of(path)
    if found != entry.sha256:
        raise _refuse_mismatch(path, entry, found)
    return path, entry
