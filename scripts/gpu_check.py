"""The GPU checks, on a CUDA machine, in the Python that runs this script: nothing from an index.

A GPU machine often has no network, and its torch and CuPy builds match its driver; a fresh
virtual environment would fetch other builds. So this script (which ``nox -s gpu`` also calls)
uses the interpreter it runs in:

1. it checks that torch and CuPy see a CUDA device and that what the tests need imports, naming
   whatever is missing (carry its wheel: ``pip install --no-index --no-deps WHEEL``);
2. it installs kvref from this checkout, editable, without dependencies and without an index;
3. it runs the conformance suite of torch and CuPy on ``cuda:0`` (results in ``results/gpu/``,
   the device named in each file; spread over processes with pytest-xdist where it is installed),
   the CUDA tests (``kvref_cuda``'s kernels beside the array path among them), the side-by-side pairs of
   ``scripts/gpu_pairs.py`` (with SGLang's allocators where ``.sglang-allocators/`` holds them:
   ``scripts/sglang_allocators.py`` makes it) and the benchmarks on ``cuda:0``.

Run it from the repository root: ``python scripts/gpu_check.py [--skip-bench] [--verdicts DIR] [-- PYTEST ARGS]``
(``--verdicts results/verdicts`` adds the CUDA runs' verdict files to the committed set).
It exits non-zero at the first step that fails, and with status 3 (saying why) where there is no
CUDA device or something it needs is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys

NEEDS = ("torch", "cupy", "numpy", "hypothesis", "pytest", "pytest_benchmark", "cbor2", "xxhash", "rich", "setuptools")
RESULTS = "results/gpu"
SGLANG = ".sglang-allocators"


def run(*argv: str, env: dict[str, str] | None = None) -> None:
    """Run ``argv`` with this interpreter; stop here with its status when it fails."""
    print("+", " ".join(argv), flush=True)
    done = subprocess.run([sys.executable, *argv], check=False, env=env)
    if done.returncode:
        sys.exit(done.returncode)


def cuda_seen() -> str | None:
    """None when torch and CuPy both see a CUDA device; else why not."""
    import cupy
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not cupy.cuda.is_available():
        return "CuPy sees no CUDA device"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--skip-bench", action="store_true", help="conformance and CUDA tests only")
    parser.add_argument("--verdicts", help="also write each conformance run's verdict file into this directory")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to the benchmark run")
    args = parser.parse_args()
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        print(f"gpu_check: missing here: {', '.join(missing)}; carry their wheels (no index is used)", file=sys.stderr)
        return 3
    why = cuda_seen()
    if why is not None:
        print(f"gpu_check: {why}; the GPU checks need a CUDA machine", file=sys.stderr)
        return 3
    run("-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-e", ".")
    os.makedirs(RESULTS, exist_ok=True)
    spread = ["-n", str(min(6, os.cpu_count() or 1))] if importlib.util.find_spec("xdist") is not None else []
    for backend in ("torch", "cupy"):
        run(
            "-m",
            "kvref",
            "conformance",
            "--backend",
            backend,
            "--device",
            "cuda:0",
            "--profile",
            "ci",
            "--results",
            RESULTS,
            *(["--verdicts", args.verdicts] if args.verdicts else []),
            "--",
            *spread,
        )
    run("-m", "pytest", "tests/test_array_backends.py", "-k", "cuda", "-p", "no:cacheprovider")
    run("-m", "pytest", "tests/test_cuda_kernels.py", "-p", "no:cacheprovider", *spread)  # kvref_cuda's kernels
    if not args.skip_bench:
        env = dict(os.environ)
        if os.path.isdir(SGLANG):  # SGLang's allocators, copied out of an installed SGLang, beside kvref's
            env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(SGLANG), env.get("PYTHONPATH")) if p)
        run("scripts/gpu_pairs.py", "--device", "cuda:0", "--out", f"{RESULTS}/pairs", env=env)
        run(
            "-m",
            "pytest",
            "tests/bench",
            "--benchmark-enable",
            "--benchmark-only",
            "--kvref-bench-device=cuda:0",
            f"--benchmark-json={RESULTS}/bench.json",
            "-p",
            "no:cacheprovider",
            *args.pytest_args,
        )
    print(f"gpu_check: passed; results in {RESULTS}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
