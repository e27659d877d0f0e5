import socket

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.observability.metrics_readers import (
    ReadersError,
    reader_networks,
    readers_text,
)


def resolver(table):
    def resolve(name):
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[name]

    return resolve


def test_addresses_networks_and_names_become_networks_each_once():
    resolve = resolver({"monitor-01": ["10.0.0.5", "fd00::5"], "monitor-02": ["10.0.0.5"]})
    readers = ["monitor-01", "10.0.1.0/24", "10.0.1.7/24", " 10.0.0.5 ", "monitor-02", "fd00::/64"]
    assert reader_networks(readers, resolve) == ["10.0.0.5/32", "10.0.1.0/24", "fd00::/64", "fd00::5/128"]


def test_a_name_that_does_not_resolve_is_refused_by_name():
    with pytest.raises(
        ReadersError, match=r"metrics reader 'monitor-09' is neither an address, a network .* nor a name"
    ):
        reader_networks(["monitor-09"], resolver({}))


def test_a_real_name_resolves():
    assert "127.0.0.1/32" in reader_networks(["localhost"])


def test_the_file_says_what_it_is_and_lists_one_network_per_line():
    text = readers_text(["10.0.0.5/32", "fd00::/64"])
    assert text.splitlines()[-2:] == ["10.0.0.5/32", "fd00::/64"]
    assert all(line.startswith("#") for line in text.splitlines()[:-2])
    assert readers_text([]).count("\n") == 2
