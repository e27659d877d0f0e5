"""Sleep and wake in the lifecycle, against a scripted HTTP server that keeps vLLM's sleep state.

A stand-in for the state machine only: the real CUDA vLLM's sleep and wake-up are measured on the GPU machine
(benchmarks/gpu/harness.py, docs/fleet.md).
"""

import http.server
import json
import threading
from urllib.parse import urlsplit

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.lifecycle import Lifecycle, ServiceError, Settings
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import parse_show

ACTIVE = parse_show(
    "vllm-tiny.service",
    "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nInvocationID=b\nMainPID=100\n"
    "ExecStart={ path=/p ; argv[]=/p -m vllm --shutdown-timeout 5 ; ignore_errors=no }\n",
)


class Unit:
    name = "vllm-tiny.service"

    def state(self):
        return ACTIVE


class SleepyServer(http.server.BaseHTTPRequestHandler):
    """/is_sleeping, /sleep, /wake_up, /metrics (requests in flight, one fewer at each read), /v1/*."""

    state = {}

    def reply(self, status, body=""):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        state, path = self.state, urlsplit(self.path).path
        state["log"].append(f"GET {self.path}")
        if path == "/is_sleeping" and state["sleep_mode"]:
            self.reply(200, json.dumps({"is_sleeping": state["asleep"]}))
        elif path == "/metrics":
            running = state["in_flight"]
            state["in_flight"] = max(0, running - 1)
            self.reply(200, f'vllm:num_requests_running{{engine="0"}} {running}\nvllm:num_requests_waiting 0\n')
        elif path == "/health":
            self.reply(200)
        elif path == "/v1/models":
            self.reply(200, json.dumps({"data": [{"id": "tiny"}]}))
        else:
            self.reply(404)

    def do_POST(self):
        state = self.state
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        state["log"].append(f"POST {self.path}")
        path = urlsplit(self.path).path
        if path == "/sleep":
            state["asleep"] = True
            self.reply(200)
        elif path == "/wake_up":
            state["asleep"] = False
            self.reply(200)
        elif path == "/v1/completions":
            state["completion"] = json.loads(body)
            self.reply(state["completion_status"], json.dumps({"choices": [{"text": "!"}]}))
        else:
            self.reply(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    SleepyServer.state = {"sleep_mode": True, "asleep": False, "in_flight": 0, "completion_status": 200, "log": []}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SleepyServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", SleepyServer.state
    httpd.shutdown()


def lifecycle(url, **settings):
    return Lifecycle(Unit(), Settings(url=url, served_name="tiny", poll_interval=0.01, load_timeout=5, **settings))


def test_sleep_drains_then_asks_for_level_1_and_confirms(server):
    url, state = server
    state["in_flight"] = 3
    report = lifecycle(url).sleep(ACTIVE)
    assert state["asleep"] is True and lifecycle(url).asleep() is True
    assert (report["level"], report["in_flight"], report["aborted_requests"]) == (1, 3, 0)
    assert report["drain"]["timeout"] == 5.0 and report["drain"]["remaining"] == 0  # the unit's --shutdown-timeout
    assert "POST /sleep?level=1&mode=abort" in state["log"]
    assert state["log"].index("POST /sleep?level=1&mode=abort") > max(
        position for position, line in enumerate(state["log"]) if line == "GET /metrics"
    )


def test_requests_left_after_the_drain_are_counted_as_aborted(server):
    url, state = server
    state["in_flight"] = 1000
    report = lifecycle(url, drain_timeout=0.3).sleep(ACTIVE)
    assert report["drain"]["timeout"] == 0.3 and report["aborted_requests"] > 900


def test_wake_proves_the_engine_computes_with_one_token(server):
    url, state = server
    state["asleep"] = True
    report = lifecycle(url, api_key="k").wake()
    assert state["asleep"] is False
    assert state["completion"] == {"model": "tiny", "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    assert report["elapsed"] >= report["wake"] and set(report) == {"wake", "ready", "check", "elapsed"}


def test_a_woken_server_whose_completion_fails_fails_the_wake(server):
    url, state = server
    state.update(asleep=True, completion_status=500)
    with pytest.raises(ServiceError, match="woke, but a completion of one token answered HTTP 500"):
        lifecycle(url).wake()


def test_a_server_without_sleep_mode_is_named_as_such(server):
    url, state = server
    state["sleep_mode"] = False
    with pytest.raises(ServiceError, match=r"has no sleep endpoints .*HTTP 404.*was not started with sleep mode"):
        lifecycle(url).asleep()
