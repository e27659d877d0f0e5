import re
from xml.etree import ElementTree

from ansible_collections.llmops.vllm.plugins.module_utils.tune.report import markdown, short_reason, svg
from ansible_collections.llmops.vllm.plugins.module_utils.tune.winner import winner

SVG = "{http://www.w3.org/2000/svg}"


def level(concurrency, throughput, ttft):
    return {"max_concurrency": concurrency, "output_throughput": throughput, "median_ttft_ms": ttft, "p99_itl_ms": 9}


def report(slo=None):
    candidates = [
        {"name": "default max_num_seqs=4", "key": "a", "verdict": "measured", "load_s": 24.31, "resumed": True,
         "levels": [level(1, 150, 12), level(4, 300, 30)], "reason": ""},
        {"name": "default max_num_seqs=16", "key": "b", "verdict": "measured", "load_s": 22.0,
         "levels": [level(1, 160, 11), level(4, 420, 25)], "reason": ""},
        {"name": "default max_num_seqs=64", "key": "c", "verdict": "failed", "load_s": 9.5, "levels": [],
         "reason": "failed while loading: max_num_batched_tokens (32) must be >= max_num_seqs (64)"},
        {"name": "tp3", "key": "d", "verdict": "refused", "load_s": None, "levels": [],
         "reason": "Layout rule attention_heads failed | 4 heads"},
    ]  # fmt: skip
    objective = {"concurrency": 0, "slo": slo or {}}
    data = {"model": "tiny_tune", "host": "it17", "instance": "tiny_tune", "candidates": candidates,
            "workload": {"concurrency": [1, 4], "num_requests": 8, "input_len": 32, "output_len": 16,
                         "endpoint": "completions"},
            "objective": objective, "winner": winner(candidates, 0, slo or {}),
            "runs": [{"total_s": 120, "loads_s": 55.8, "benchmarks_s": 10, "stops_s": 4, "measured": 3,
                      "resumed": 1}]}  # fmt: skip
    return data


def test_the_table_has_a_row_per_candidate_with_its_verdict_load_and_figures_per_level():
    text = markdown(report())
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert rows[0] == "| candidate | verdict | load s | C=1 tok/s (TTFT ms) | C=4 tok/s (TTFT ms) | SLO met | note |"
    assert rows[1] == (
        "| default max_num_seqs=4 | measured | 24.3 | 150 (12) | 300 (30) | n/a | measured in an earlier run |"
    )
    assert rows[2].startswith("| **default max_num_seqs=16** | measured | 22.0 | 160 (11) | 420 (25) |")
    assert "| failed | 9.5 | - | - | - | failed while loading: max_num_batched_tokens (32)" in rows[3]
    assert rows[4] == "| tp3 | refused | - | - | - | - | Layout rule attention_heads failed \\| 4 heads |"
    assert "Winner: default max_num_seqs=16: 420 output tok/s at C=4" in text
    assert "This run: 120 s in all = loads 55.8 + benchmarks 10 + stops 4 + the collection's own 50.2" in text


def test_the_slo_column_says_to_which_level_it_is_met():
    rows = [line for line in markdown(report({"median_ttft_ms": 26})).splitlines() if "| measured |" in line]
    assert "| yes, to C=1 |" in rows[0] and "| yes, to C=4 |" in rows[1]


def test_the_plot_draws_each_measured_candidate_and_rings_the_pareto_front():
    root = ElementTree.fromstring(svg(report()))
    lines = [node for node in root.iter(f"{SVG}polyline") if node.get("class") != "pareto"]
    assert len(lines) == 2, "one line per measured candidate, none for the failed or refused"
    rings = [node for node in root.iter(f"{SVG}circle") if node.get("class") == "pareto"]
    # (11, 160), (25, 420) of b beat (12, 150) and (30, 300) of a.
    assert len(rings) == 2
    texts = [node.text for node in root.iter(f"{SVG}text")]
    assert "default max_num_seqs=16 (winner)" in texts and "Pareto front (2 points)" in texts
    assert "median TTFT (ms)" in texts and "output tokens/s" in texts


def test_a_plot_without_measurements_says_so():
    data = report()
    data["candidates"] = [candidate for candidate in data["candidates"] if candidate["verdict"] != "measured"]
    assert re.search(r">no candidate was measured<", svg(data))


def test_a_server_that_did_not_load_is_noted_by_the_errors_its_journal_names_first():
    reason = "\n".join([
        "Start the new instance and wait until it serves tiny_tune_tune_6bc4d03336: vllm-tiny_tune-tune.service"
        " failed while loading: result exit-code, main process exited with status 1",
        "Errors in its journal (the first is usually the cause):",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
        "  Value error, max_num_batched_tokens (32) must be greater than or equal to max_num_seqs (64)."
        " [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]",
        "Last lines of its journal:",
        "  File ...; rolled back, nothing serves again",
    ])  # fmt: skip
    assert short_reason(reason) == (
        "did not load: pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig"
        " Value error, max_num_batched_tokens (32) must be greater than or equal to max_num_seqs (64)."
    )
    assert short_reason("x" * 300).endswith("...") and len(short_reason("x" * 300)) == 240
