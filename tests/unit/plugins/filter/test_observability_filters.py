import pytest
from ansible.errors import AnsibleFilterError
from ansible.plugins.loader import filter_loader

from ansible_collections.llmops.vllm.plugins.filter.observability import FilterModule

FILTERS = FilterModule().filters()


def test_the_filters_are_found_by_their_names():
    for name in FILTERS:
        assert filter_loader.get(f"llmops.vllm.{name}") is not None, name


def test_alert_rules_with_settings_and_slos():
    rules = FILTERS["vllm_alert_rules"]({"instance_down": {"for": "5s"}}, {"tiny": {"p99_ttft_ms": 100}})
    assert [group["name"] for group in rules["groups"]] == [
        "llmops-vllm",
        "llmops-vllm-router",
        "llmops-vllm-group",
        "llmops-vllm-slo",
    ]
    assert rules["groups"][0]["rules"][0]["for"] == "5s"


def test_bad_alert_settings_fail_the_filter_with_the_reason():
    with pytest.raises(AnsibleFilterError, match="unknown alert 'down'"):
        FILTERS["vllm_alert_rules"]({"down": {}})


def test_each_host_is_reached_at_its_ansible_host_or_its_name():
    hostvars = {"monitor-01": {"ansible_host": "10.0.0.5"}, "monitor-02": {}}
    assert FILTERS["vllm_host_addresses"](["monitor-01", "monitor-02"], hostvars) == ["10.0.0.5", "monitor-02"]
    with pytest.raises(AnsibleFilterError, match="monitor-09 not in the inventory"):
        FILTERS["vllm_host_addresses"](["monitor-09"], hostvars)
