"""SGLang's token-slot allocators as a small importable tree, for a GPU machine with no network.

SGLang's package imports a few dozen libraries that a GPU machine's Python may lack (and none can
be fetched there), but its ``TokenToKVPoolAllocator`` and ``PagedTokenToKVPoolAllocator`` need
only torch and Triton. This script copies, unchanged, the files that define them
(``srt/mem_cache/allocator/{base,token,paged}.py`` and the Triton kernels of
``kernels/ops/memory/allocator.py``) out of an installed SGLang into ``OUT/sglang/``. Around them
it writes only what their imports need: empty package files, a ``sglang.srt.utils`` that holds
the four helpers ``paged.py`` imports, taken verbatim (by ``ast``) from SGLang's own
``srt/utils/common.py``, and a ``sglang.srt.platforms.current_platform`` that says Triton is
supported where CUDA is (SGLang's CUDA platform says the same).

Run it where SGLang is installed (``.nox/peer-sglang/bin/python scripts/sglang_allocators.py
OUT``), carry ``OUT`` to the GPU machine and put it first on ``PYTHONPATH``; ``scripts/gpu_pairs.py``
then measures SGLang's allocators beside kvref's in one process. The SGLang version is written to
``OUT/sglang/VERSION``.
"""

from __future__ import annotations

import ast
import shutil
import sys
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

COPIED = (
    "srt/mem_cache/allocator/base.py",
    "srt/mem_cache/allocator/token.py",
    "srt/mem_cache/allocator/paged.py",
    "kernels/ops/memory/allocator.py",
)
HELPERS = ("is_hip", "get_bool_env_var", "next_power_of_2", "get_num_new_pages")
PLATFORM = '''"""Written by kvref's scripts/sglang_allocators.py: what paged.py reads of SGLang's platform."""
import types

import torch

current_platform = types.SimpleNamespace(capabilities=types.SimpleNamespace(supports_triton=torch.cuda.is_available()))
'''
ALLOCATOR_PACKAGE = '''"""Written by kvref's scripts/sglang_allocators.py: the allocators copied beside it."""
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
'''


def helpers_source(common: Path) -> str:
    """The functions named in :data:`HELPERS`, verbatim from SGLang's ``common.py``, as a module."""
    text = common.read_text()
    tree = ast.parse(text)
    found = {n.name: ast.get_source_segment(text, n) for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = [name for name in HELPERS if name not in found]
    if missing:
        raise SystemExit(f"sglang_allocators: {common} has no {', '.join(missing)}; this SGLang differs from 0.5.23")
    head = '"""Written by kvref\'s scripts/sglang_allocators.py: helpers verbatim from SGLang\'s common.py."""\n'
    head += "import os\nfrom typing import Optional\n\nimport torch\n\n\n"
    return head + "\n\n\n".join(str(found[name]) for name in HELPERS) + "\n"


def main(out: Path) -> int:
    spec = find_spec("sglang")
    if spec is None or spec.submodule_search_locations is None:
        print("sglang_allocators: SGLang is not installed in this Python", file=sys.stderr)
        return 3
    source = Path(next(iter(spec.submodule_search_locations)))
    target = out / "sglang"
    shutil.rmtree(target, ignore_errors=True)
    for relative in COPIED:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / relative, target / relative)
    for package in ("", "srt", "srt/mem_cache", "kernels", "kernels/ops", "kernels/ops/memory"):
        (target / package / "__init__.py").write_text("")
    (target / "srt/mem_cache/allocator/__init__.py").write_text(ALLOCATOR_PACKAGE)
    (target / "srt/utils").mkdir(parents=True, exist_ok=True)
    (target / "srt/utils/__init__.py").write_text(helpers_source(source / "srt/utils/common.py"))
    (target / "srt/platforms").mkdir(parents=True, exist_ok=True)
    (target / "srt/platforms/__init__.py").write_text(PLATFORM)
    (target / "VERSION").write_text(version("sglang") + "\n")
    print(f"sglang_allocators: SGLang {version('sglang')}'s allocators in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".sglang-allocators")))
