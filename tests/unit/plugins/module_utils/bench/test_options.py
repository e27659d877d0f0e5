"""A benchmark's options, refused by their name before anything is read: the module's and the role's names."""

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.options import check_options, option_problem

GOOD = {
    "instance": "tiny",
    "concurrency": [1, 8],
    "input_len": 128,
    "output_len": 128,
    "warmup_requests": 2,
    "seed": 0,
    "num_requests": None,
    "duration": None,
    "request_timeout": 600,
    "max_regression_percent": 10,
    "goodput": {},
    "percentiles": [99],
}


def test_good_options_pass():
    check_options(GOOD)
    assert option_problem(GOOD, "vllm_bench_") == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"concurrency": [0]}, "concurrency must list levels of 1 or more, got [0]"),
        ({"concurrency": []}, "concurrency must list levels of 1 or more, got []"),
        ({"output_len": 0}, "output_len must be 1 or more, got 0"),
        ({"num_requests": 0}, "num_requests must be 1 or more, got 0"),
        ({"duration": -1}, "duration must be more than 0 seconds, got -1"),
        ({"goodput": {"ttft": 0}}, "goodput.ttft must be a number of milliseconds above 0, got 0"),
        ({"percentiles": [100]}, "percentiles must be between 0 and 100 (exclusive), got [100]"),
    ],
)
def test_a_bad_option_is_named_by_the_module_and_by_the_role(change, message):
    options = {**GOOD, **change}
    with pytest.raises(BenchError) as refused:
        check_options(options)
    assert str(refused.value) == message
    assert option_problem(options, "vllm_bench_") == "vllm_bench_" + message
