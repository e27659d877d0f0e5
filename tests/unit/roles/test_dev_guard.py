"""The middleware that keeps vLLM's development endpoints from other hosts (roles/vllm_install/files).

Driven as uvicorn drives an ASGI app: a scope with the client's address, and the messages it sends back. The
real vLLM behind it, reached from a non-loopback address, is in tests/integration/test_service.py.
"""

import json

import pytest


@pytest.fixture
def call(guard, drive):
    def call(path, client, kind="http"):
        """(what the app behind saw, the messages sent to the client) for one request."""
        scope = {"type": kind, "path": path, "root_path": "", "client": client, "method": "POST"}
        return drive(guard.LoopbackOnlyDevEndpoints, scope)

    return call


@pytest.mark.parametrize("path", ["/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/server_info", "/"])
@pytest.mark.parametrize("client", [("10.0.0.7", 51000), ("2001:db8::7", 51000), ("::ffff:10.0.0.7", 1)])
def test_other_hosts_get_403_for_everything_but_the_api(call, path, client):
    reached, sent = call(path, client)
    assert reached == []
    assert sent[0]["status"] == 403
    assert "only on the host itself" in json.loads(sent[1]["body"])["error"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize", "/v2/rerank"])
def test_other_hosts_reach_the_api(call, path):
    assert call(path, ("10.0.0.7", 51000))[0] == [path]


@pytest.mark.parametrize("client", [("127.0.0.1", 40000), ("127.9.9.9", 1), ("::1", 2), ("::ffff:127.0.0.1", 3), None])
def test_the_host_itself_reaches_everything(call, client):
    assert call("/sleep", client)[0] == ["/sleep"]


def test_a_websocket_to_a_development_path_is_closed(call):
    reached, sent = call("/collective_rpc", ("10.0.0.7", 5), kind="websocket")
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_an_address_that_is_no_ip_is_not_local(guard):
    assert guard.is_local(("example.org", 1)) is False
    assert guard.is_local(("fe80::1%eth0", 1)) is False
