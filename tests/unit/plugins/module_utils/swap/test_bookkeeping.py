import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.common.clock import ClockError
from ansible_collections.llmops.vllm.plugins.module_utils.instance.host_instances import normalize
from ansible_collections.llmops.vllm.plugins.module_utils.swap.bookkeeping import (
    SwapError,
    beside_plan,
    budget_spent,
    gate_offer,
    gate_reference,
    gate_summary,
    meminfo_mib,
    new_instance,
    rollout_batches,
    sleep_plan,
    swap_outcome,
    swap_result,
    timings,
    to_deploy,
    weights_bytes,
)


def record(instance, port=8000, gpus=(), model=None, version="0.32.0", state="active"):
    return {"instance": instance, "unit": f"vllm-{instance}.service", "model": model or instance, "port": port,
            "gpus": list(gpus), "vllm_version": version, "active_state": state}  # fmt: skip


def stop_result(*elapsed):
    return {"results": [{"stop": {"elapsed": seconds}} for seconds in elapsed]}


def test_the_new_instance_takes_the_replaced_one_s_port_and_gpus():
    records = [record("minimax_m25", 8001, [0, 1, 2, 3]), record("other", 8000, [4, 5, 6, 7])]
    assert new_instance("kimi_k25", records, "0.32.0", replace="minimax_m25") == {
        "name": "kimi_k25",
        "model": "kimi_k25",
        "port": 8001,
        "gpus": [0, 1, 2, 3],
    }


def test_without_an_instance_to_replace_it_takes_the_default_port_and_every_gpu():
    assert new_instance("tiny2", [record("tiny")], "0.32.0", default_port=8000) == {
        "name": "tiny2",
        "model": "tiny2",
        "port": 8000,
        "gpus": [],
    }


def test_the_new_model_s_catalog_paths_go_with_the_instance_to_the_preflight():
    spec = new_instance("tiny_tune_tune_1a", [record("tiny")], "0.32.0", catalog_paths=["/tmp/tune/catalog"])
    assert spec["catalog_paths"] == ["/tmp/tune/catalog"]
    assert normalize([spec])[0]["catalog_paths"] == ["/tmp/tune/catalog"]


def test_port_and_gpus_given_win():
    spec = new_instance("tiny2", [record("tiny", 8001, [1])], "0.32.0", replace="tiny", port=9000, gpus="0")
    assert (spec["port"], spec["gpus"]) == (9000, "0")


def test_another_release_of_the_same_model_gets_an_instance_of_its_own():
    records = [record("tiny", version="0.32.0")]
    assert new_instance("tiny", records, "0.31.0")["name"] == "tiny-0.31.0"
    # The same release, a stopped instance, or a name given: the model's name or the given one.
    assert new_instance("tiny", records, "0.32.0")["name"] == "tiny"
    assert new_instance("tiny", [record("tiny", state="inactive")], "0.31.0")["name"] == "tiny"
    assert new_instance("tiny", records, "0.31.0", name="tiny-next")["name"] == "tiny-next"


def test_an_instance_to_replace_that_the_host_lacks_is_named_with_those_it_has():
    with pytest.raises(SwapError, match="the instance to replace, gone, is not an instance of this host; it has a, b"):
        new_instance("tiny", [record("b"), record("a")], "0.32.0", replace="gone")
    with pytest.raises(SwapError, match="needs the new model's catalog name, got ''"):
        new_instance("", [], "0.32.0")


def test_the_downtime_splits_into_stop_memory_wait_load_and_the_collection_s_own():
    clock = {"prepare": 10.0, "prepared": 40.04, "switch": 100.0, "down": 100.5, "up": 145.0}
    started = {"start": {"systemd_start": 0.4, "elapsed": 38.6}}
    assert timings(clock, 146.0, stop_result(3.1, 1.0), {"elapsed": 0.4}, started) == {
        "seconds": 76.0,
        "downtime": 44.5,
        "stop": 4.1,
        "memory_wait": 0.4,
        "load": 38.6,
        "rollback": 0.0,
        "overhead": 1.4,
    }


