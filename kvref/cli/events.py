"""``kvref events check``: a recorded KV-event stream, checked as a router would rebuild it (PFX-322..PFX-327)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["run_events"]


def run_events(args: argparse.Namespace) -> int:
    """Check the stream ``args.stream`` (against the snapshots in ``args.snapshots``, if any): 0 when a
    conforming cache could have sent it, 1 with the first event that breaks PFX-322..PFX-327 and the
    window that shows it."""
    from kvref.simulation.event_streams import check_stream, read_snapshots
    from kvref.simulation.stream_files import read_stream

    snapshots = read_snapshots(Path(args.snapshots)) if args.snapshots else []
    count, finding = check_stream(read_stream(Path(args.stream)), copies=args.copies, snapshots=snapshots)
    if args.json:
        print(json.dumps({"events": count, "finding": None if finding is None else finding.to_json()}, indent=1))
    elif finding is None:
        rules = "PFX-324, PFX-325, PFX-326" if args.copies else "PFX-322, PFX-325, PFX-326"
        print(f"{args.stream}: {count:,} events, each one a conforming cache could have sent ({rules})")
        if snapshots:
            held = f"{len(snapshots):,} snapshot" + ("s" if len(snapshots) != 1 else "")
            print(f"and the rebuild holds what the cache held at its {held} (PFX-327)")
    else:
        if finding.rule == "PFX-327":
            print(f"{args.stream}: after {count:,} events the rebuild and the cache's snapshot disagree:")
        else:
            print(f"{args.stream}: the first of {count:,} events read that no conforming cache could have sent:")
        print(finding.describe())
    return 0 if finding is None else 1
