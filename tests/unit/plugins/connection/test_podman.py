"""The podman connection's command lines and options. Its behaviour in a real container (one `podman exec` per
piped module, files in and out, check mode, become) is tested in tests/integration/test_podman_connection.py."""

import pytest
from ansible.errors import AnsibleError
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader


@pytest.fixture
def podman_exec_argv():
    from ansible_collections.llmops.vllm.plugins.connection.podman import podman_exec_argv

    return podman_exec_argv


def connection(**host_vars):
    plugin = connection_loader.get("llmops.vllm.podman", PlayContext(), None)
    plugin.set_options(var_options={"inventory_hostname": "web1", **host_vars})
    return plugin


def test_a_command_without_input_gets_no_stdin(podman_exec_argv):
    argv = podman_exec_argv(["/usr/bin/podman"], "web1", ["/bin/sh", "-c", "echo ~"])
    assert argv == ["/usr/bin/podman", "exec", "web1", "/bin/sh", "-c", "echo ~"]


def test_a_piped_module_gets_stdin_and_the_user(podman_exec_argv):
    argv = podman_exec_argv(["podman", "--log-level", "debug"], "web1", ["/usr/bin/python3"], user="vllm", stdin=True)
    assert argv == [
        "podman",
        "--log-level",
        "debug",
        "exec",
        "--interactive",
        "--user",
        "vllm",
        "web1",
        "/usr/bin/python3",
    ]


def test_pipelining_is_on_by_default_and_can_be_turned_off():
    assert connection().has_pipelining
    assert connection().get_option("pipelining") is True
    assert connection(ansible_pipelining=False).get_option("pipelining") is False


def test_the_container_is_the_host_unless_named():
    assert connection().get_option("remote_addr") == "web1"
    assert connection(ansible_podman_host="box").get_option("remote_addr") == "box"
    assert connection(ansible_user="vllm").get_option("remote_user") == "vllm"


def test_a_missing_podman_is_named():
    plugin = connection(ansible_podman_executable="/nonexistent/podman")
    with pytest.raises(AnsibleError, match="podman_executable '/nonexistent/podman' is not on PATH"):
        plugin.exec_command("true")
