import json

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import (
    check_base_url,
    get,
    metric_samples,
    metric_total,
    post,
    requests_in_engine,
    served_models,
)

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
"""


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("https://gpu-7.example.com:8443/v1", "https://gpu-7.example.com:8443"),
    ],
)
def test_check_base_url(url, base):
    assert check_base_url(url) == base


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8000", "ftp://host", "http://", "http://h:8000/metrics", "http://h/?a=1", None]
)
def test_check_base_url_refuses(url):
    with pytest.raises(ValueError, match="url must be the server's base URL"):
        check_base_url(url)


def test_metric_total_sums_every_engine_and_ignores_longer_names():
    assert metric_total(METRICS, "vllm:num_requests_running") == 5.0
    assert metric_total(METRICS, "vllm:num_requests_waiting") == 4.0
    assert metric_total(METRICS, "vllm:absent") is None


def test_metric_samples_keep_one_value_per_label_set():
    assert metric_samples(METRICS, "vllm:num_requests_running") == [3.0, 2.0]
    assert metric_samples(METRICS, "vllm:absent") == []
    with pytest.raises(ValueError):
        metric_samples('vllm:kv_cache_usage_perc{engine="0"} NaNx\n', "vllm:kv_cache_usage_perc")


def test_served_models():
    assert served_models(json.dumps({"data": [{"id": "tiny"}, {"id": "lora-a"}]})) == ["tiny", "lora-a"]
    assert served_models("<html>") == [] and served_models('{"error": "x"}') == []


def models(headers):
    if headers.get("Authorization") != "Bearer sesame":
        return 401, '{"error": "Unauthorized"}'
    return 200, json.dumps({"data": [{"id": "tiny"}]})


@pytest.fixture
def server(serve):
    url, _asked = serve({"/metrics": (200, METRICS), "/v1/models": models})
    return url


def test_get_sends_the_key_and_returns_error_statuses(server):
    assert get(server, "/v1/models").status == 401
    reply = get(server, "/v1/models", "sesame")
    assert reply.status == 200 and served_models(reply.body) == ["tiny"]


def test_requests_in_engine_counts_running_and_waiting(server):
    assert requests_in_engine(server) == 9


def test_no_answer_is_described():
    reply = get("http://127.0.0.1:9", "/health", timeout=2)  # the discard port: nothing listens
    assert reply.status is None and reply.describe() and reply.describe() == reply.error
    assert requests_in_engine("http://127.0.0.1:9") is None


def test_post_sends_an_empty_post_with_the_key(serve):
    url, asked = serve({"POST /sleep?level=1": lambda headers: (200, headers.get("Authorization", ""))})
    reply = post(url, "/sleep?level=1", "sesame")
    assert (reply.status, reply.body, asked) == (200, "Bearer sesame", ["POST /sleep?level=1"])
    assert post(url, "/wake_up").status == 404
