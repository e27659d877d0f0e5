"""The collection's launcher of vLLM's router (roles/vllm_router/files): its key check and its arguments.

The launcher in front of the real router, refusing a client without the key from another host, is in
tests/integration/test_router.py.
"""

import importlib.util
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[3] / "roles" / "vllm_router" / "files" / "llmops_vllm_router.py"
SPEC = importlib.util.spec_from_file_location("llmops_vllm_router", LAUNCHER)
launcher = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(launcher)


@pytest.fixture
def key_check():
    server = launcher.key_check_server("sk-1")
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def status(url, authorization=None):
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ("Bearer sk-1", 200),
        (None, 401),
        ("Bearer sk-2", 401),
        ("bearer sk-1", 401),
        ("Bearer sk-1 ", 401),
        ("sk-1", 401),
    ],
)
def test_the_key_check_lets_in_the_routers_key_alone(key_check, authorization, expected):
    assert status(key_check, authorization) == expected


def test_the_check_started_in_a_process_of_its_own_answers_on_loopback():
    url = launcher.start_key_check("sk-1")
    assert url.startswith("http://127.0.0.1:")
    assert (status(url, "Bearer sk-1"), status(url)) == (200, 401)


def test_the_launchers_options_come_before_the_routers_own_flags():
    options, flags = launcher.split_arguments(
        ["--workers-file", "/etc/w.json", "--", "--port", "8080", "--policy", "x"]
    )
    assert options.workers_file == "/etc/w.json"
    assert flags == ["--port", "8080", "--policy", "x"]
    with pytest.raises(SystemExit):
        launcher.split_arguments(["--", "--port", "8080"])


def test_the_workers_come_from_the_file(tmp_path):
    (tmp_path / "w.json").write_text(json.dumps({"workers": ["http://10.0.0.7:8000", "http://10.0.0.8:8000"]}))
    workers = launcher.read_workers(str(tmp_path / "w.json"))
    assert launcher.router_arguments(["--port", "8080"], workers) == [
        "--port", "8080", "--worker-urls", "http://10.0.0.7:8000", "http://10.0.0.8:8000",
    ]  # fmt: skip
    assert launcher.router_arguments(["--port", "8080"], []) == ["--port", "8080", "--worker-urls"]
