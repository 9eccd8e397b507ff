"""The module paths from before kvref/ had rooms still import, as the very modules that moved."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from kvref._moved import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_path_imports_the_module_that_moved(old: str, new: str) -> None:
    aliased = importlib.import_module(old)
    assert aliased is importlib.import_module(new), f"import {old} gave {aliased!r}, not the module {new}"


def test_the_public_imports_users_write_keep_working_in_a_fresh_interpreter() -> None:
    code = (
        "from kvref.oracle import OracleBlockPool\n"
        "from kvref.registry import create_pool\n"
        "from kvref.errors import KVRefError\n"
        "from kvref.hashing import hash_token_blocks\n"
        "import kvref.contract.errors as e, kvref.config.registry as r\n"
        "assert KVRefError is e.KVRefError and create_pool is r.create_pool\n"
        "assert isinstance(create_pool(4), OracleBlockPool)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (
        f"the old import paths failed in a fresh interpreter: {out.stderr.strip()[-800:]}"
    )


def test_an_unknown_module_of_kvref_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("kvref.no_such_module")
