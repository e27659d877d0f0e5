"""vllm_bench against the real tiny vLLM on the local host, and bench.yml with its reports."""

import csv
import json
import re

import pytest

from .conftest import unfolded

LEVELS = [1, 2, 4]
WORKLOAD = {"num_requests": 6, "input_len": 16, "output_len": 12}


def bench(deployed, check_mode=False, **args):
    """vllm_bench on the host (its system python3: fixed prompts) against tiny, with the small workload."""
    args = {"url": deployed.endpoint, "model": "tiny", "api_key": deployed.api_key, **WORKLOAD, **args}
    return deployed.module("llmops.vllm.vllm_bench", check_mode=check_mode, **args)


@pytest.fixture(scope="module")
def sweep(deployed):
    """One sweep over three levels."""
    result = bench(deployed, concurrency=LEVELS, warmup_requests=1, goodput={"ttft": 60000})
    assert not result.get("failed"), result.get("msg")
    return result


def test_a_sweep_measures_every_level_with_vllm_field_names(sweep):
    assert sweep["changed"] is False and sweep["prompt_source"] == "fixed"
    levels = sweep["levels"]
    assert [level["max_concurrency"] for level in levels] == LEVELS
    for level in levels:
        assert (level["completed"], level["failed"], level["errors"]) == (6, 0, [])
        # ignore_eos: every request generates exactly the asked length, counted by the server's usage.
        assert level["total_output_tokens"] == 6 * WORKLOAD["output_len"]
        assert level["total_input_tokens"] >= 6 * WORKLOAD["input_len"]
        assert level["output_throughput"] > 0 and level["request_throughput"] > 0
        assert level["total_token_throughput"] > level["output_throughput"]
        assert level["request_goodput"] == pytest.approx(level["request_throughput"])
        assert 0 < level["median_ttft_ms"] <= level["median_e2el_ms"]
        assert level["p99_e2el_ms"] >= level["p90_e2el_ms"] >= level["p50_e2el_ms"] == level["median_e2el_ms"]
        assert 0 < level["median_itl_ms"] < level["median_e2el_ms"] and level["mean_tpot_ms"] > 0
        assert level["duration"] * 1000 >= level["median_e2el_ms"]
        assert 0 < level["client_cpu_seconds"] < level["duration"]
    assert sweep["summary"]["completed"] == 18 and sweep["summary"]["failed"] == 0
    assert sweep["ansible_facts"]["vllm_bench_result"]["levels"] == levels


def test_the_chat_endpoint_is_measured_the_same_way(deployed):
    result = bench(deployed, endpoint="chat", concurrency=[2])
    assert not result.get("failed"), result.get("msg")
    level = result["levels"][0]
    assert (level["completed"], level["total_output_tokens"]) == (6, 6 * WORKLOAD["output_len"])
    assert 0 < level["median_ttft_ms"] <= level["median_e2el_ms"]


def test_a_wrong_api_key_counts_failed_requests_and_fails_with_the_server_answer(deployed):
    result = bench(deployed, api_key="wrong", concurrency=[2])
    assert result["failed"]
    assert result["msg"] == 'C=2: 6 of 6 requests failed (first error: HTTP 401 Unauthorized: {"error":"Unauthorized"})'
    assert (result["levels"][0]["completed"], result["levels"][0]["failed"]) == (0, 6)
    assert "wrong" not in json.dumps(result)


def test_a_model_the_server_does_not_serve_is_named_in_the_error(deployed):
    result = bench(deployed, model="not-served", concurrency=[1], max_failed_percent=100)
    assert not result.get("failed"), "max_failed_percent 100 tolerates failures"
    level = result["levels"][0]
    assert (level["completed"], level["failed"]) == (0, 6)
    assert level["errors"][0].startswith("HTTP 404 Not Found") and "not-served" in level["errors"][0]


