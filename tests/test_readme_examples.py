"""The README's runnable examples run: a new user copies them first."""

from __future__ import annotations

import re
from pathlib import Path

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
