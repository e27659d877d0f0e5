"""The middleware that answers /metrics to the host itself and its listed readers alone
(roles/vllm_install/files/llmops_vllm_dev_guard.py, MetricsReaders in every server).

Driven as uvicorn drives an ASGI app: a scope with the client's and the server's addresses, and the messages it
sends back. The real vLLM behind it is in tests/integration/test_observability.py.
"""

import json

import pytest


@pytest.fixture
def readers_file(tmp_path):
    return tmp_path / "metrics-readers"


@pytest.fixture
def call(guard, drive, readers_file):
    middleware = {}

    def wrap(app):
        if "guard" not in middleware:  # one middleware for the test, as in one server
            middleware["guard"] = guard.MetricsReaders(app, str(readers_file))
        middleware["guard"].app = app
        return middleware["guard"]

    def call(path, client, server=("0.0.0.0", 8000)):
        """(what the app behind saw, the messages sent to the client) for one GET."""
        scope = {"type": "http", "path": path, "root_path": "", "client": client, "server": server, "method": "GET"}
        return drive(wrap, scope)

    return call


@pytest.mark.parametrize("path", ["/metrics", "/metrics/", "/metricsx"])
@pytest.mark.parametrize("client", [("10.0.0.7", 51000), ("2001:db8::7", 51000), ("::ffff:10.0.0.7", 1)])
def test_other_hosts_get_403_for_the_metrics(call, path, client):
    reached, sent = call(path, client)
    assert reached == []
    assert sent[0]["status"] == 403
    assert (
        "/metrics answers the host itself and the readers in /etc/vllm/metrics-readers"
        in json.loads(sent[1]["body"])["error"]
    )


@pytest.mark.parametrize("path", ["/v1/completions", "/health", "/v1/models", "/load"])
def test_the_rest_is_not_its_business(call, path):
    assert call(path, ("10.0.0.7", 51000))[0] == [path]


@pytest.mark.parametrize("client", [("127.0.0.1", 40000), ("::1", 2), ("::ffff:127.0.0.1", 3), None])
def test_the_host_itself_reads_them(call, client):
    assert call("/metrics", client)[0] == ["/metrics"]


def test_the_host_on_its_own_address_reads_them(call):
    """A server that listens on one address: the host's modules connect from that address to it."""
    assert call("/metrics", ("10.0.0.12", 40000), server=("10.0.0.12", 8000))[0] == ["/metrics"]
    assert call("/metrics", ("10.0.0.13", 40000), server=("10.0.0.12", 8000))[0] == []


def test_listed_readers_read_them_and_a_change_of_the_file_needs_no_restart(call, readers_file):
    readers_file.write_text("# written by llmops.vllm\n10.0.0.5/32\n10.1.0.0/16  # the monitoring network\nnonsense\n")
    assert call("/metrics", ("10.0.0.5", 1))[0] == ["/metrics"]
    assert call("/metrics", ("10.1.200.3", 1))[0] == ["/metrics"]
    assert call("/metrics", ("::ffff:10.1.200.3", 1))[0] == ["/metrics"]
    assert call("/metrics", ("10.0.0.6", 1))[0] == []
    readers_file.write_text("10.0.0.6\n")
    assert call("/metrics", ("10.0.0.5", 1))[0] == []
    assert call("/metrics", ("10.0.0.6", 1))[0] == ["/metrics"]
    readers_file.unlink()
    assert call("/metrics", ("10.0.0.6", 1))[0] == []


def test_the_readers_file_format(guard):
    networks = guard.parse_readers("# c\n\n10.0.0.5\n fd00::/64 # x\n10.0.0.0/33\n")
    assert [str(network) for network in networks] == ["10.0.0.5/32", "fd00::/64"]
