import csv
import io
import json

from ansible_collections.llmops.vllm.plugins.module_utils.bench.report import (
    fleet_markdown,
    host_markdown,
    levels_csv,
    plot_png,
    result_json,
)
from ansible_collections.llmops.vllm.plugins.module_utils.bench.statistics import regressions


def level(concurrency, throughput, ttft, failed=0, errors=()):
    return {
        "max_concurrency": concurrency,
        "num_requests": 8,
        "completed": 8 - failed,
        "failed": failed,
        "errors": list(errors),
        "request_throughput": throughput / 128,
        "output_throughput": throughput,
        "total_token_throughput": throughput * 2,
        "median_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 2,
        "median_tpot_ms": 1.5,
        "median_itl_ms": 1.4,
        "median_e2el_ms": 200.0,
        "client_cpu_seconds_per_1k_output_tokens": 0.05,
    }


SUMMARY = {
    "model": "tiny",
    "endpoint": "completions",
    "input_len": 128,
    "output_len": 128,
    "prompt_source": "tokenizer",
}
RESULTS = {
    "gpu2": {
        "summary": SUMMARY,
        "levels": [level(1, 61.4, 80.2), level(8, 410.0, 95.0, failed=1, errors=["HTTP 500"])],
    },
    "gpu1": {"summary": SUMMARY, "levels": [level(1, 84.0, 70.0), level(32, 2500.0, 120.0)]},
}


def cells(line):
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_fleet_table_is_host_by_concurrency():
    table = fleet_markdown(RESULTS).splitlines()
    assert [cells(line) for line in table[:1] + table[2:]] == [
        ["host", "C=1", "C=8", "C=32"],
        ["gpu1", "84 tok/s, TTFT 70 ms", "-", "2500 tok/s, TTFT 120 ms"],
        ["gpu2", "61 tok/s, TTFT 80 ms", "410 tok/s, TTFT 95 ms, 1 failed", "-"],
    ]
    # Padded: every line as wide as the header, the levels right-aligned.
    assert {len(line) for line in table} == {len(table[0])}
    assert table[1].startswith("|------|") and table[1].endswith(":|")


def test_the_host_table_has_a_row_per_level():
    table = host_markdown("gpu2", RESULTS["gpu2"]).splitlines()
    assert table[0] == "### gpu2: tiny (completions, 128 in / 128 out, tokenizer prompts)"
    assert cells(table[2])[:5] == ["C", "requests", "failed", "req/s", "output tok/s"]
    assert cells(table[5]) == [
        "8",
        "8",
        "1",
        "3.20",
        "410.0",
        "820.0",
        "95.0",
        "190.0",
        "1.50",
        "1.40",
        "200.0",
        "0.050",
    ]
    assert len(table) == 6


def test_the_csv_has_every_field_and_joins_the_errors():
    rows = list(csv.DictReader(io.StringIO(levels_csv(RESULTS))))
    hosts_and_levels = [(row["host"], row["max_concurrency"]) for row in rows]
    assert hosts_and_levels == [("gpu1", "1"), ("gpu1", "32"), ("gpu2", "1"), ("gpu2", "8")]
    assert rows[3]["errors"] == "HTTP 500" and float(rows[3]["output_throughput"]) == 410.0


def test_the_saved_json_is_a_baseline():
    saved = json.loads(result_json(RESULTS["gpu1"]))
    comparisons, regressed = regressions([level(1, 42.0, 70.0)], saved["levels"], ["output_throughput"], 10)
    assert comparisons[0]["change_percent"] == -50.0 and regressed


def test_the_plot_is_a_png_and_the_same_results_give_the_same_bytes():
    image = plot_png(RESULTS)
    assert image.startswith(b"\x89PNG\r\n\x1a\n") and image == plot_png(RESULTS)
