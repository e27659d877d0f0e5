"""The router's pure parts: where it reaches an instance, its command line and record, its workers, its replies."""

import json

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.router.api import router_counts
from ansible_collections.llmops.vllm.plugins.module_utils.router.choice import (
    choose_workers,
    chosen_key,
    chosen_workers,
    refusals,
    status_rows,
)
from ansible_collections.llmops.vllm.plugins.module_utils.router.record import (
    RouterError,
    build_record,
    check_settings,
    environment_text,
    read_record,
    router_api_key,
    router_command,
    worker_url,
)
from ansible_collections.llmops.vllm.plugins.module_utils.router.workers import (
    parse_worker_list,
    parse_worker_states,
    plan_workers,
    read_workers,
    write_workers,
)

SETTINGS = {
    "host": "0.0.0.0",
    "port": 8080,
    "policy": "round_robin",
    "health_check_interval": 5,
    "health_failure_threshold": 2,
    "health_check_timeout": 5,
    "queue_timeout": 60,
    "prometheus_host": "",
    "prometheus_port": 29000,
    "extra_args": [],
}


def instance(name, host="0.0.0.0", port=8000, served_name="tiny", key="k1", state="active"):
    url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    return {"instance": name, "host": host, "port": port, "url": url, "served_name": served_name, "api_key": key,
            "active_state": state}  # fmt: skip


def backend(host, address, *instances):
    return {"host": host, "address": address, "instances": list(instances)}


class TestWorkerUrl:
    def test_an_instance_on_every_address_is_reached_at_its_hosts_address(self):
        assert worker_url(instance("tiny"), "10.0.0.7") == "http://10.0.0.7:8000"
        assert worker_url(instance("tiny", host="::"), "2001:db8::7") == "http://[2001:db8::7]:8000"

    def test_an_instance_on_one_address_is_reached_at_its_records_url(self):
        assert worker_url(instance("tiny", host="10.88.0.5", port=8001), "gpu-07") == "http://10.88.0.5:8001"

    @pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
    def test_an_instance_on_loopback_is_refused(self, listen):
        with pytest.raises(RouterError, match=f"listens on {listen} alone; a router reaches its workers over the net"):
            worker_url(instance("tiny", host=listen), "10.0.0.7")

    @pytest.mark.parametrize("address", ["", "127.0.0.1", "localhost"])
    def test_the_hosts_address_must_not_be_loopback(self, address):
        with pytest.raises(RouterError, match="set vllm_worker_address"):
            worker_url(instance("tiny"), address)


class TestCommand:
    def test_the_launcher_then_the_routers_own_flags_and_no_key(self):
        assert router_command(SETTINGS, "/opt/vllm-router/venv/bin/python", "/opt/vllm-router/l.py", "/etc/w.json") == [
            "/opt/vllm-router/venv/bin/python", "/opt/vllm-router/l.py", "--workers-file", "/etc/w.json", "--",
            "--host", "0.0.0.0", "--port", "8080", "--policy", "round_robin",
            "--health-check-endpoint", "/health", "--health-check-interval-secs", "5",
            "--health-failure-threshold", "2", "--health-check-timeout-secs", "5", "--queue-timeout-secs", "60",
            "--worker-startup-check-interval", "1", "--prometheus-host", "127.0.0.1", "--prometheus-port", "29000",
        ]  # fmt: skip

    def test_extra_args_follow(self):
        command = router_command({**SETTINGS, "extra_args": ["--retry-max-retries", "3"]}, "p", "l", "w")
        assert command[-2:] == ["--retry-max-retries", "3"]

    @pytest.mark.parametrize("flag", ["--api-key", "--api-key=secret", "--worker-urls", "--port", "--prometheus-port"])
    def test_extra_args_may_not_set_a_key_the_workers_or_the_ports(self, flag):
        with pytest.raises(RouterError, match="extra_args may not set"):
            router_command({**SETTINGS, "extra_args": [flag, "x"]}, "p", "l", "w")

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"policy": "fastest"}, "policy must be one of"),
            ({"port": 0}, "port must be a whole number from 1 to 65535"),
            ({"port": 29000}, "port and prometheus_port are both 29000"),
            ({"health_check_interval": 0}, "health_check_interval must be a whole number"),
            ({"queue_timeout": True}, "queue_timeout must be a whole number"),
            ({"host": " "}, "host must be an address to listen on"),
        ],
    )
    def test_bad_settings_are_named(self, change, message):
        with pytest.raises(RouterError, match=message):
            check_settings({**SETTINGS, **change})


