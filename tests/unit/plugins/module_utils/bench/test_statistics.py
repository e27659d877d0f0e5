"""A level's statistics as numpy and `vllm bench serve` compute them, and the comparison with a baseline."""

import random

import numpy
import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.statistics import (
    describe,
    level_metrics,
    percentile,
    regressions,
)
from ansible_collections.llmops.vllm.plugins.module_utils.bench.streamed_response import RequestResult


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 1.5, 9.25, 2.0, 7.0]])
def test_statistics_agree_with_numpy(values):
    for p in (0.1, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(values, p) == pytest.approx(numpy.percentile(values, p))
    stats = describe(values, [50, 90, 99.9])
    assert stats["mean"] == pytest.approx(numpy.mean(values))
    assert stats["median"] == pytest.approx(numpy.median(values))
    assert stats["std"] == pytest.approx(numpy.std(values))
    assert stats["p99.9"] == pytest.approx(numpy.percentile(values, 99.9))


def test_statistics_agree_with_numpy_on_random_samples():
    rng = random.Random(3)
    for size in (2, 17, 1000):
        values = [rng.expovariate(10) for _sample in range(size)]
        for p in (50, 90, 99):
            assert percentile(values, p) == pytest.approx(numpy.percentile(values, p))


def test_an_empty_sample_counts_as_zero_as_in_vllm():
    assert describe([], [99]) == {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}


def result(ttft, latency, tokens, itl=(), prompt=10):
    return RequestResult(
        start=0.0, ttft=ttft, itl=list(itl), latency=latency, prompt_tokens=prompt, output_tokens=tokens, success=True
    )


def test_level_metrics_use_vllm_definitions_and_count_failures():
    results = [
        result(0.1, 1.1, 11, itl=[0.1] * 10),
        result(0.3, 0.3, 1),  # one token: no TPOT, no ITL
        RequestResult(start=0.0, error="HTTP 500 Internal Server Error"),
        RequestResult(start=0.0, error="timed out"),
    ]
    metrics = level_metrics(results, duration=2.0, percentiles=[50, 99], slos={"ttft": 200})
    assert (metrics["completed"], metrics["failed"]) == (2, 2)
    assert metrics["errors"] == ["HTTP 500 Internal Server Error", "timed out"]
    assert metrics["total_output_tokens"] == 12 and metrics["total_input_tokens"] == 20
    assert metrics["output_throughput"] == 6.0 and metrics["total_token_throughput"] == 16.0
    assert metrics["request_throughput"] == 1.0 and metrics["request_goodput"] == 0.5
    assert metrics["mean_tpot_ms"] == pytest.approx(100.0)  # (1.1 - 0.1) / (11 - 1), only the long request
    assert metrics["median_ttft_ms"] == pytest.approx(200.0)
    assert metrics["p99_e2el_ms"] == pytest.approx(numpy.percentile([1100, 300], 99))
    assert metrics["mean_itl_ms"] == pytest.approx(100.0)


def test_goodput_is_none_without_slos():
    assert level_metrics([result(0.1, 1, 2)], 1.0, [50])["request_goodput"] is None


def test_regressions_know_which_way_is_better():
    baseline = [{"max_concurrency": 8, "output_throughput": 1000.0, "median_ttft_ms": 50.0}]
    slower = [
        {"max_concurrency": 8, "output_throughput": 850.0, "median_ttft_ms": 54.0},
        {"max_concurrency": 64, "output_throughput": 1.0, "median_ttft_ms": 1.0},
    ]
    comparisons, regressed = regressions(slower, baseline, ["output_throughput", "median_ttft_ms"], 10)
    assert [(c["metric"], round(c["change_percent"], 1), c["regressed"]) for c in comparisons] == [
        ("output_throughput", -15.0, True),
        ("median_ttft_ms", 8.0, False),
    ]
    assert [c["metric"] for c in regressed] == ["output_throughput"]
    faster = [{"max_concurrency": 8, "output_throughput": 2000.0, "median_ttft_ms": 60.0}]
    assert [c["metric"] for c in regressions(faster, baseline, ["output_throughput", "median_ttft_ms"], 10)[1]] == [
        "median_ttft_ms"
    ]


def test_a_baseline_without_the_levels_is_an_error():
    with pytest.raises(BenchError, match=r"the baseline has none of the levels \[4\] \(it has \[1, 8\]\)"):
        baseline = [{"max_concurrency": 1}, {"max_concurrency": 8}]
        regressions([{"max_concurrency": 4}], baseline, ["output_throughput"], 5)


def test_an_unknown_regression_metric_is_an_error():
    with pytest.raises(BenchError, match="p95_ttft_ms is missing"):
        regressions([{"max_concurrency": 1}], [{"max_concurrency": 1}], ["p95_ttft_ms"], 5)
