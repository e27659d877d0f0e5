import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.observability.prometheus_targets import (
    guard_target_groups,
    is_target,
    only_local,
    scrape_address,
    target_groups,
)


def record(name="tiny", host="0.0.0.0", port=8000, url="http://127.0.0.1:8000", **fields):
    return {
        "instance": name,
        "model": fields.get("model", name),
        "served_name": fields.get("served_name", name),
        "host": host,
        "port": port,
        "url": url,
        "gpus": fields.get("gpus", []),
        "vllm_version": "0.32.0",
    }


@pytest.mark.parametrize(
    ("active_state", "unit_file_state", "expected"),
    [
        ("active", "enabled", True),
        ("activating", "enabled", True),  # restarting after its engine died: an alert should see it
        ("failed", "enabled", True),  # crash loop: down, and alerted
        ("inactive", "enabled", True),  # to start at boot: expected up
        ("active", "disabled", True),  # asleep after a sleep swap, or started by hand
        ("inactive", "disabled", False),  # stopped by stop.yml or a swap
        ("failed", "disabled", False),
    ],
)
def test_a_target_is_an_instance_that_systemd_is_to_run(active_state, unit_file_state, expected):
    assert is_target(active_state, unit_file_state) is expected


def test_from_another_host_an_instance_on_every_address_is_scraped_through_the_host():
    assert scrape_address(record(), "10.0.0.12", local=False) == "10.0.0.12:8000"
    assert scrape_address(record(), "gpu-01.example.org", local=False) == "gpu-01.example.org:8000"
    assert (
        scrape_address(record(host="::", url="http://127.0.0.1:8001", port=8001), "fd00::12", False)
        == "[fd00::12]:8001"
    )


def test_an_instance_on_one_address_is_scraped_there_and_on_the_host_at_its_record_url():
    bound = record(host="10.0.0.50", url="http://10.0.0.50:8000")
    assert scrape_address(bound, "10.0.0.12", local=False) == "10.0.0.50:8000"
    assert scrape_address(bound, "10.0.0.12", local=True) == "10.0.0.50:8000"
    assert scrape_address(record(), "10.0.0.12", local=True) == "127.0.0.1:8000"


@pytest.mark.parametrize(
    ("host", "expected"),
    [("127.0.0.2", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("10.0.0.5", False), ("gpu", False)],
)
def test_only_loopback_is_local_only(host, expected):
    assert only_local(record(host=host)) is expected


def test_groups_one_target_each_with_the_labels_of_the_instance():
    records = [
        record(gpus=[0, 1, 2, 3], model="minimax_m25", served_name="minimax-m2.5", name="big"),
        record(name="tiny-b", host="127.0.0.2", port=8001, url="http://127.0.0.2:8001"),
    ]
    remote = target_groups(records, "gpu-01", "10.0.0.12", local=False)
    assert remote == [
        {
            "targets": ["10.0.0.12:8000"],
            "labels": {
                "host": "gpu-01",
                "vllm_instance": "big",
                "model": "minimax_m25",
                "served_name": "minimax-m2.5",
                "gpus": "0,1,2,3",
                "vllm_version": "0.32.0",
            },
        }
    ]
    local = target_groups(records, "gpu-01", "10.0.0.12", local=True)
    assert [group["targets"] for group in local] == [["127.0.0.1:8000"], ["127.0.0.2:8001"]]
    assert local[1]["labels"]["gpus"] == "all"


def test_a_headless_member_of_a_group_is_no_target_its_head_is():
    head = {**record("pair"), "group": {"role": "head", "serves_api": True}}
    worker = {**record("pair", url="http://10.0.0.1:8000"), "group": {"role": "worker", "serves_api": False}}
    assert [group["targets"] for group in target_groups([head], "host-a", "10.0.0.1", False)] == [["10.0.0.1:8000"]]
    assert target_groups([worker], "host-b", "10.0.0.2", False) == []


def test_every_group_member_s_guard_is_a_target_on_its_own_port_and_a_one_host_instance_has_none():
    head = {**record("pair"), "group": {"role": "head", "serves_api": True, "guard_port": 18000}}
    worker = {**record("pair", host="10.0.0.2", url="http://10.0.0.1:8000"),
              "group": {"role": "worker", "serves_api": False, "guard_port": 18000}}  # fmt: skip
    labels = {"host": "host-a", "vllm_instance": "pair", "model": "pair"}
    assert guard_target_groups([head, record()], "host-a", "10.0.0.1", False) == [
        {"targets": ["10.0.0.1:18000"], "labels": labels}
    ]
    assert guard_target_groups([head], "host-a", "10.0.0.1", True)[0]["targets"] == ["127.0.0.1:18000"]
    # A worker's guard listens where the worker's server would, on the worker's own address.
    assert guard_target_groups([worker], "host-b", "10.0.0.2", False)[0]["targets"] == ["10.0.0.2:18000"]
    # On loopback alone, no other host reaches it; a record of an older release has no guard port.
    on_loopback = {**head, "host": "127.0.0.1", "url": "http://127.0.0.1:8000"}
    assert guard_target_groups([on_loopback], "host-a", "10.0.0.1", False) == []
    older = {**head, "group": {"role": "head", "serves_api": True}}
    assert guard_target_groups([older], "host-a", "10.0.0.1", True) == []