class TestRecord:
    FIELDS = {**SETTINGS, "config_dir": "/etc/vllm-router", "unit": "vllm-router.service", "served_name": "tiny",
              "version": "0.1.17", "python": "/opt/vllm-router/venv/bin/python"}  # fmt: skip

    def test_the_record_says_where_the_router_and_its_metrics_are_reached_and_where_its_key_lives(self):
        record = build_record(self.FIELDS)
        assert record["url"] == "http://127.0.0.1:8080"
        assert record["metrics_url"] == "http://127.0.0.1:29000"
        assert record["secrets"] == {
            "environment_file": "/etc/vllm-router/router.env",
            "api_key_variable": "VLLM_ROUTER_API_KEY",
        }
        assert record["workers_file"] == "/etc/vllm-router/workers.json"
        assert (record["served_name"], record["policy"], record["health_failure_threshold"]) == (
            "tiny",
            "round_robin",
            2,
        )

    def test_a_router_on_one_address_is_reached_there(self):
        assert build_record({**self.FIELDS, "host": "10.0.0.9"})["url"] == "http://10.0.0.9:8080"

    def test_a_record_needs_the_model_of_its_workers(self):
        with pytest.raises(RouterError, match="served_name must name the model"):
            build_record({**self.FIELDS, "served_name": ""})

    def test_a_written_record_reads_back_with_its_key_from_the_environment_file(self, tmp_path):
        record = build_record({**self.FIELDS, "config_dir": str(tmp_path)})
        (tmp_path / "router.json").write_text(json.dumps(record))
        (tmp_path / "router.env").write_text(environment_text("sk-1 $x"))
        assert read_record(str(tmp_path)) == record
        assert router_api_key(record) == "sk-1 $x"
        (tmp_path / "router.env").write_text(environment_text(None))
        assert router_api_key(record) is None

    def test_a_missing_or_broken_record_says_what_to_run(self, tmp_path):
        with pytest.raises(RouterError, match=r"No router on this host: .* does not exist .run playbooks/router.yml"):
            read_record(str(tmp_path))
        (tmp_path / "router.json").write_text('{"unit": "vllm-router.service"}')
        with pytest.raises(RouterError, match="lacks host, port"):
            read_record(str(tmp_path))


class TestWorkers:
    A, B, C = "http://10.0.0.7:8000", "http://10.0.0.8:8000", "http://10.0.0.9:8000"

    def test_take_out_and_put_in(self):
        assert plan_workers([self.A, self.B], remove=[self.A]) == ([], [self.A], [self.B])
        assert plan_workers([self.B], add=[self.A]) == ([self.A], [], [self.B, self.A])

    def test_what_is_not_listed_is_not_taken_out_and_what_is_listed_is_not_added_again(self):
        assert plan_workers([self.B], remove=[self.A], add=[self.B]) == ([], [], [self.B])

    def test_an_exact_list(self):
        assert plan_workers([self.A, self.B], workers=[self.B, self.C]) == ([self.C], [self.A], [self.B, self.C])

    def test_urls_are_checked_and_a_trailing_slash_is_the_same_worker(self):
        assert plan_workers([self.A], add=[self.A + "/"]) == ([], [], [self.A])
        with pytest.raises(RouterError, match="worker 'ftp://x': url must be"):
            plan_workers([], add=["ftp://x"])

    def test_the_workers_file_round_trip(self, tmp_path, ansible_module):
        path, module = str(tmp_path / "workers.json"), ansible_module()
        assert read_workers(path) == []
        assert write_workers(module, path, [self.A, self.B]) is True
        assert write_workers(module, path, [self.A, self.B]) is False
        assert read_workers(path) == [self.A, self.B]
        (tmp_path / "workers.json").write_text("[1]")
        with pytest.raises(RouterError, match="cannot be read"):
            read_workers(path)


