"""The README's runnable examples run: a new user copies them first."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(marker: str) -> list[str]:
    """The README's ```python blocks that mention ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return [b for b in blocks if marker in b]


@pytest.mark.rule("RADIX-622", "RADIX-623", "RADIX-624")
def test_the_readme_radix_example_runs_and_leaves_a_consistent_tree() -> None:
    (block,) = python_blocks("kvref.oracle.radix")
    scope: dict[str, object] = {}
    exec(compile(block, "README.md (chapter 06 example)", "exec"), scope)
    tree = scope["tree"]
    assert tree.total_size() == 96, f"the example cached {tree.total_size()} tokens, not its 96 whole-page tokens"  # type: ignore[attr-defined]


@pytest.mark.rule("ERR-511", "ERR-512")
def test_the_readme_array_surface_example_reports_its_double_free(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    (block,) = python_blocks("create_slot_arrays")
    exec(compile(block.replace("4096, page_size=16)", "4096, page_size=16, device='cpu')"), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "[RADIX-606]" in printed and "call 1" in printed and "4048" in printed, (
        f"the README's array-surface example printed {printed!r}; it promises the double free of call 1 and 4048 slots"
    )


@pytest.mark.rule("DATA-801", "DATA-806", "DATA-811")
@pytest.mark.parametrize("backend", ["oracle", "torch", "cupy"])
def test_the_readme_data_plane_example_runs_on_every_backend(capsys: pytest.CaptureFixture[str], backend: str) -> None:
    (block,) = python_blocks("data_plane()")
    exec(compile(block.replace('load_backend("oracle")', f"load_backend({backend!r})"), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "(2, 16, 8, 64) (2, 16, 2, 64)" in printed.replace("torch.Size([", "(").replace("])", ")"), printed
    assert "2662400" in printed, f"mem_bytes of 2 layers of 65 blocks of 16 slots: {printed}"


@pytest.mark.rule("ERR-517", "ERR-520", "POOL-108")
def test_the_readme_block_arrays_example_reports_its_foreign_free(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    (block,) = python_blocks("create_block_arrays")
    code = block.replace("max_requests=256)", "max_requests=256, device='cpu')")
    exec(compile(code, "README.md (block arrays)", "exec"), {})
    printed = capsys.readouterr().out
    assert "[POOL-108]" in printed and "call 2" in printed and "1019" in printed, (
        f"the README's block array-surface example printed {printed!r}; it promises the foreign free of call 2 "
        "and 1019 free blocks"
    )


@pytest.mark.rule("DATA-815", "DATA-816")
def test_the_readme_device_checks_example_reports_its_repeated_slot(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    (block,) = python_blocks('checks="device"')
    exec(compile(block, "README.md (device checks)", "exec"), {})
    printed = capsys.readouterr().out
    assert "[DATA-807]" in printed and "call 1" in printed, (
        f"the README's device-checks example printed {printed!r}; it promises DATA-807 for call 1"
    )


@pytest.mark.rule("REQ-750", "REQ-752")
def test_the_readme_batched_step_example_grows_and_releases_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    (block,) = python_blocks("create_block_tables")
    scope: dict[str, object] = {}
    exec(compile(block, "README.md (batched step example)", "exec"), scope)
    printed = capsys.readouterr().out
    assert "(256, 64) [1, 2, 3]" in printed, f"the example printed {printed!r}"
    tables: Any = scope["tables"]
    assert tables.pool.available_blocks() == 4999 and tables.blocks(0) == [], "the release gave every block back"


def test_every_python_block_of_the_readme_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """A new user copies a block and runs it: each must run on a CPU as it stands, no name undefined."""
    pytest.importorskip("torch")
    blocks = python_blocks("")
    assert blocks, "the README has no python blocks"
    for number, block in enumerate(blocks, 1):
        on_cpu = block
        if "create_slot_arrays" in block:  # the array surface on the CPU, as the test above runs it
            on_cpu = block.replace("4096, page_size=16)", "4096, page_size=16, device='cpu')")
        try:
            exec(compile(on_cpu, f"README.md (python block {number})", "exec"), {"__name__": f"readme_block_{number}"})
        except Exception as exc:
            pytest.fail(f"README python block {number} fails as written: {type(exc).__name__}: {exc}\n{block}")
    capsys.readouterr()


def test_the_conformance_readme_example_builds_a_target_with_its_parts() -> None:
    """conformance/README.md's adoption example runs as written, and its target reaches each part."""
    text = (README.parent / "conformance" / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    scope: dict[str, Any] = {"__name__": "conformance_readme"}
    exec(compile(block, "conformance/README.md", "exec"), scope)
    target = scope["MINE"]
    assert target.create(8).num_usable == 7 and target.create_slots(8).available_size() == 8
    _, tree = target.create_radix(16)
    assert tree.total_size() == 0 and all(scope[k].target is target for k in ("TestMyPool", "TestMyPrefixCache"))


@pytest.mark.rule("TIER-1104", "TIER-1119", "TIER-1125")
def test_the_readme_tier_example_serves_four_keys_and_moves_the_reused_ones_to_t2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (block,) = python_blocks("kvref.oracle.tiers")
    scope: dict[str, Any] = {}
    exec(compile(block, "README.md (chapter 11 example)", "exec"), scope)
    printed = capsys.readouterr().out
    assert "pending" in printed and "length=4, device=1, per_tier=(3,)" in printed, f"the example printed {printed!r}"
    assert scope["host"].policy_state()["t2"] == [12, 11], "the README promises 11 and 12 in T2"
