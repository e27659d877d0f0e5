from ansible_collections.llmops.vllm.plugins.module_utils.instance.status import status_row

GPUS = {"present": True, "gpus": [{"index": 0, "memory_used_mib": 100}, {"index": 1, "memory_used_mib": 2000}]}


def instance(**changes):
    return {"instance": "tiny", "model": "tiny", "port": 8000, "gpus": [], "active_state": "active", "enabled": True,
            "uptime": 3725.9, "restarts": 1, "engine_death": None, "requests_running": 2, "requests_waiting": 0,
            "kv_cache_usage": 0.1234, **changes}  # fmt: skip


def test_a_serving_instance_on_every_gpu():
    assert status_row(instance(), "h1", GPUS) == {
        "host": "h1", "instance": "tiny", "model": "tiny", "port": 8000, "state": "active", "uptime": "1:02:05",
        "restarts": 1, "engine_death": None, "running": 2, "waiting": 0, "kv": 12.3, "gpu_mib": 2100,
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