def test_a_rollback_counts_the_failed_load_and_the_way_back():
    # The start failed after its whole load timeout; the old model served again 40 s after the rollback began.
    clock = {"prepare": -10, "prepared": 0, "switch": 0, "down": 1, "rollback": 302, "up": 342}
    failed_start = {"failed": True, "elapsed": 300.2, "start": None}
    result = timings(clock, 343, stop_result(2.0), {"skipped": True}, failed_start)
    assert (result["downtime"], result["load"], result["rollback"], result["overhead"]) == (341.0, 300.2, 40.0, 0.0)


def test_a_rollback_that_failed_is_down_until_now():
    result = timings({"switch": 0, "down": 1, "rollback": 50, "up": None}, 80, stop_result(1.0), {}, {})
    assert (result["downtime"], result["rollback"]) == (79.0, 30.0)


def test_nothing_stopped_is_no_downtime():
    assert timings({"switch": "5"}, "7.5")["downtime"] == 0.0


def test_the_result_says_what_was_swapped_and_where_the_time_went():
    steps = {
        "old": [record("tiny2", version="0.32.0")],
        "record": record("tiny", version="0.31.0"),
        "clock": {"prepare": -60, "prepared": 0, "switch": 0, "down": 0, "up": 45},
        "stopped": stop_result(5.8),
        "started": {"start": {"elapsed": 36.8}},
    }
    result = swap_result({"result": "swapped", "msg": "tiny serves"}, "h1", "tiny", steps, 46)
    assert result["vllm"] == "0.32.0 -> 0.31.0" and (result["old"], result["new"]) == ("tiny2", "tiny")
    assert (result["mode"], result["asleep"]) == ("stop", [])
    assert result["summary"] == (
        "swapped in 106 s (tiny2 -> tiny); down 45 s = stop 5.8 + GPU memory wait 0 + load 36.8 + the collection's "
        "own 2.4. tiny serves"
    )


def test_the_result_says_what_was_read_ahead_before_the_stop():
    steps = {
        "old": [record("tiny2", version="0.32.0")],
        "record": record("tiny", version="0.32.0"),
        "clock": {"prepare": 0, "prepared": 1, "switch": 1, "down": 3, "up": 40},
        "stopped": stop_result(5.0),
        "started": {"start": {"elapsed": 30.0}},
        "prefetch": {"msg": "read 2.06 GiB of 1 files into the page cache in 1.9 s (1112 MiB/s)"},
    }
    result = swap_result({"result": "swapped", "msg": "tiny serves"}, "h1", "tiny", steps, 41)
    assert result["prefetch"].startswith("read 2.06 GiB")
    assert result["summary"].endswith(
        "tiny serves; prefetch: read 2.06 GiB of 1 files into the page cache in 1.9 s (1112 MiB/s)"
    )
    skipped = swap_result({"result": "swapped", "msg": "m"}, "h1", "tiny", {**steps, "prefetch": {"skipped": True}}, 41)
    assert skipped["prefetch"] == "" and "prefetch" not in skipped["summary"]


def test_a_host_that_serves_the_model_already_keeps_its_release():
    steps = {"record": {}, "running": [record("tiny", version="0.31.0")], "clock": {"prepare": 0, "prepared": 3}}
    result = swap_result(
        swap_outcome("unchanged", "tiny"), "h1", "tiny", {**steps, "clock": {**steps["clock"], "switch": 5}}, 5
    )
    assert (result["result"], result["vllm"], result["msg"], result["seconds"]) == (
        "unchanged",
        "0.31.0",
        "tiny already serves",
        3.0,
    )


def test_a_refused_swap_has_no_old_instance_and_takes_its_preparation_s_time():
    outcome = swap_outcome("refused", "tiny2", failure="Plan: no")
    result = swap_result(outcome, "h2", "tiny2", {"clock": {"prepare": 7}}, 9.5)
    assert (result["old"], result["vllm"], result["seconds"], result["downtime"]) == ("-", "-", 2.5, 0.0)
    assert (result["result"], result["msg"]) == ("refused", "Plan: no")


