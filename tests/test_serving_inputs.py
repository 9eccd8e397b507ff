"""Chapter 10, serving replay: what it reads (named blocks, Azure traces, the catalog) and what it prints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvref.cli.main import main
from kvref.contract.errors import InvalidValueError
from kvref.contract.hashing import hash_token_blocks
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.reports.serving import render_serving_markdown
from kvref.simulation.catalog import CATALOG, catalog_trace, fetch_trace, resolve_trace
from kvref.simulation.serving import ServedRequest, ServingReplay, ServingWorkload, StepModel, workload_from_trace
from kvref.simulation.serving.azure import AzurePrefixes, load_azure_trace
from kvref.simulation.traces import TraceError, load_trace

rule = pytest.mark.rule
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@rule("TRACE-1038")
def test_a_request_known_by_its_block_ids_hashes_later_tokens_as_if_it_had_hashed_its_prompt() -> None:
    prompt = list(range(40))
    by_tokens = Request("a", prompt, block_size=16)
    named = Request.from_block_hashes("b", 40, by_tokens.block_hashes, block_size=16)
    assert named.block_hashes == by_tokens.block_hashes and named.num_tokens == 40
    named.append_output_token_ids([0] * 8)  # the named prompt's last 8 tokens read as zeros
    expected = hash_token_blocks([*prompt[:32], *([0] * 8), *([0] * 8)], 16)
    assert named.block_hashes == [*by_tokens.block_hashes, expected[2]]
    with pytest.raises(InvalidValueError, match="REQ-702"):
        Request.from_block_hashes("c", 40, [1, 2, 3], block_size=16)


@rule("TRACE-1038")
def test_named_prompts_hit_each_other_and_their_outputs_are_never_hit() -> None:
    first = ServedRequest(0, 40, 30, block_ids=(1, 2, 3))
    again = ServedRequest(100_000, 70, 1, block_ids=(1, 2, 3, 4, 5))  # re-sends blocks 1 and 2, then new ones
    w = ServingWorkload((first, again), 16, "named", outputs_hit=False, fixed_block_size=True)
    manager = RequestManager(OracleBlockPool(50), block_size=16, max_model_len=1000)
    r = ServingReplay(w, manager, StepModel()).run()
    assert r.block_hits == 2 and r.token_hits == 32, "the second request hits the two full blocks they share"
    assert first.output_token(0, 0) != first.output_token(1, 0), "outputs without identity belong to one request"


@rule("TRACE-1046")
def test_reports_say_when_outputs_are_not_hit_and_the_block_size_is_the_traces(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n')
    w = workload_from_trace(load_trace(path))
    assert "never hit" in w.note and "512" in w.note and "block size is the trace's own" in w.note
    text = render_serving_markdown([], title="t", notes=[w.note])
    assert w.note in text


def azure_file(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text("\n".join(["TIMESTAMP,ContextTokens,GeneratedTokens", *lines]) + "\n")
    return path


@rule("TRACE-1045")
def test_azure_requests_get_a_seeded_shared_prefix_structure(tmp_path: Path) -> None:
    lines = [f"2023-11-16 18:17:{i // 10:02d}.{i % 10}000000,{300 + 37 * i},{i % 7}" for i in range(200)]
    path = azure_file(tmp_path, lines)
    one = load_azure_trace(path, block_size=16, prefixes=AzurePrefixes(seed=3))
    two = load_azure_trace(path, block_size=16, prefixes=AzurePrefixes(seed=3))
    other = load_azure_trace(path, block_size=16, prefixes=AzurePrefixes(seed=4))
    assert one.requests == two.requests and one.requests != other.requests, "a pure function of the seed"
    assert one.requests[1].arrival_us == 100_000, "arrivals from the first timestamp, in microseconds"
    for r in one.requests:
        assert len(r.block_ids or ()) == -(-r.prompt_length // 16), "one id per block (TRACE-1002)"
    firsts = [r.block_ids[0] for r in one.requests if r.block_ids]
    shared = sum(firsts.count(f) > 1 for f in set(firsts))
    assert 1 <= shared <= 8, f"{shared} first blocks shared: at most the 8 prefixes"
    opened = sum(firsts.count(f) for f in set(firsts) if firsts.count(f) > 1) / len(firsts)
    assert 0.35 < opened < 0.65, f"about half the requests open with a shared prefix, {opened:.0%} did"
    structure = AzurePrefixes(seed=3)
    assert all(256 <= n <= 2048 for n in structure.lengths)
    assert "50% of requests" in one.note and "never hit" in one.note


@rule("TRACE-1045")
@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("2023-11-16 18:17:03.97,abc,3", "ContextTokens"),
        ("2023-11-16 18:17:03.97,12", "3 columns"),
        ("16/11/2023 18:17,12,3", "TIMESTAMP"),
        ("2023-11-16 18:17:03.97,0,3", "ContextTokens"),
        ("2023-11-16 18:17:02.00,12,3", "before the previous"),
    ],
)
def test_a_malformed_azure_line_is_named_by_file_and_line(tmp_path: Path, line: str, why: str) -> None:
    path = azure_file(tmp_path, ["2023-11-16 18:17:03.00,10,2", line])
    with pytest.raises(TraceError, match=why) as caught:
        load_azure_trace(path)
    assert f"{path}:3" in str(caught.value)


@rule("TRACE-1045")
def test_the_real_azure_traces_load(tmp_path: Path) -> None:
    path = TRACES / "AzureLLMInferenceTrace_code.csv"
    if not path.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    w = load_azure_trace(path)
    assert len(w.requests) == 8819 and w.requests[0].arrival_us == 0


@rule("TRACE-1044")
def test_fetching_checks_the_checksum_and_keeps_a_bad_download_under_no_name(tmp_path: Path) -> None:
    entry = CATALOG[0]
    bogus = tmp_path / "elsewhere" / entry.filename
    bogus.parent.mkdir()
    bogus.write_text("not the trace\n")
    cache = tmp_path / "cache"
    with pytest.raises(TraceError, match="TRACE-1044") as caught:
        fetch_trace(entry.name, directory=cache, url=bogus.as_uri())
    assert entry.sha256 in str(caught.value)
    assert list(cache.iterdir()) == [], "nothing is left in the cache, under the trace's name or any other"
    with pytest.raises(TraceError, match="no trace called"):
        fetch_trace("no-such-trace", directory=cache)


@rule("TRACE-1044")
def test_a_fetched_catalog_trace_is_found_by_name_and_a_changed_copy_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = catalog_trace("azure-code-2023")
    assert entry is not None
    source = TRACES / entry.filename
    if not source.exists():
        pytest.skip("../shared/traces is not beside this checkout")
    monkeypatch.setenv("KVREF_TRACE_CACHE", str(tmp_path))
    with pytest.raises(TraceError, match="kvref traces fetch azure-code-2023"):
        resolve_trace("azure-code-2023")
    fetched = fetch_trace(entry.name, url=source.as_uri())
    assert fetched == tmp_path / entry.filename
    assert resolve_trace("azure-code-2023") == (fetched, entry)
    shutil.copyfile(source, fetched)
    with fetched.open("a") as fh:
        fh.write("2023-11-16 19:20:00.0,1,1\n")
    with pytest.raises(TraceError, match="not the published trace"):
        resolve_trace("azure-code-2023")


def test_serve_replay_prints_json_for_the_built_in_workload(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve-replay", "--capacity", "120", "--policy", "lru", "--workers", "1", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    (result,) = data["results"]
    assert result["capacity"] == 120 and result["policy"] == "lru" and result["counted_requests"] == 240
    assert result["belady_token_hits"] is None, "outputs hit later turns here, so no prompt-only Belady"
    assert any("output tokens are the workload's own" in n for n in data["notes"])


def test_serve_replay_writes_the_report_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    code = main(
        [
            "serve-replay",
            "--capacity",
            "80",
            "--capacity",
            "300",
            "--policy",
            "lru",
            "--policy",
            "fifo",
            "--workers",
            "1",
            "--target-hit-rate",
            "0.2",
            "--range",
            "57:2000",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["serving-blocks.png", "serving-hit-rate.png", "serving-ttft.png", "serving.json", "serving.md"]
    data = json.loads((out / "serving.json").read_text())
    assert data["sizing"]["capacity"] is not None and len(data["results"]) == 4
    assert "## Cache sizing" in (out / "serving.md").read_text()


def test_serve_replay_errors_name_the_rule_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["serve-replay", "--capacity", "0", "--workers", "1"]) == 2
    assert "TRACE-1030" in capsys.readouterr().err
    monkeypatch.setenv("KVREF_TRACE_CACHE", str(tmp_path))
    assert main(["serve-replay", "mooncake-conversation"]) == 2
    err = capsys.readouterr().err
    assert "TRACE-1044" in err and "kvref traces fetch mooncake-conversation" in err, err


def test_traces_list_names_every_catalog_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["traces", "list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for entry in CATALOG:
        assert entry.name in out and entry.sha256 in out
