"""The deployed tiny model, checked from inside the host: systemd, the process, the port, the API."""

import json

import pytest

UNIT = "vllm-tiny.service"
BASE_URL = "http://127.0.0.1:8000"

# Runs with the host's python3: it streams a completion and prints what it received, as JSON.
STREAM_CLIENT = r"""
import json, sys, urllib.request
body = json.dumps({"model": "tiny", "prompt": "The server", "max_tokens": 16, "ignore_eos": True,
                   "stream": True, "stream_options": {"include_usage": True}}).encode()
request = urllib.request.Request(sys.argv[1] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
chunks, texts, usage, done = 0, [], None, False
with urllib.request.urlopen(request, timeout=60) as response:
    content_type = response.headers["Content-Type"]
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        usage = chunk.get("usage") or usage
        if chunk.get("choices"):
            chunks += 1
            texts.append(chunk["choices"][0]["text"])
print(json.dumps({"content_type": content_type, "chunks": chunks, "text": "".join(texts),
                  "usage": usage, "done": done}))
"""


# Runs with the host's python3: GET a URL, print the status and the body as JSON.
FETCH = (
    "import json, sys, urllib.request\n"
    "response = urllib.request.urlopen(sys.argv[1], timeout=10)\n"
    "print(json.dumps({'status': response.status, 'body': response.read().decode()}))\n"
)


def http_get(host, path):
    result = host.run("python3 -c %s %s", FETCH, BASE_URL + path)
    assert result.rc == 0, result.stderr
    answer = json.loads(result.stdout)
    return answer["status"], answer["body"]


def main_pid(host):
    return int(host.check_output(f"systemctl show --property=MainPID --value {UNIT}"))


def test_unit_is_active_and_enabled(host):
    service = host.service(UNIT)
    assert service.is_running
    assert service.is_enabled


def test_server_does_not_run_as_root(host):
    pid = main_pid(host)
    assert pid > 0
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "vllm"
    assert host.user("vllm").shell == "/usr/sbin/nologin"


def test_unit_drains_and_kills_the_whole_cgroup(host):
    properties = host.check_output(f"systemctl show --property=KillMode,TimeoutStopUSec,User {UNIT}")
    assert "KillMode=mixed" in properties
    assert "User=vllm" in properties
    exec_start = host.check_output(f"systemctl show --property=ExecStart {UNIT}")
    assert "--shutdown-timeout 10" in exec_start
    assert "--served-model-name tiny" in exec_start


def test_environment_file_is_private(host):
    env_file = host.file("/etc/vllm/tiny.env")
    assert env_file.mode == 0o600
    assert env_file.user == "root"
    assert 'HF_HUB_OFFLINE="1"' in env_file.content_string
    assert 'VLLM_CPU_KVCACHE_SPACE="1"' in env_file.content_string


def test_port_is_open(host):
    assert host.socket("tcp://0.0.0.0:8000").is_listening


def test_models_lists_the_served_name(host):
    status, body = http_get(host, "/v1/models")
    assert status == 200
    assert "tiny" in [model["id"] for model in json.loads(body)["data"]]


def test_health(host):
    assert http_get(host, "/health")[0] == 200


@pytest.fixture(scope="module")
def streamed(host):
    result = host.run("python3 -c %s %s", STREAM_CLIENT, BASE_URL)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def test_completion_streams_every_token(streamed):
    assert streamed["content_type"].startswith("text/event-stream")
    assert streamed["done"]
    assert streamed["usage"]["completion_tokens"] == 16
    # Each token arrives in a chunk of its own (or a few), not as one answer at the end.
    assert streamed["chunks"] >= 8
