"""The deployed tiny model, checked from inside the host: systemd, the process, the secret, the API."""

import json

import pytest

UNIT = "vllm-tiny.service"
BASE_URL = "http://127.0.0.1:8000"
# Set in molecule.yml's inventory; it must reach the server and nothing else.
API_KEY = "molecule-api-key-5f1c"

# Runs with the host's python3: streams a completion and prints what it received, as JSON.
STREAM_CLIENT = r"""
import json, sys, urllib.request
body = json.dumps({"model": "tiny", "prompt": "The server", "max_tokens": 16, "ignore_eos": True,
                   "stream": True, "stream_options": {"include_usage": True}}).encode()
request = urllib.request.Request(sys.argv[1] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + sys.argv[2]})
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

# Runs with the host's python3: GET a URL (with a bearer token when one is given), print status and body.
FETCH = r"""
import json, sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1])
if len(sys.argv) > 2:
    request.add_header("Authorization", "Bearer " + sys.argv[2])
try:
    response = urllib.request.urlopen(request, timeout=10)
except urllib.error.HTTPError as error:
    response = error
print(json.dumps({"status": response.status, "body": response.read().decode()}))
"""


def http_get(host, path, api_key=None):
    key_argument = [api_key] if api_key else []
    result = host.run("python3 -c" + " %s" * (2 + len(key_argument)), FETCH, BASE_URL + path, *key_argument)
    assert result.rc == 0, result.stderr
    answer = json.loads(result.stdout)
    return answer["status"], answer["body"]


def main_pid(host):
    return int(host.check_output(f"systemctl show --property=MainPID --value {UNIT}"))


def unit_properties(host, *names):
    output = host.check_output(f"systemctl show --property={','.join(names)} {UNIT}")
    return dict(line.split("=", 1) for line in output.splitlines())


def test_unit_is_active_and_enabled(host):
    service = host.service(UNIT)
    assert service.is_running
    assert service.is_enabled


def test_server_does_not_run_as_root(host):
    pid = main_pid(host)
    assert pid > 0
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "vllm"
    assert host.user("vllm").shell == "/usr/sbin/nologin"


def test_unit_drains_then_kills_the_whole_cgroup(host):
    properties = unit_properties(host, "KillMode", "User", "ExecStart")
    assert properties["KillMode"] == "mixed"
    assert properties["User"] == "vllm"
    assert "--shutdown-timeout 10 " in properties["ExecStart"]
    assert "--served-model-name tiny " in properties["ExecStart"]


def test_timeouts_follow_the_catalog(host):
    # tiny: load_timeout 300 s, drain_timeout 10 s (+ 30 s for the engine to exit), burst of 3 starts.
    properties = unit_properties(host, "TimeoutStopUSec", "Restart", "StartLimitBurst", "StartLimitIntervalUSec")
    assert properties == {
        "TimeoutStopUSec": "40s",
        "Restart": "always",
        "StartLimitBurst": "3",
        "StartLimitIntervalUSec": "16min 30s",
    }


def test_server_gets_its_environment_file(host):
    # Root in the container may not read another user's environ (no CAP_SYS_PTRACE); its owner may.
    environ = host.check_output(f"runuser -u vllm -- cat /proc/{main_pid(host)}/environ | tr '\\0' '\\n'")
    environ = environ.splitlines()
    assert "HF_HUB_OFFLINE=1" in environ
    assert "VLLM_CPU_KVCACHE_SPACE=1" in environ
    assert f"VLLM_API_KEY={API_KEY}" in environ


def test_environment_file_is_private(host):
    env_file = host.file("/etc/vllm/tiny.env")
    assert env_file.mode == 0o600
    assert env_file.user == "root"


def test_api_key_stays_out_of_the_unit_the_command_line_and_the_journal(host):
    assert API_KEY not in host.file("/etc/systemd/system/vllm-tiny.service").content_string
    assert API_KEY not in host.check_output(f"tr '\\0' ' ' < /proc/{main_pid(host)}/cmdline")
    assert API_KEY not in host.check_output(f"journalctl --unit {UNIT} --no-pager --output cat")


def test_port_is_open(host):
    assert host.socket("tcp://0.0.0.0:8000").is_listening


def test_health_needs_no_key(host):
    assert http_get(host, "/health")[0] == 200


def test_models_need_the_key_and_list_the_served_name(host):
    assert http_get(host, "/v1/models")[0] == 401
    status, body = http_get(host, "/v1/models", API_KEY)
    assert status == 200
    assert "tiny" in [model["id"] for model in json.loads(body)["data"]]


@pytest.fixture(scope="module")
def streamed(host):
    result = host.run("python3 -c %s %s %s", STREAM_CLIENT, BASE_URL, API_KEY)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def test_completion_streams_every_token(streamed):
    assert streamed["content_type"].startswith("text/event-stream")
    assert streamed["done"]
    assert streamed["usage"]["completion_tokens"] == 16
    # Tokens arrive in chunks of their own (or a few), not as one answer at the end.
    assert streamed["chunks"] >= 8


def test_the_record_names_where_the_key_lives_and_holds_no_secret(host):
    record = json.loads(host.file("/etc/vllm/tiny.json").content_string)
    assert record["secrets"] == {"environment_file": "/etc/vllm/tiny.env", "api_key_variable": "VLLM_API_KEY"}
    assert (record["url"], record["load_timeout"], record["drain_timeout"], record["stop_timeout"]) == (
        BASE_URL,
        300,
        10,
        30,
    )
    assert API_KEY not in host.file("/etc/vllm/tiny.json").content_string


def test_the_unit_is_sandboxed(host):
    properties = unit_properties(
        host, "ProtectSystem", "NoNewPrivileges", "CapabilityBoundingSet", "DevicePolicy", "RestrictNamespaces"
    )
    assert properties["ProtectSystem"] == "strict" and properties["NoNewPrivileges"] == "yes"
    assert properties["CapabilityBoundingSet"] == "" and properties["DevicePolicy"] == "closed"
    assert properties["RestrictNamespaces"] == "yes"


def test_the_units_exposure_is_at_most_3(host):
    # The last line reads: → Overall exposure level for vllm-tiny.service: 1.6 OK
    last = host.check_output(f"systemd-analyze security --no-pager {UNIT}").splitlines()[-1]
    print(last)
    assert float(last.split(":")[-1].split()[0]) <= 3.0, last
