"""The peer adapters as a user meets them without the peers installed, and their deviation files."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import kvref_conformance.test_conformance as suite
from kvref.config.registry import backend_statuses
from kvref_conformance.deviations import load_deviations

rule = pytest.mark.rule
PEERS = ["vllm", "vllm-nocache", "sglang", "sglang-paged", "sglang-unified", "sglang-unified-paged", "megatron"]
DEVIATIONS = Path(importlib.import_module("kvref_conformance").__file__ or "").parent / "deviations"


@rule("CONF-901", "CONF-906")
@pytest.mark.parametrize("peer", PEERS)
def test_every_peer_is_registered_and_says_how_to_install_it_when_missing(peer: str) -> None:
    status = {s.name: s for s in backend_statuses()}.get(peer)
    assert status is not None, f"peer {peer!r} is not registered under the kvref.backends entry points"
    if not status.usable:
        assert "nox -s peer-" in status.reason, f"{peer}: the reason {status.reason!r} gives no way to install it"


@rule("CONF-902")
@pytest.mark.parametrize("path", sorted(DEVIATIONS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_known_deviation_names_a_test_of_the_suite_and_gives_a_reason_and_a_link(path: Path) -> None:
    for deviation in load_deviations(path.stem):
        cls_name, _, test = deviation.test.partition("::")
        name = test.split("[", 1)[0]
        cls = getattr(suite, cls_name, None)
        assert cls is not None and hasattr(cls, name), (
            f"{path.name}: deviation {deviation.test!r} names no test of the suite; a renamed test leaves it dangling"
        )
        assert deviation.reason.split(maxsplit=1)[0].rstrip(":(") in ("by", "bug", "the"), (
            f"{path.name}: {deviation.test}: the reason must say whether it is a bug or by design"
        )
        assert deviation.link.startswith("https://"), f"{path.name}: {deviation.test}: the link must be a URL"


@rule("CONF-913")
def test_a_deviation_with_versions_applies_only_to_the_releases_it_names(tmp_path: Path) -> None:
    extra = tmp_path / "extra.toml"
    extra.write_text(
        '[[deviation]]\ntest = "TestPool::test_x"\nreason = "bug: fixed in 0.5.11"\nlink = "https://x"\n'
        'versions = "<0.5.11"\n'
        '[[deviation]]\ntest = "TestPool::test_y"\nreason = "bug: every release"\nlink = "https://y"\n',
        encoding="utf-8",
    )
    releases = ("0.5.10", "0.5.11", "1.0")
    tests_for = {v: [d.test for d in load_deviations("no-such-peer", str(extra), v)] for v in releases}
    assert tests_for == {
        "0.5.10": ["TestPool::test_x", "TestPool::test_y"],
        "0.5.11": ["TestPool::test_y"],
        "1.0": ["TestPool::test_y"],
    }
    assert [d.test for d in load_deviations("no-such-peer", str(extra))] == ["TestPool::test_x", "TestPool::test_y"]
    assert [d.test for d in load_deviations("no-such-peer", str(extra), "unknown")] == [
        "TestPool::test_x",
        "TestPool::test_y",
    ]


@rule("CONF-913")
def test_a_deviation_whose_versions_are_not_a_specifier_is_refused_naming_the_file(tmp_path: Path) -> None:
    extra = tmp_path / "bad.toml"
    extra.write_text(
        '[[deviation]]\ntest = "TestPool::test_x"\nreason = "bug"\nlink = "https://x"\nversions = "before 0.5"\n',
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match=r"bad\.toml: deviation 0: versions 'before 0.5' is not a PEP 440 specifier"):
        load_deviations("no-such-peer", str(extra), "0.4")
