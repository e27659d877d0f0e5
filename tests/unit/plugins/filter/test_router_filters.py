"""The router's filters as playbooks call them: a refusal becomes a filter error with the function's message."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.vllm.plugins.filter.vllm import FilterModule

FILTERS = FilterModule().filters()
RECORD = {"instance": "tiny", "host": "0.0.0.0", "port": 8000, "url": "http://127.0.0.1:8000"}


def test_the_worker_url_of_a_record():
    assert FILTERS["vllm_router_worker_url"](RECORD, "10.0.0.7") == "http://10.0.0.7:8000"
    with pytest.raises(AnsibleFilterError, match=r"listens on 127\.0\.0\.1 alone"):
        FILTERS["vllm_router_worker_url"]({**RECORD, "host": "127.0.0.1"}, "10.0.0.7")


def test_the_choice_and_its_key_come_from_two_filters():
    instance = {**RECORD, "served_name": "tiny", "api_key": "sk-1", "active_state": "active"}
    backends = [{"host": "gpu-1", "address": "10.0.0.7", "instances": [instance]}]
    assert "api_key" not in FILTERS["vllm_router_choose"](backends)
    assert FILTERS["vllm_router_key"](backends) == "sk-1"
    with pytest.raises(AnsibleFilterError, match="no running instance of other"):
        FILTERS["vllm_router_choose"](backends, "other")


def test_bad_settings_become_filter_errors():
    with pytest.raises(AnsibleFilterError, match="policy must be one of"):
        FILTERS["vllm_router_command"]({"policy": "fastest"}, "p", "l", "w")
