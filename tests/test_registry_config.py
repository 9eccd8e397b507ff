"""Chapter 09: backends by entry point, settings by precedence, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvref.config.registry import backend_names, backend_statuses, create_pool, load_backend
from kvref.config.settings import load_settings
from kvref.contract.errors import BackendUnavailableError, ConfigError
from kvref.contract.protocol import (
    Backend,
    BlockPool,
    PrefixCache,
    SupportsBatching,
    SupportsInvariants,
    SupportsPause,
)
from kvref.oracle import OracleBlockPool

rule = pytest.mark.rule


@rule("CONF-901")
def test_the_oracle_is_registered_like_any_other_backend() -> None:
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="kvref.backends")}
    assert "oracle" in names, f"no 'oracle' entry point in kvref.backends: {names}"
    backend = load_backend("oracle")
    assert isinstance(backend, Backend)
    pool = backend.create(8, policy="fifo")
    assert isinstance(pool, PrefixCache) and isinstance(pool, BlockPool)
    assert isinstance(pool, SupportsBatching) and isinstance(pool, SupportsPause)
    assert isinstance(pool, SupportsInvariants)


@rule("CONF-901")
def test_importing_kvref_loads_no_backend_and_nothing_heavy() -> None:
    code = (
        "import sys, kvref\n"
        "heavy = [m for m in ('torch', 'cupy', 'numpy', 'rich', 'hypothesis', 'kvref.oracle', 'cbor2') "
        "if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"import kvref pulled in {out.stdout.strip()}"


@rule("CONF-902")
def test_an_unknown_backend_is_refused_with_an_install_hint_and_no_fallback() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        load_backend("torch-not-here")
    assert "oracle" in str(info.value), "the message should list what is registered"
    if "torch" not in backend_names():
        with pytest.raises(BackendUnavailableError) as hinted:
            load_backend("torch")
        assert "pip install" in str(hinted.value), f"no install hint: {hinted.value}"


@rule("CONF-902")
def test_a_module_path_backend_that_cannot_load_says_why() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        load_backend("no_such_module_xyz:Backend")
    assert "ModuleNotFoundError" in str(info.value)
    with pytest.raises(BackendUnavailableError):
        load_backend("kvref.contract.errors:KVRefError")  # importable, but not a Backend


@rule("CONF-902")
def test_a_module_path_names_an_unregistered_implementation() -> None:
    backend = load_backend("kvref.oracle.backend:OracleBackend")
    assert backend.name == "oracle"


@rule("CONF-901", "CONF-912")
def test_a_module_path_resolves_from_the_current_directory_as_pytest_does(tmp_path: Path) -> None:
    """``kvref conformance --backend mypool:MyBackend``, run by the console script from the directory
    of ``mypool.py``: the module is found there (the script's own directory comes first on its path)."""
    (tmp_path / "kvref_adopter_pool.py").write_text(
        "from kvref.oracle.backend import OracleBackend\n\n\nclass MyBackend(OracleBackend):\n    name = 'mine'\n"
    )
    script = (
        "import os, sys\n"
        "sys.path = [p for p in sys.path if p not in ('', os.getcwd())]\n"
        "from kvref.config.registry import load_backend\n"
        "print(load_backend('kvref_adopter_pool:MyBackend').name)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "mine", run.stderr


@rule("CONF-903")
def test_settings_take_argument_then_environment_then_files_then_default(tmp_path: Path) -> None:
    assert load_settings(environ={}, cwd=tmp_path).backend == "oracle"
    (tmp_path / "pyproject.toml").write_text('[tool.kvref]\nbackend = "from-pyproject"\npolicy = "fifo"\n')
    s = load_settings(environ={}, cwd=tmp_path)
    assert (s.backend, s.policy) == ("from-pyproject", "fifo")
    (tmp_path / "kvref.toml").write_text('backend = "from-kvref-toml"\n')
    s = load_settings(environ={}, cwd=tmp_path)
    assert (s.backend, s.policy) == ("from-kvref-toml", "fifo"), "kvref.toml wins per key over pyproject"
    s = load_settings(environ={"KVREF_BACKEND": "from-env"}, cwd=tmp_path)
    assert s.backend == "from-env" and s.sources["backend"] == "KVREF_BACKEND"
    s = load_settings({"backend": "explicit"}, environ={"KVREF_BACKEND": "from-env"}, cwd=tmp_path)
    assert s.backend == "explicit" and s.sources["backend"] == "argument"
    assert s.sources["policy"].endswith("[tool.kvref]")


@rule("CONF-904")
@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"KVREF_POLICY": "lfu"}, "policy"),
        ({"KVREF_HASH": "md5"}, "hash"),
        ({"KVREF_BLOCK_SIZE": "0"}, "block-size"),
        ({"KVREF_DEVICE": "tpu"}, "device"),
        ({"KVREF_EVENTS": "maybe"}, "events"),
        ({"KVREF_BACKEND": "bad name!"}, "backend"),
    ],
)
def test_an_invalid_value_names_key_value_and_source(tmp_path: Path, env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ=env, cwd=tmp_path)
    message = str(info.value)
    assert key in message and next(iter(env.values())) in message and next(iter(env)) in message, message