def test_an_unknown_result_or_clock_reading_is_refused():
    with pytest.raises(SwapError, match="result must be one of"):
        swap_result({"result": "done"}, "h", "m", {}, 0)
    with pytest.raises(ClockError, match=r"clock.switch must be a number of seconds, got 'later'"):
        timings({"switch": "later"}, 0)
    with pytest.raises(ClockError, match=r"now must be a number of seconds, got None"):
        timings({}, None)


def test_the_outcome_of_each_end_of_a_swap():
    old = [record("tiny_a", model="tiny"), record("tiny_b", model="tiny2")]
    assert swap_outcome("unchanged", "tiny3") == {"result": "unchanged", "msg": "tiny3 already serves", "asleep": []}
    skipped = swap_outcome("unchanged", "tiny3", skip_reason="the rollout stopped: 2 of 3 hosts failed")
    assert skipped["result"] == "skipped"
    assert skipped["msg"] == "the rollout stopped: 2 of 3 hosts failed; tiny3 is prepared but not started"
    assert swap_outcome("swapped", "tiny3", old=old)["msg"] == "tiny3 serves"
    rolled = swap_outcome("rolled back", "tiny3", old=old, failure="Start: it died")
    assert rolled["msg"] == "Start: it died; rolled back, tiny, tiny2 serves again"
    assert swap_outcome("rolled back", "tiny3", failure="Start: it died")["msg"] == (
        "Start: it died; rolled back, nothing serves again"
    )
    failed = swap_outcome("failed", "tiny3", old=old, failure="Start: it died", rollback="Start the old: no record")
    assert failed["msg"] == "Start: it died; the rollback failed too (Start the old: no record); check the host"
    with pytest.raises(SwapError, match="an outcome is one of"):
        swap_outcome("prepared", "tiny3")


def test_a_swap_that_could_not_sleep_says_why_the_old_instances_stopped():
    sleep = {"refusals": ["tiny was not started with sleep mode"]}
    assert swap_outcome("swapped", "tiny3", old=[record("tiny")], sleep=sleep)["msg"] == (
        "tiny3 serves; sleep mode refused (tiny was not started with sleep mode), the old instances stopped instead"
    )


def test_the_new_instance_starts_with_sleep_mode_when_the_swap_sleeps_on_a_gpu_build():
    planned = {"name": "tiny2", "port": 8001, "entry": {"name": "tiny2", "sleep_mode": False}}
    assert to_deploy(planned, "sleep", "cuda") == [{**planned, "entry": {"name": "tiny2", "sleep_mode": True}}]
    assert to_deploy(planned, "sleep", "cpu") == [planned]
    assert to_deploy(planned, "stop", "cuda") == [planned]
    assert planned["entry"]["sleep_mode"] is False, "the planned instance is left as it was"
    with pytest.raises(SwapError, match="mode must be one of"):
        to_deploy(planned, "nap", "cuda")


@pytest.mark.parametrize(
    ("results", "percentage", "hosts", "reason"),
    [
        ([{"result": "rolled back"}], 34, 3, ""),
        ([{"result": "rolled back"}, {"result": "refused"}], 34, 3, "2 of 3 hosts failed, more than 34%"),
        ([{"result": "failed"}], 0, 10, "1 of 10 hosts failed, more than 0%"),
        ([{"result": "swapped"}, {"result": "unchanged"}, {"result": "skipped"}], 0, 3, ""),
        ([{"result": "failed"}] * 3, "100", 3, ""),
    ],
)
def test_the_rollout_stops_once_more_hosts_failed_than_it_allows(results, percentage, hosts, reason):
    spent = budget_spent(results, percentage, hosts)
    assert spent == (f"the rollout stopped: {reason}" if reason else "")