def test_a_regression_against_the_baseline_fails_with_both_numbers(deployed, sweep):
    inflated = {
        "levels": [{**level, "output_throughput": level["output_throughput"] * 10} for level in sweep["levels"]]
    }
    result = bench(deployed, concurrency=[1], baseline=inflated, max_regression_percent=20)
    assert result["failed"]
    comparison = result["comparisons"][0]
    assert comparison["regressed"] and comparison["baseline"] == sweep["levels"][0]["output_throughput"] * 10
    assert result["msg"].startswith(
        f"regression: C=1 output_throughput: {comparison['current']:.2f}"
        f" against the baseline's {comparison['baseline']:.2f}"
    )


def test_check_mode_sends_nothing(deployed):
    result = bench(deployed, check_mode=True, concurrency=[1])
    assert result["changed"] is False and "levels" not in result and "no request sent" in result["msg"]


def test_bad_options_fail_before_any_request(deployed):
    result = bench(deployed, concurrency=[0, 4])
    assert result["failed"] and result["msg"] == "concurrency must list levels of 1 or more, got [0, 4]"


def run_bench_playbook(deployed, **overrides):
    """bench.yml for tiny with a small workload (two levels of four requests) and the given variables."""
    extra_vars = {
        "vllm_bench_concurrency": [1, 2],
        "vllm_bench_num_requests": 4,
        "vllm_bench_input_len": 16,
        "vllm_bench_output_len": 8,
        **overrides,
    }
    return deployed.playbook("playbooks/bench.yml", "-e", "model=tiny", "-e", json.dumps(extra_vars))


def test_the_playbook_refuses_a_bad_option_by_its_name_before_it_reads_the_host(deployed, tmp_path):
    proc = run_bench_playbook(deployed, vllm_bench_concurrency=[0], vllm_bench_report_dir=str(tmp_path))
    assert proc.returncode != 0
    output = unfolded(proc)
    assert "vllm_bench_concurrency must list levels of 1 or more, got [0]" in output, output[-3000:]
    # The refusal is the play's first word on the host: no record read, no request sent, no report written.
    assert "Read the record of tiny" not in output and "Benchmark the instance" not in output, output[-3000:]
    assert not any(tmp_path.iterdir())


def test_the_playbook_writes_reports_and_ends_with_the_fleet_table(deployed, tmp_path):
    proc = run_bench_playbook(deployed, vllm_bench_report_dir=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # The table is padded Markdown, so that its columns line up; the callback may wrap its long lines.
    header = re.compile(r"\| host +\| +C=1 \| +C=2 \|")
    output = " ".join(proc.stdout.split())
    assert f"| {deployed.name} | " in output and header.search(output)
    assert deployed.api_key not in proc.stdout
    saved = json.loads((tmp_path / f"{deployed.name}.json").read_text())
    assert [level["max_concurrency"] for level in saved["levels"]] == [1, 2]
    # From the host the role uses the vLLM venv's interpreter, which has tokenizers: random token prompts, whose
    # length may differ by a token or two (random tokens merge when encoded again; the server adds BOS).
    assert saved["summary"]["prompt_source"] == "tokenizer"
    assert all(4 * 16 <= level["total_input_tokens"] <= 4 * 19 for level in saved["levels"])
    rows = list(csv.DictReader((tmp_path / "levels.csv").open()))
    assert [(row["host"], row["max_concurrency"], row["failed"]) for row in rows] == [
        (deployed.name, "1", "0"),
        (deployed.name, "2", "0"),
    ]
    assert header.match((tmp_path / "fleet.md").read_text())
    assert (tmp_path / f"{deployed.name}.md").read_text().count("\n| ") == 3
    assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG")

    # The saved JSON serves as the baseline of the next run, here from the controller. The test container
    # publishes no port, so every request fails there, and the play says why.
    again = run_bench_playbook(
        deployed,
        vllm_bench_report_dir=str(tmp_path / "again"),
        vllm_bench_baseline=str(tmp_path / f"{deployed.name}.json"),
        vllm_bench_from="controller",
        vllm_endpoint_url="http://127.0.0.1:1",
    )
    assert again.returncode != 0
    assert (
        "6 of 6 requests failed" not in again.stdout
        and "4 of 4 requests failed (first error: ConnectionRefusedError" in again.stdout
    )