@rule("CONF-904")
def test_an_invalid_file_value_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "kvref.toml").write_text("block-size = -4\n")
    with pytest.raises(ConfigError, match=r"kvref\.toml"):
        load_settings(environ={}, cwd=tmp_path)
    (tmp_path / "kvref.toml").write_text("block-size = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(environ={}, cwd=tmp_path)


@rule("CONF-905")
def test_unknown_keys_are_errors_not_silence(tmp_path: Path) -> None:
    (tmp_path / "kvref.toml").write_text('polcy = "lru"\n')
    with pytest.raises(ConfigError, match="polcy"):
        load_settings(environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="colour"):
        load_settings({"colour": "red"}, environ={}, cwd=tmp_path)


@rule("CONF-903")
def test_create_pool_uses_the_resolved_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVREF_POLICY", "lru-leaf")
    pool = create_pool(8)
    assert isinstance(pool, OracleBlockPool) and pool.policy.value == "lru-leaf"
    assert create_pool(8, policy="fifo").policy.value == "fifo"


@rule("CONF-906")
def test_backend_statuses_report_usability_device_and_capabilities() -> None:
    [oracle] = [s for s in backend_statuses() if s.name == "oracle"]
    assert oracle.usable and oracle.reason == "" and oracle.device == "host"
    assert {"prefix-cache", "policy-lru-leaf"} <= oracle.capabilities


@rule("CONF-907")
def test_the_oracle_refuses_a_device_it_cannot_use() -> None:
    with pytest.raises(ConfigError, match="cuda:0"):
        load_backend("oracle").create(8, device="cuda:0")


@rule("CONF-904")
@pytest.mark.parametrize("content", ['hash = ["sha256"]\n', "hash = {x = 1}\n", "block-size = true\n"])
def test_values_of_the_wrong_toml_type_are_config_errors(tmp_path: Path, content: str) -> None:
    (tmp_path / "kvref.toml").write_text(content)
    with pytest.raises(ConfigError):
        load_settings(environ={}, cwd=tmp_path)


@rule("CONF-904")
def test_a_file_that_is_not_utf8_or_has_a_scalar_tool_table_is_handled(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("tool = 3\n")
    assert load_settings(environ={}, cwd=tmp_path).backend == "oracle"
    (tmp_path / "kvref.toml").write_bytes(b"backend = '\xff'\n")
    with pytest.raises(ConfigError):
        load_settings(environ={}, cwd=tmp_path)


@rule("CONF-903")
def test_settings_accept_python_spellings_of_keys(tmp_path: Path) -> None:
    assert load_settings({"block_size": 4}, environ={}, cwd=tmp_path).block_size == 4


@rule("CONF-902")
def test_a_module_that_fails_at_import_is_reported_as_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_backend_mod.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendUnavailableError, match="boom"):
        load_backend("broken_backend_mod:Backend")
