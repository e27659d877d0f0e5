"""vllm_router_workers and vllm_router_info against a stand-in of vllm-router 0.1.17's management API.

The stand-in keeps a list of workers and answers /list_workers, /workers, /add_worker and /remove_worker as the real
router does (seen against it: an unknown worker's removal answers 200, a second add of one answers 400), behind the
key check that the collection's launcher gives it. The real router, in front of real vLLM instances, is in
tests/integration/test_router.py.
"""

import http.server
import json
import threading
import urllib.parse

import pytest
from ansible.module_utils import basic

from ansible_collections.llmops.vllm.plugins.module_utils.router.record import build_record, environment_text
from ansible_collections.llmops.vllm.plugins.modules import vllm_router_info, vllm_router_workers

KEY = "sk-router-clients"


class _Router(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self._answer()

    def do_POST(self):
        self._answer()

    def _answer(self):
        state = self.server.state
        path, _mark, query = self.path.partition("?")
        state["asked"].append(f"{self.command} {path}")
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self._send(401, "You must provide a valid API key.")
        url = urllib.parse.parse_qs(query).get("url", [""])[0]
        if path == "/list_workers":
            return self._send(200, json.dumps({"urls": state["workers"]}))
        if path == "/workers":
            listed = [{"url": url, "is_healthy": url not in state["unhealthy"], "load": 0} for url in state["workers"]]
            return self._send(200, json.dumps({"workers": listed, "total": len(listed)}))
        if path == "/add_worker" and self.command == "POST":
            if url in state["workers"]:
                return self._send(400, f"Worker {url} already exists")
            state["workers"].append(url)
            return self._send(200, f"Successfully added worker: {url}")
        if path == "/remove_worker" and self.command == "POST":
            if url in state["workers"]:
                state["workers"].remove(url)
            return self._send(200, f"Successfully removed worker: {url}")
        return self._send(404, "")

    def _send(self, status, body):
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def router(tmp_path, serve):
    """A stand-in router on loopback with its record, EnvironmentFile and workers file in tmp_path."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    httpd.state = {"workers": [], "unhealthy": [], "asked": []}
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    metrics_url, _asked = serve({"/metrics": (200, 'vllm_router_requests_total{route="/v1/completions"} 7\n')})
    record = build_record(
        {"host": "127.0.0.1", "port": httpd.server_address[1], "policy": "round_robin", "health_check_interval": 5,
         "health_failure_threshold": 2, "health_check_timeout": 5, "queue_timeout": 60, "prometheus_host": "",
         "prometheus_port": 29000, "extra_args": [], "config_dir": str(tmp_path), "unit": "vllm-router.service",
         "served_name": "tiny", "version": "0.1.17", "python": "/opt/vllm-router/venv/bin/python"}
    )  # fmt: skip
    record["metrics_url"] = metrics_url
    (tmp_path / "router.json").write_text(json.dumps(record))
    (tmp_path / "router.env").write_text(environment_text(KEY))
    yield httpd.state, record
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def worker(serve):
    """`worker(served_name, key)`: a stand-in vLLM instance whose /v1/models needs `key`; returns its URL."""

    def start(served_name="tiny", key=KEY):
        def models(headers):
            if headers.get("Authorization") != f"Bearer {key}":
                return 401, '{"error": "Unauthorized"}'
            return 200, json.dumps({"data": [{"id": served_name}]})

        url, _asked = serve({"/v1/models": models, "/health": (200, "")})
        return url

    return start


@pytest.fixture
def systemctl(monkeypatch):
    def run_command(self, command, **_kwargs):
        assert command[:3] == ["systemctl", "show", "vllm-router.service"]
        return 0, "LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=77\n", ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)


def saved(tmp_path):
    return json.loads((tmp_path / "workers.json").read_text())["workers"]


def test_a_worker_that_serves_with_the_key_is_added_and_saved(run_module, router, worker, tmp_path):
    state, _record = router
    url = worker()
    result = run_module(vllm_router_workers.main, {"config_dir": str(tmp_path), "add": [url]})
    assert result["changed"] and result["added"] == [url] and result["running"]
    assert state["workers"] == [url] == saved(tmp_path)
    again = run_module(vllm_router_workers.main, {"config_dir": str(tmp_path), "add": [url]})
    assert not again["changed"] and again["added"] == []


def test_a_worker_is_taken_out_only_where_it_is_listed(run_module, router, tmp_path):
    state, _record = router
    state["workers"] = ["http://10.0.0.7:8000", "http://10.0.0.8:8000"]
    result = run_module(vllm_router_workers.main, {"config_dir": str(tmp_path), "remove": ["http://10.0.0.7:8000/"]})
    assert result["removed"] == ["http://10.0.0.7:8000"] and result["workers"] == ["http://10.0.0.8:8000"]
    assert state["workers"] == ["http://10.0.0.8:8000"] == saved(tmp_path)
    again = run_module(vllm_router_workers.main, {"config_dir": str(tmp_path), "remove": ["http://10.0.0.7:8000"]})
    assert again["removed"] == [] and not again["changed"]


@pytest.mark.parametrize(
    ("served", "key", "message"),
    [
        ("tiny2", KEY, "serves ['tiny2'], not 'tiny', the model of the router"),
        ("tiny", "sk-other", "refuses the key of the router's clients (HTTP 401)"),
    ],
)
def test_a_worker_of_another_model_or_key_is_refused_before_any_change(
    run_module, router, worker, tmp_path, served, key, message
):
    state, _record = router
    result = run_module(
        vllm_router_workers.main, {"config_dir": str(tmp_path), "add": [worker(served, key)]}, fails=True
    )
    assert message in result["msg"] and result["msg"].endswith("; nothing changed")
    assert state["workers"] == [] and not (tmp_path / "workers.json").exists()
    assert [asked for asked in state["asked"] if asked.startswith("POST")] == []


def test_a_router_that_does_not_answer_refuses_a_drain_before_any_change(run_module, router, tmp_path):
    _state, record = router
    record["url"] = "http://127.0.0.1:9"
    (tmp_path / "router.json").write_text(json.dumps(record))
    result = run_module(
        vllm_router_workers.main, {"config_dir": str(tmp_path), "remove": ["http://10.0.0.7:8000"]}, fails=True
    )
    assert "the router at http://127.0.0.1:9 cannot be reached" in result["msg"]
    assert result["msg"].endswith("; nothing changed")


def test_a_stopped_router_gets_its_workers_in_its_file_each_worker_checked(run_module, router, worker, tmp_path):
    _state, record = router
    record["url"] = "http://127.0.0.1:9"
    (tmp_path / "router.json").write_text(json.dumps(record))
    url = worker()
    result = run_module(vllm_router_workers.main, {"config_dir": str(tmp_path), "workers": [url]})
    assert result["changed"] and not result["running"] and saved(tmp_path) == [url]
    refused = run_module(
        vllm_router_workers.main, {"config_dir": str(tmp_path), "workers": [url, worker("other")]}, fails=True
    )
    assert "not 'tiny'" in refused["msg"] and saved(tmp_path) == [url]


def test_check_mode_predicts_and_changes_nothing(run_module, router, worker, tmp_path):
    state, _record = router
    url = worker()
    result = run_module(
        vllm_router_workers.main, {"config_dir": str(tmp_path), "add": [url], "_ansible_check_mode": True}
    )
    assert result["changed"] and result["workers"] == [url]
    assert state["workers"] == [] and not (tmp_path / "workers.json").exists()


def test_without_a_router_on_the_host(run_module, tmp_path):
    result = run_module(
        vllm_router_workers.main, {"config_dir": str(tmp_path / "none"), "add": ["http://10.0.0.7:8000"]}, fails=True
    )
    assert "No router on this host" in result["msg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"add": ["10.0.0.7:8000"]}, "worker '10.0.0.7:8000': url must be"),
        ({"workers": [], "add": ["http://10.0.0.7:8000"]}, "mutually exclusive"),
        ({"remove": ["http://10.0.0.7:8000"], "timeout": 0}, "timeout must be more than 0 seconds"),
    ],
)
def test_bad_input_is_refused_before_anything_is_read(run_module, tmp_path, args, message):
    result = run_module(vllm_router_workers.main, {"config_dir": str(tmp_path / "none"), **args}, fails=True)
    assert message in result["msg"]


class TestInfo:
    def test_the_router_its_workers_their_health_and_its_counts(self, run_module, router, systemctl, tmp_path):
        state, _record = router
        state["workers"] = ["http://10.0.0.7:8000", "http://10.0.0.8:8000"]
        state["unhealthy"] = ["http://10.0.0.8:8000"]
        described = run_module(vllm_router_info.main, {"config_dir": str(tmp_path)})["router"]
        assert described["reachable"] and described["active_state"] == "active"
        assert described["workers"] == [
            {"url": "http://10.0.0.7:8000", "healthy": True, "load": 0},
            {"url": "http://10.0.0.8:8000", "healthy": False, "load": 0},
        ]
        assert described["counts"] == {"requests": 7, "errors": 0, "retries": 0}
        assert "secrets" not in described and KEY not in json.dumps(described)

    def test_a_wait_for_every_worker_healthy_ends_with_what_it_saw(self, run_module, router, systemctl, tmp_path):
        state, _record = router
        state["workers"] = ["http://10.0.0.8:8000"]
        state["unhealthy"] = ["http://10.0.0.8:8000"]
        result = run_module(vllm_router_info.main, {"config_dir": str(tmp_path), "wait": 0.3}, fails=True)
        assert "did not serve with every worker healthy within 0.3 s" in result["msg"]
        assert "'healthy': False" in result["msg"]
        state["unhealthy"] = []
        assert run_module(vllm_router_info.main, {"config_dir": str(tmp_path), "wait": 5})["router"]["workers"][0][
            "healthy"
        ]

    def test_an_instance_fits_with_the_routers_model_and_key(self, run_module, router, systemctl, tmp_path):
        def fits(served_name, key):
            args = {"config_dir": str(tmp_path), "served_name": served_name, "api_key": key}
            return run_module(vllm_router_info.main, args)["fits"]

        assert fits("tiny", KEY) == {"ok": True, "reasons": []}
        assert fits("tiny2", "sk-other") == {
            "ok": False,
            "reasons": [
                "it serves tiny2, and the router's workers serve tiny",
                "it takes another key than the one the router's clients send",
            ],
        }

    def test_a_router_that_does_not_answer_is_described_so(self, run_module, router, systemctl, tmp_path):
        _state, record = router
        record["url"] = "http://127.0.0.1:9"
        (tmp_path / "router.json").write_text(json.dumps(record))
        described = run_module(vllm_router_info.main, {"config_dir": str(tmp_path)})["router"]
        assert not described["reachable"] and "cannot be reached" in described["error"]
