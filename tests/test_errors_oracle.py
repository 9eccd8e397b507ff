"""Chapter 05 on the oracle itself: validation survives ``python -O`` and uses no assert.

The bad-input matrix over every operation lives in the conformance suite
(``kvref_conformance.suites.errors``) and runs on the oracle through ``test_conformance_oracle``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

rule = pytest.mark.rule


@rule("ERR-507")
def test_validation_holds_under_python_dash_o() -> None:
    code = (
        "from kvref.oracle import OracleBlockPool\n"
        "from kvref.contract.errors import NotHeldError\n"
        "p = OracleBlockPool(4)\n"
        "[b] = p.allocate(1)\n"
        "p.free([b])\n"
        "try:\n    p.free([b])\nexcept NotHeldError:\n    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "refused", f"under -O a double free was not refused: {out.stdout!r}"


@rule("ERR-507")
def test_no_source_file_validates_with_assert() -> None:
    import ast
    from pathlib import Path

    import kvref

    root = Path(kvref.__file__).parent
    offenders = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert not offenders, f"assert statements in kvref (stripped under -O): {offenders}"
