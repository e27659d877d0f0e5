import json

from ansible_collections.llmops.vllm.plugins.modules import vllm_tune_report

WORKLOAD = {"concurrency": [1, 4], "num_requests": 8, "input_len": 32, "output_len": 16, "endpoint": "completions"}


def args(dest, **changes):
    levels = [{"max_concurrency": 1, "output_throughput": 100.0, "median_ttft_ms": 20.0},
              {"max_concurrency": 4, "output_throughput": 250.0, "median_ttft_ms": 45.0}]  # fmt: skip
    candidates = [{"name": "default", "key": "k1", "verdict": "measured", "load_s": 20.0, "levels": levels}]
    base = {"dest": str(dest), "host": "it17", "model": "tiny", "instance": "tiny", "workload": WORKLOAD,
            "candidates": candidates, "runs": [{"started": "t", "total_s": 60, "loads_s": 20, "benchmarks_s": 5}],
            "state": {"in_progress": False, "serving": True}}  # fmt: skip
    return {**base, **changes}


def test_writes_the_json_the_table_and_the_plot_then_changes_nothing(run_module, tmp_path):
    result = run_module(vllm_tune_report.main, args(tmp_path / "tiny"))
    assert result["changed"] and result["winner"]["name"] == "default"
    assert result["time"] == {"started": "t", "total_s": 60.0, "loads_s": 20.0, "benchmarks_s": 5.0, "stops_s": 0.0,
                              "overhead_s": 35.0}  # fmt: skip
    saved = json.loads((tmp_path / "tiny" / "it17.json").read_text())
    assert saved["candidates"][0]["key"] == "k1" and saved["state"] == {"in_progress": False, "serving": True}
    assert (tmp_path / "tiny" / "it17.md").read_text() == result["table"]
    assert (tmp_path / "tiny" / "it17.svg").read_text().startswith("<svg")
    assert run_module(vllm_tune_report.main, args(tmp_path / "tiny"))["changed"] is False


def test_check_mode_writes_nothing(run_module, tmp_path):
    result = run_module(vllm_tune_report.main, {**args(tmp_path / "tiny"), "_ansible_check_mode": True})
    assert result["changed"] and "| default |" in result["table"].replace("**", "")
    assert not (tmp_path / "tiny").exists()


def test_an_objective_on_a_level_not_measured_fails_before_writing(run_module, tmp_path):
    result = run_module(vllm_tune_report.main, args(tmp_path / "tiny", concurrency=8), fails=True)
    assert "concurrency 8 is not one of the levels benchmarked" in result["msg"]
    assert not (tmp_path / "tiny").exists()