class TestReplies:
    def test_list_workers(self):
        body = '{"urls":["http://127.0.0.1:18009","http://127.0.0.1:18001"]}'
        assert parse_worker_list(body) == ["http://127.0.0.1:18001", "http://127.0.0.1:18009"]
        with pytest.raises(RouterError, match="not a list of URLs"):
            parse_worker_list("All servers healthy")

    def test_workers_with_their_health_as_0_1_17_answers(self):
        body = (
            '{"workers":[{"url":"http://127.0.0.1:18009","model_id":"unknown","worker_type":"regular",'
            '"is_healthy":false,"load":0,"connection_mode":"Http","priority":50,"cost":1.0},'
            '{"url":"http://127.0.0.1:18001","model_id":"unknown","worker_type":"regular","is_healthy":true,'
            '"load":2,"connection_mode":"Http","priority":50,"cost":1.0}],"total":2,'
            '"stats":{"prefill_count":0,"decode_count":0,"regular_count":2}}'
        )
        # Sorted by URL: the router's own order changes from one start to the next.
        assert parse_worker_states(body) == [
            {"url": "http://127.0.0.1:18001", "healthy": True, "load": 2},
            {"url": "http://127.0.0.1:18009", "healthy": False, "load": 0},
        ]

    def test_the_routers_own_counts(self):
        metrics = (
            "# TYPE vllm_router_requests_total counter\n"
            'vllm_router_requests_total{route="/v1/completions"} 40\n'
            'vllm_router_requests_total{route="/v1/models"} 2\n'
            'vllm_router_request_errors_total{route="/v1/completions",error_type="non_retryable_error"} 3\n'
            'vllm_router_retries_total{route="/v1/completions"} 5\n'
        )
        assert router_counts(metrics) == {"requests": 42, "errors": 3, "retries": 5}
        assert router_counts("") == {"requests": 0, "errors": 0, "retries": 0}


