from ansible_collections.llmops.vllm.plugins.module_utils.instance.status import group_rows, status_row

GPUS = {"present": True, "gpus": [{"index": 0, "memory_used_mib": 100}, {"index": 1, "memory_used_mib": 2000}]}


def instance(**changes):
    return {"instance": "tiny", "model": "tiny", "port": 8000, "gpus": [], "active_state": "active", "enabled": True,
            "uptime": 3725.9, "restarts": 1, "engine_death": None, "requests_running": 2, "requests_waiting": 0,
            "kv_cache_usage": 0.1234, **changes}  # fmt: skip


def test_a_serving_instance_on_every_gpu():
    assert status_row(instance(), "h1", GPUS) == {
        "host": "h1", "instance": "tiny", "model": "tiny", "port": 8000, "state": "active", "uptime": "1:02:05",
        "restarts": 1, "engine_death": None, "running": 2, "waiting": 0, "kv": 12.3, "gpu_mib": 2100, "group": None,
    }  # fmt: skip


def test_a_stopped_disabled_instance_on_its_own_gpu_whose_engine_died():
    row = status_row(
        instance(gpus=[1], active_state="failed", enabled=False, uptime=None, kv_cache_usage=None,
                 engine_death="the engine died: Worker proc VllmWorker-0 died unexpectedly"),
        "h2", GPUS,
    )  # fmt: skip
    assert (row["state"], row["uptime"], row["kv"], row["gpu_mib"]) == ("failed, disabled", None, None, 2000)
    assert row["engine_death"] == "h2 tiny: the engine died: Worker proc VllmWorker-0 died unexpectedly"


def test_a_host_without_gpus_has_no_gpu_memory():
    assert status_row(instance(), "h3", {"present": False, "gpus": []})["gpu_mib"] is None


def test_an_instance_kept_asleep_after_a_swap_says_so():
    row = status_row(instance(asleep=True, enabled=False, requests_running=0), "h4", GPUS)
    assert row["state"] == "active, asleep, disabled"


def member(role, **changes):
    return instance(instance="pair", model="pair", group={"role": role, "head": {"name": "h1", "address": "10.0.0.1"},
                                                          "hosts": ["h1", "h2"]}, **changes)  # fmt: skip


def test_a_multi_host_group_is_one_row_where_its_head_is():
    rows = [
        status_row(instance(), "h0", GPUS),
        # The worker's host comes first in the play; its figures of the head's metrics are the head's again.
        status_row(member("worker", restarts=3, requests_running=2), "h2", GPUS),
        status_row(member("head", restarts=1, uptime=60), "h1", GPUS),
        status_row(instance(instance="other"), "h3", GPUS),
    ]
    merged = group_rows(rows)
    assert [row["instance"] for row in merged] == ["tiny", "pair", "other"]
    group = merged[1]
    assert (group["host"], group["state"], group["restarts"], group["gpu_mib"]) == ("h1+h2", "active", 4, 4200)
    assert (group["uptime"], group["running"], group["port"], group["engine_death"]) == ("0:01:00", 2, 8000, None)
    assert merged[0] == rows[0] and merged[2] == rows[3]


def test_a_group_whose_members_differ_names_each_host_s_state_and_death():
    worker = status_row(member("worker", active_state="activating", engine_death="the engine died"), "h2", GPUS)
    merged = group_rows([status_row(member("head"), "h1", GPUS), worker])
    assert merged[0]["state"] == "h1 active; h2 activating"
    assert merged[0]["engine_death"] == "h2 pair: the engine died"