@pytest.mark.parametrize("percentage", [-1, 101, "ten", True, 2.5])
def test_a_failure_budget_that_is_no_percentage_is_refused(percentage):
    with pytest.raises(
        SwapError, match=f"max_fail_percentage must be a whole number from 0 to 100, got {percentage!r}"
    ):
        budget_spent([], percentage, 3)


# ---- sleep mode ------------------------------------------------------------------------------------------

GIB = 1024**3
# An H200 host's /proc/meminfo, in part: 2 TiB, 1.5 TiB of it available.
MEMINFO = "MemTotal:       2113929216 kB\nMemFree:        1200000000 kB\nMemAvailable:   1610612736 kB\n"


def sleeper(instance="kimi_k25", port=8000, version="0.26.0", sleep_mode=True):
    return {**record(instance, port=port, version=version), "sleep_mode": sleep_mode}


def test_meminfo_in_mib():
    assert meminfo_mib(MEMINFO) == {"MemTotal": 2064384, "MemFree": 1171875, "MemAvailable": 1572864}


def found(**sizes):
    """The registered loop of ansible.builtin.find over each instance's weights: two files of half the size each."""
    return {
        "results": [
            {"item": {"instance": name}, "files": [{"path": "a.safetensors", "size": size // 2},
                                                   {"path": "b.safetensors", "size": size - size // 2}]}
            for name, size in sizes.items()
        ]
    }  # fmt: skip


def test_the_weights_of_each_instance_are_the_sum_of_its_files():
    assert weights_bytes(found(kimi_k25=595 * GIB, tiny=11)) == {"kimi_k25": 595 * GIB, "tiny": 11}
    assert weights_bytes({"results": [{"item": {"instance": "empty"}, "files": []}]}) == {"empty": 0}
    assert weights_bytes({}) == {}


def test_a_sleep_that_fits_has_no_refusal_and_gives_the_new_instance_s_share():
    new = {"port": 8001, "entry": {"gpu_memory_utilization": 0.85}}
    plan = sleep_plan([sleeper()], new, "cuda", MEMINFO, found(kimi_k25=595 * GIB))
    assert plan == {"refusals": [], "sleeping_mib": 609280.0, "budget_mib": 1366426, "fit_utilization": 0.85}
    # vLLM's own default share when the entry sets none.
    assert sleep_plan([sleeper()], {"port": 8001, "entry": {}}, "cuda", MEMINFO, found())["fit_utilization"] == 0.9


def test_every_reason_against_a_sleep_is_named():
    old = [sleeper("tiny", version="0.9.2", sleep_mode=False)]
    plan = sleep_plan(old, {"port": 8000, "entry": {}}, "cpu", MEMINFO, found(tiny=3 * GIB), budget_mib=1024)
    assert plan["refusals"] == [
        "vLLM's CPU build has no sleep mode (vLLM has it on CUDA, ROCm and XPU)",
        "tiny was not started with sleep mode; deploy it with `sleep_mode: true` in its catalog entry first",
        "tiny runs vLLM 0.9.2, older than sleep mode's 0.10.0",
        "tiny keeps its port 8000 while it sleeps: the new instance needs a port of its own (vllm_swap_port)",
        "the weights of tiny take 3072 MiB of CPU memory asleep, more than the budget of 1024 MiB",
    ]


def test_a_multi_host_group_is_refused_sleep_on_either_side_of_the_swap():
    member = {"role": "head", "hosts": ["gpu-a", "gpu-b"]}
    old = [{**sleeper("pair_old"), "group": member}, sleeper("kimi_k25", port=8002)]
    new = {"name": "pair_new", "port": 8001, "group": member, "entry": {}}
    plan = sleep_plan(old, new, "cuda", MEMINFO, found())
    assert plan["refusals"] == ["pair_old, pair_new are multi-host groups, whose members stop and start together"]
    one = sleep_plan([sleeper()], new, "cuda", MEMINFO, found())
    assert one["refusals"] == ["pair_new is a multi-host group, whose members stop and start together"]


def test_weights_beyond_what_the_host_can_spare_are_refused_and_a_larger_budget_is_cut():
    small_host = "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n"  # 16 GiB, 8 available, 6.4 spare
    for budget in (0, 100_000):
        plan = sleep_plan([sleeper()], {"port": 8001}, "cuda", small_host, found(kimi_k25=7 * GIB), budget)
        assert plan["refusals"] == [
            "the weights of kimi_k25 take 7168 MiB of CPU memory asleep, more than the 6554 MiB that the host can "
            "spare (MemAvailable less 10% of MemTotal)"
        ]
        assert plan["budget_mib"] == 6554


@pytest.mark.parametrize("budget", [-1, True, "8"])
def test_a_budget_that_is_no_number_of_mib_is_refused(budget):
    with pytest.raises(SwapError, match="CPU memory budget must be 0"):
        sleep_plan([], {"port": 1}, "cuda", MEMINFO, found(), budget)


# An H200 read while the old instance serves on it: 0.4 of its memory held.
H200_IN_USE = [{"index": 0, "memory_total_mib": 143771, "memory_used_mib": 57508}]


def test_a_new_instance_that_fits_beside_the_old_one_has_no_refusal_and_gives_its_share():
    new = {"name": "host_b", "port": 8001, "gpus": [0], "entry": {"gpu_memory_utilization": 0.4}}
    assert beside_plan([record("host_a", gpus=[0])], new, H200_IN_USE) == {"refusals": [], "fit_utilization": 0.4}
    # A host without GPUs checks the ports alone.
    assert beside_plan([record("tiny")], {"name": "tiny_b", "port": 8001, "entry": {}}, [])["refusals"] == []


def test_every_reason_against_starting_beside_is_named():
    member = {"role": "head", "hosts": ["gpu-a", "gpu-b"]}
    old = [{**record("pair", gpus=[0]), "group": member}]
    new = {"name": "host_b", "port": 8000, "gpus": [], "entry": {"gpu_memory_utilization": 0.6}}
    assert beside_plan(old, new, H200_IN_USE)["refusals"] == [
        "pair is a multi-host group, whose members stop and start together",
        "pair serves on port 8000 until the new instance has passed its gate: the new instance needs a port of its"
        " own (vllm_swap_port)",
        "GPU 0 holds 57508 of 143771 MiB while the old instances serve, and the new one's share (0.6, 86263 MiB)"
        " does not fit beside them: lower its gpu_memory_utilization, or swap by stop or sleep",
    ]
    # Only the new instance's GPUs count.
    other_gpu = [*H200_IN_USE, {"index": 1, "memory_total_mib": 143771, "memory_used_mib": 0}]
    assert beside_plan([record("a")], {**new, "port": 8001, "gpus": [1]}, other_gpu)["refusals"] == []


def test_a_swap_beside_says_that_the_old_instances_served_until_the_new_one_was_gated():
    outcome = swap_outcome("swapped", "host_b", old=[record("host_a")], beside=True)
    assert outcome["msg"] == "host_b serves; host_a served beside it until its gate, then stopped"
    steps = {"old": [record("host_a")], "record": record("host_b", port=8001), "beside": True,
             "clock": {"prepare": 0, "prepared": 1, "switch": 1, "up": 40}, "stopped": stop_result(2)}  # fmt: skip
    result = swap_result(outcome, "h1", "host_b", steps, 45)
    assert (result["mode"], result["downtime"]) == ("beside", 0.0)


def test_a_swap_by_sleep_says_so_and_names_those_kept_asleep():
    steps = {
        "old": [sleeper()],
        "record": record("minimax_m25", version="0.26.0"),
        "sleeping": True,
        "clock": {"prepare": -20, "prepared": 0, "switch": 0, "down": 0, "up": 31.4},
        "stopped": {"results": [{"sleep": {"elapsed": 1.3}, "stop": None}]},
        "memory": {"elapsed": 0.1},
        "started": {"start": {"elapsed": 29.5}},
    }
    outcome = swap_outcome("swapped", "minimax_m25", old=steps["old"], sleeping=True, keep_asleep=True)
    assert outcome == {"result": "swapped", "msg": "minimax_m25 serves", "asleep": ["kimi_k25"]}
    result = swap_result(outcome, "h1", "minimax_m25", steps, 32)
    assert (result["mode"], result["asleep"], result["stop"]) == ("sleep", ["kimi_k25"], 1.3)
    assert result["summary"] == (
        "swapped in 52 s (kimi_k25 -> minimax_m25); down 31.4 s = sleep 1.3 + GPU memory wait 0.1 + load 29.5 + the "
        "collection's own 0.5. minimax_m25 serves; kimi_k25 kept asleep"
    )
    slept_then_stopped = swap_outcome("swapped", "minimax_m25", old=steps["old"], sleeping=True)
    assert slept_then_stopped == {"result": "swapped", "msg": "minimax_m25 serves; kimi_k25 slept, then stopped",
                                  "asleep": []}  # fmt: skip


def test_the_result_counts_the_requests_that_the_stop_cut_off():
    stopped = {"results": [{"stop": {"elapsed": 4.0, "aborted_requests": 3, "refused_requests": 2}},
                           {"stop": {"elapsed": 1.0, "aborted_requests": 1, "refused_requests": 0}}]}  # fmt: skip
    steps = {
        "old": [record("tiny2", version="0.32.0")],
        "record": record("tiny", version="0.32.0"),
        "clock": {"prepare": 0, "prepared": 1, "switch": 1, "down": 1, "up": 40},
        "stopped": stopped,
        "started": {"start": {"elapsed": 30.0}},
    }
    result = swap_result({"result": "swapped", "msg": "tiny serves"}, "h1", "tiny", steps, 41)
    assert (result["aborted_requests"], result["refused_requests"]) == (4, 2)
    assert result["summary"].endswith("tiny serves; requests the stop cut off: 4 aborted, 2 refused after SIGTERM")
    quiet = swap_result(
        {"result": "swapped", "msg": "tiny serves"}, "h1", "tiny", {**steps, "stopped": stop_result(5)}, 41
    )
    assert (quiet["aborted_requests"], quiet["refused_requests"]) == (0, 0)
    assert quiet["summary"].endswith("tiny serves")


GATE = {
    "decision": "regress", "mode": "paired", "rounds": 5, "seconds": 38.24, "spread": 0.061, "failed": True,
    "serial_correlation": 0.12,
    "metrics": [
        {"name": "output_throughput", "decision": "regress", "change_percent": -41.83,
         "interval_percent": [-47.04, -36.1]},
        {"name": "median_ttft_ms", "decision": "pass", "change_percent": 2.0, "interval_percent": [-3.0, 7.0]},
    ],
}  # fmt: skip


def test_a_rolled_back_host_s_result_names_the_gate_s_decision_interval_and_rounds():
    steps = {
        "old": [record("tiny")],
        "record": record("tiny2"),
        "clock": {"prepare": 0, "prepared": 1, "switch": 1, "down": 1, "rollback": 80, "up": 110},
        "stopped": stop_result(2),
        "started": {"start": {"elapsed": 30.0}},
        "gate": GATE,
    }
    outcome = swap_outcome("rolled back", "tiny2", old=steps["old"], failure="Gate: regress")
    result = swap_result(outcome, "h1", "tiny2", steps, 111)
    assert result["gate"] == {
        "decision": "regress", "mode": "paired", "rounds": 5, "seconds": 38.2, "spread": 0.061,
        "serial_correlation": 0.12,
        "metrics": [{"name": "output_throughput", "decision": "regress", "change_percent": -41.8,
                     "interval_percent": [-47.0, -36.1]}],
        "answer": "regress in 5 rounds: output_throughput -41.8% [-47.0%, -36.1%]",
    }  # fmt: skip
    assert result["gate_answer"] == result["gate"]["answer"]
    assert result["summary"].endswith(
        "rolled back, tiny serves again; gate: regress in 5 rounds: output_throughput -41.8% [-47.0%, -36.1%] (38.2 s)"
    )
    assert swap_result(outcome, "h1", "tiny2", {**steps, "gate": {"skipped": True}}, 111)["gate"] is None
    assert gate_summary({"failed": True, "msg": "round 2: 1 of 64 requests to the candidate failed"}) is None


def offer(host, model="tiny", version="0.32.0", gpus=("NVIDIA H200",)):
    return gate_offer([record(model, version=version) | {"served_name": model}], host, f"addr-{host}", "/etc/vllm",
                      {"device": "cuda", "gpus": list(gpus)})  # fmt: skip


def prepared(host, **kind):
    return {"host": host, "result": "prepared", "reference": offer(host, **kind)}


def test_each_host_of_a_batch_takes_its_own_reference_of_the_same_kind_and_release_outside_the_batch():
    results = [
        prepared("a"), prepared("b"), prepared("c", gpus=("NVIDIA H100",)), prepared("d", version="0.31.0"),
        prepared("e"), prepared("f"),
    ]  # fmt: skip
    assert gate_reference(results, "a", ["a", "b"]) == {
        "host": "e", "address": "addr-e", "config_dir": "/etc/vllm", "instance": "tiny",
    }  # fmt: skip
    assert gate_reference(results, "b", ["a", "b"])["host"] == "f"
    # Another kind of GPU or another release is no reference; a switched host is none either.
    assert gate_reference(results, "c", ["c"]) == {}
    assert gate_reference(results, "d", ["d"]) == {}
    switched = [{"host": "e", "result": "swapped"} if r["host"] == "e" else r for r in results]
    assert gate_reference(switched, "f", ["f"])["host"] == "a"
    assert gate_reference([prepared("a")], "a", ["a"]) == {}


def test_a_host_of_a_multi_host_group_neither_takes_nor_gives_a_reference():
    pair = [prepared("a") | {"group": ["a", "b"]}, prepared("b") | {"group": ["a", "b"]}]
    assert gate_reference([*pair, prepared("e")], "a", ["a", "b"]) == {}
    assert gate_reference([*pair, prepared("e")], "e", ["e"]) == {}


# ---- a rollout's batches ----------------------------------------------------------------------------------

PAIR = [{"host": host, "result": "prepared", "group": ["a", "b"]} for host in ("a", "b")]


@pytest.mark.parametrize(
    ("hosts", "results", "batch", "batches"),
    [
        (["a", "b", "c", "d"], [], 1, [1, 1, 1, 1]),
        (["a", "b", "c", "d"], PAIR, 1, [2, 1, 1]),
        (["c", "a", "b", "d"], PAIR, 1, [1, 2, 1]),
        # A group's hosts apart in the play's order: the batch takes what lies between them too.
        (["a", "c", "b", "d"], PAIR, 1, [3, 1]),
        (["c", "a", "b", "d"], PAIR, 2, [1 + 2, 1]),
        (["a", "b", "c", "d"], PAIR, "25%", [2, 1, 1]),
        (["c", "d", "a", "b"], PAIR, "50%", [2, 2]),
        (["a", "b", "c", "d"], PAIR, [1, 5], [2, 2]),
        (["a", "b", "c", "d"], PAIR, "0%", [2, 1, 1]),
        (["a", "b", "c", "d"], PAIR, 0, [4]),
        # A group host outside the play (refused before) grows no batch.
        (["a", "c"], PAIR, 1, [1, 1]),
    ],
)
def test_a_rollout_s_batches_hold_each_multi_host_group_whole(hosts, results, batch, batches):
    assert rollout_batches(hosts, results, batch) == batches
    assert sum(batches) == len(hosts)


@pytest.mark.parametrize("batch", ["ten", "-1", True, [], [1, "x"], 2.5])
def test_a_batch_that_is_no_size_is_refused(batch):
    with pytest.raises(SwapError, match="vllm_rollout_batch must be a number of hosts, a percentage of them"):
        rollout_batches(["a"], [], batch)
