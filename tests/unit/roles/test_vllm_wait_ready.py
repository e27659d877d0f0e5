"""The unit's readiness probe against a small HTTP server that plays a loading vLLM."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[3] / "roles" / "vllm_server" / "files" / "vllm_wait_ready.py"


def load_probe():
    loader = importlib.machinery.SourceFileLoader("vllm_wait_ready", str(PROBE))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


class LoadingServer(BaseHTTPRequestHandler):
    health_status = 503
    models = []
    required_key = None

    def do_GET(self):
        if self.path == "/health":
            self.send_response(self.health_status)
            self.end_headers()
            return
        if self.required_key and self.headers.get("Authorization") != f"Bearer {self.required_key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"object": "list", "data": [{"id": name} for name in self.models]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), LoadingServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def test_ready_only_when_healthy_and_listing_the_name(server):
    httpd, url = server
    probe = load_probe()
    httpd.RequestHandlerClass = type("Handler", (LoadingServer,), {"health_status": 503, "models": []})
    assert not probe.serves(url, "tiny", None)
    httpd.RequestHandlerClass = type("Handler", (LoadingServer,), {"health_status": 200, "models": ["other"]})
    assert not probe.serves(url, "tiny", None)
    httpd.RequestHandlerClass = type("Handler", (LoadingServer,), {"health_status": 200, "models": ["tiny"]})
    assert probe.serves(url, "tiny", None)


def test_api_key_is_sent(server):
    httpd, url = server
    probe = load_probe()
    httpd.RequestHandlerClass = type(
        "Handler", (LoadingServer,), {"health_status": 200, "models": ["tiny"], "required_key": "k"}
    )
    assert not probe.serves(url, "tiny", None)
    assert probe.serves(url, "tiny", "k")


def test_nothing_listening_is_not_ready():
    assert not load_probe().serves("http://127.0.0.1:9", "tiny", None)


def test_main_process_watch():
    probe = load_probe()
    assert probe.is_running(os.getpid())
    assert probe.is_running(None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not probe.is_running(child.pid)


def test_probe_fails_fast_when_the_server_dies():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    result = subprocess.run(
        [sys.executable, str(PROBE), "http://127.0.0.1:9", "tiny"],
        env={**os.environ, "MAINPID": str(dead.pid)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert f"the server (PID {dead.pid}) exited while loading" in result.stderr