class TestChoice:
    def test_the_running_instances_of_the_one_model_at_their_hosts_addresses(self):
        backends = [
            backend("gpu-1", "10.0.0.7", instance("tiny"), instance("tiny2", port=8001, state="inactive")),
            backend("gpu-2", "10.0.0.8", instance("tiny", host="10.0.0.8")),
        ]
        assert chosen_workers(backends) == {
            "served_name": "tiny",
            "workers": [
                {"host": "gpu-1", "instance": "tiny", "url": "http://10.0.0.7:8000"},
                {"host": "gpu-2", "instance": "tiny", "url": "http://10.0.0.8:8000"},
            ],
        }
        assert chosen_key(backends) == "k1"

    def test_instances_of_two_models_need_a_choice(self):
        backends = [backend("gpu-1", "10.0.0.7", instance("tiny"), instance("other", port=8001, served_name="other"))]
        with pytest.raises(RouterError, match="the instances serve other, tiny: a router sends any request"):
            chosen_workers(backends)
        assert [worker["instance"] for worker in chosen_workers(backends, "other")["workers"]] == ["other"]
        assert [worker["instance"] for worker in chosen_workers(backends, names=["tiny"])["workers"]] == ["tiny"]

    def test_a_multi_host_group_is_reached_at_its_head_alone(self):
        head = {**instance("pair", port=8001), "group": {"role": "head", "serves_api": True}}
        worker = {**instance("pair", port=8001), "group": {"role": "worker", "serves_api": False}}
        backends = [backend("gpu-1", "10.0.0.7", head), backend("gpu-2", "10.0.0.8", worker)]
        assert chosen_workers(backends)["workers"] == [
            {"host": "gpu-1", "instance": "pair", "url": "http://10.0.0.7:8001"}
        ]

    def test_instances_with_two_keys_are_refused_naming_instances_never_keys(self):
        backends = [
            backend("gpu-1", "10.0.0.7", instance("tiny", key="sk-one")),
            backend("gpu-2", "10.0.0.8", instance("tiny", key="sk-two")),
        ]
        with pytest.raises(RouterError) as refused:
            choose_workers(backends)
        assert "take different API keys (one group per key: tiny on gpu-1; tiny on gpu-2)" in str(refused.value)
        assert "sk-" not in str(refused.value)

    def test_an_instance_named_for_the_router_must_run(self):
        backends = [backend("gpu-1", "10.0.0.7", instance("tiny", state="failed"))]
        with pytest.raises(RouterError, match=r"do not run: tiny on gpu-1 \(failed\); start them first"):
            chosen_workers(backends, names=["tiny"])

    def test_no_worker_at_all(self):
        with pytest.raises(RouterError, match="no running instance of tiny on gpu-1 for the router"):
            chosen_workers([backend("gpu-1", "10.0.0.7", instance("tiny", state="inactive"))], "tiny")

    def test_no_key_is_a_key_too(self):
        assert chosen_key([backend("gpu-1", "10.0.0.7", instance("tiny", key=None))]) is None


class TestChecks:
    ROUTER = {"reachable": True, "error": None, "workers": [{"url": "http://10.0.0.7:8000", "healthy": True}]}

    def test_a_router_that_does_not_answer(self):
        checked = [{"item": "gw-1", "router": {"reachable": False, "error": "connection refused", "workers": []}}]
        assert refusals(checked, []) == ["the router on gw-1 does not answer: connection refused"]

    def test_a_new_instance_must_fit_the_routers_that_list_the_old_one(self):
        misfit = {"ok": False, "reasons": ["it serves tiny2, and the router's workers serve tiny"]}
        checked = [
            {"item": "gw-1", "router": self.ROUTER, "fits": misfit},
            {"item": "gw-2", "router": {**self.ROUTER, "workers": []}, "fits": misfit},
        ]
        assert refusals(checked, ["http://10.0.0.7:8000"]) == [
            "the router on gw-1 sends requests to http://10.0.0.7:8000, and the instance to take its place cannot be "
            "its worker: it serves tiny2, and the router's workers serve tiny"
        ]

    def test_routers_that_answer_and_fit(self):
        checked = [{"item": "gw-1", "router": self.ROUTER, "fits": {"ok": True, "reasons": []}}]
        assert refusals(checked, ["http://10.0.0.7:8000"]) == []


def test_status_rows_one_per_worker():
    router = {"url": "http://127.0.0.1:8080", "served_name": "tiny", "active_state": "active", "reachable": True,
              "workers": [{"url": "http://10.0.0.7:8000", "healthy": True, "load": 3}]}  # fmt: skip
    assert status_rows(router, "gw-1") == [
        {"host": "gw-1", "router": "http://127.0.0.1:8080", "model": "tiny", "state": "active",
         "worker": "http://10.0.0.7:8000", "health": "healthy", "in_flight": 3},
    ]  # fmt: skip
    down = {**router, "active_state": "inactive", "reachable": False, "workers": []}
    assert status_rows(down, "gw-1")[0] | {"host": "gw-1"} == {
        "host": "gw-1", "router": "http://127.0.0.1:8080", "model": "tiny", "state": "inactive, not answering",
        "worker": "-", "health": "-", "in_flight": None,
    }  # fmt: skip
