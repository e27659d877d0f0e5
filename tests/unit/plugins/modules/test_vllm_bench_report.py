"""vllm_bench_report writes each report only when it differs, and nothing in check mode."""

import os

from ansible_collections.llmops.vllm.plugins.modules import vllm_bench_report

LEVEL = {"max_concurrency": 1, "output_throughput": 84.0, "median_ttft_ms": 70.0, "median_tpot_ms": 1.5, "failed": 0}
SUMMARY = {"model": "tiny", "endpoint": "completions", "input_len": 128, "output_len": 128, "prompt_source": "random"}
FORMATS = ["json", "csv", "markdown"]


def args(dest, throughput=84.0):
    result = {"summary": SUMMARY, "levels": [{**LEVEL, "output_throughput": throughput}]}
    return {"results": {"gpu1": result}, "dest": str(dest), "formats": FORMATS}


def test_a_second_run_writes_nothing_and_a_new_result_only_what_it_changes(run_module, tmp_path):
    dest = tmp_path / "bench-results" / "tiny"
    first = run_module(vllm_bench_report.main, args(dest))
    names = ["gpu1.json", "gpu1.md", "levels.csv", "fleet.md"]
    assert first["changed"] and first["written"] == first["files"] == [str(dest / name) for name in names]
    assert sorted(os.listdir(dest)) == sorted(names)
    again = run_module(vllm_bench_report.main, args(dest))
    assert not again["changed"] and again["written"] == []
    faster = run_module(vllm_bench_report.main, args(dest, throughput=90.0))
    assert faster["changed"] and "90" in (dest / "fleet.md").read_text()


def test_check_mode_writes_nothing(run_module, tmp_path):
    dest = tmp_path / "tiny"
    result = run_module(vllm_bench_report.main, {**args(dest), "_ansible_check_mode": True})
    assert result["changed"] and len(result["written"]) == 4
    assert not dest.exists()
