from ansible_collections.llmops.vllm.plugins.module_utils.bench.throughput import (
    counters,
    measure,
    rates,
    with_throughput,
)

METRICS = """# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {generated}
vllm:generation_tokens_total{{engine="1",model_name="tiny"}} 100.0
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {prompt}
"""


def test_counters_are_summed_over_the_engines():
    assert counters(METRICS.format(generated=900.0, prompt=50.0)) == {
        "generation_tokens_per_second": 1000.0,
        "prompt_tokens_per_second": 50.0,
    }
    assert counters("vllm:generation_tokens_total NaN\n") == dict.fromkeys(
        ["generation_tokens_per_second", "prompt_tokens_per_second"]
    )


def test_rates_between_two_reads_and_none_across_a_restart():
    first = {"generation_tokens_per_second": 1000.0, "prompt_tokens_per_second": 50.0}
    assert rates(first, {"generation_tokens_per_second": 3500.0, "prompt_tokens_per_second": 50.0}, 5.0) == {
        "generation_tokens_per_second": 500.0,
        "prompt_tokens_per_second": 0.0,
    }
    restarted = {"generation_tokens_per_second": 20.0, "prompt_tokens_per_second": None}
    assert rates(first, restarted, 5.0) == dict.fromkeys(first)


def test_each_server_is_read_twice_across_the_interval(serve):
    reads = []

    def metrics(_headers):
        reads.append(1)
        return 200, METRICS.format(generated=900.0 + 1000 * (len(reads) - 1), prompt=50.0)

    url, asked = serve({"/metrics": metrics})
    slept = []
    measured = measure({"tiny": url, "gone": "http://127.0.0.1:9"}, 2.0, 2.0, sleep=slept.append)
    assert slept == [2.0] and asked == ["/metrics", "/metrics"]
    tiny = measured["tiny"]
    # 1000 tokens between two reads taken a moment apart (the sleep was recorded, not slept).
    assert tiny["generation_tokens_per_second"] > 1000 and tiny["prompt_tokens_per_second"] == 0.0
    assert measured["gone"]["generation_tokens_per_second"] is None


def test_rows_get_the_rates_of_their_instance():
    rows = [{"instance": "tiny", "port": 8000}, {"instance": "tiny-b", "port": 8001}]
    measured = [{"instance": "tiny", "generation_tokens_per_second": 612.4, "prompt_tokens_per_second": 80.2}]
    assert with_throughput(rows, measured) == [
        {"instance": "tiny", "port": 8000, "gen_tok_s": 612.4, "prompt_tok_s": 80.2},
        {"instance": "tiny-b", "port": 8001, "gen_tok_s": None, "prompt_tok_s": None},
    ]
    assert with_throughput(rows, None)[0]["gen_tok_s"] is None
