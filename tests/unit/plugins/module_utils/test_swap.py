import pytest

from ansible_collections.llmops.vllm.plugins.module_utils._swap import (
    SwapError,
    budget_spent,
    meminfo_mib,
    new_instance,
    sleep_plan,
    swap_result,
    timings,
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
    clock = {"prepared": 30.04, "switch": 100.0, "down": 100.5, "up": 145.0, "now": 146.0}
    started = {"start": {"systemd_start": 0.4, "elapsed": 38.6}}
    assert timings(clock, stop_result(3.1, 1.0), {"elapsed": 0.4}, started) == {
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
    clock = {"prepared": 10, "switch": 0, "down": 1, "rollback": 302, "up": 342, "now": 343}
    failed_start = {"failed": True, "elapsed": 300.2, "start": None}
    result = timings(clock, stop_result(2.0), {"skipped": True}, failed_start)
    assert (result["downtime"], result["load"], result["rollback"], result["overhead"]) == (341.0, 300.2, 40.0, 0.0)


def test_a_rollback_that_failed_is_down_until_now():
    result = timings({"switch": 0, "down": 1, "rollback": 50, "now": 80}, stop_result(1.0), {}, {})
    assert (result["downtime"], result["rollback"]) == (79.0, 30.0)


def test_nothing_stopped_is_no_downtime():
    assert timings({"switch": "5", "now": "7.5"})["downtime"] == 0.0


def test_the_result_says_what_was_swapped_and_where_the_time_went():
    clock = {"prepared": 60, "switch": 0, "down": 0, "up": 45, "now": 46}
    old = [record("tiny2", version="0.32.0")]
    outcome = {"result": "swapped", "msg": "tiny serves"}
    result = swap_result(
        outcome, "h1", old, "tiny", "0.31.0", clock, stop_result(5.8), {}, {"start": {"elapsed": 36.8}}
    )
    assert result["vllm"] == "0.32.0 -> 0.31.0" and (result["old"], result["new"]) == ("tiny2", "tiny")
    assert result["summary"] == (
        "swapped in 106 s (tiny2 -> tiny); down 45 s = stop 5.8 + GPU memory wait 0 + load 36.8 + the collection's "
        "own 2.4. tiny serves"
    )


def test_a_refused_swap_has_no_old_instance_and_takes_no_time():
    result = swap_result({"result": "refused", "msg": "Plan: no"}, "h2", [], "tiny2", "", {"switch": 7, "now": 7})
    assert (result["old"], result["vllm"], result["seconds"], result["downtime"]) == ("-", "-", 0.0, 0.0)


def test_an_unknown_result_or_clock_reading_is_refused():
    with pytest.raises(SwapError, match="result must be one of"):
        swap_result({"result": "done"}, "h", [], "m", "", {"switch": 0, "now": 0})
    with pytest.raises(SwapError, match=r"clock.now must be a number of seconds, got 'later'"):
        timings({"switch": 0, "now": "later"})


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


def test_a_sleep_that_fits_has_no_refusal_and_gives_the_new_instance_s_share():
    new = {"port": 8001, "entry": {"gpu_memory_utilization": 0.85}}
    plan = sleep_plan([sleeper()], new, "cuda", MEMINFO, {"kimi_k25": 595 * GIB})
    assert plan == {"refusals": [], "sleeping_mib": 609280.0, "budget_mib": 1366426, "fit_utilization": 0.85}
    # vLLM's own default share when the entry sets none.
    assert sleep_plan([sleeper()], {"port": 8001, "entry": {}}, "cuda", MEMINFO, {})["fit_utilization"] == 0.9


def test_every_reason_against_a_sleep_is_named():
    old = [sleeper("tiny", version="0.9.2", sleep_mode=False)]
    plan = sleep_plan(old, {"port": 8000, "entry": {}}, "cpu", MEMINFO, {"tiny": 3 * GIB}, budget_mib=1024)
    assert plan["refusals"] == [
        "vLLM's CPU build has no sleep mode (vLLM has it on CUDA, ROCm and XPU)",
        "tiny was not started with sleep mode; deploy it with `sleep_mode: true` in its catalog entry first",
        "tiny runs vLLM 0.9.2, older than sleep mode's 0.10.0",
        "tiny keeps its port 8000 while it sleeps: the new instance needs a port of its own (vllm_swap_port)",
        "the weights of tiny take 3072 MiB of CPU memory asleep, more than the budget of 1024 MiB",
    ]


def test_weights_beyond_what_the_host_can_spare_are_refused_and_a_larger_budget_is_cut():
    small_host = "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n"  # 16 GiB, 8 available, 6.4 spare
    for budget in (0, 100_000):
        plan = sleep_plan([sleeper()], {"port": 8001}, "cuda", small_host, {"kimi_k25": 7 * GIB}, budget)
        assert plan["refusals"] == [
            "the weights of kimi_k25 take 7168 MiB of CPU memory asleep, more than the 6554 MiB that the host can "
            "spare (MemAvailable less 10% of MemTotal)"
        ]
        assert plan["budget_mib"] == 6554


@pytest.mark.parametrize("budget", [-1, True, "8"])
def test_a_budget_that_is_no_number_of_mib_is_refused(budget):
    with pytest.raises(SwapError, match="CPU memory budget must be 0"):
        sleep_plan([], {"port": 1}, "cuda", MEMINFO, {}, budget)


def test_a_swap_by_sleep_says_so_and_names_those_kept_asleep():
    clock = {"prepared": 20, "switch": 0, "down": 0, "up": 31.4, "now": 32}
    slept = {"results": [{"sleep": {"elapsed": 1.3}, "stop": None}]}
    outcome = {"result": "swapped", "msg": "minimax_m25 serves", "asleep": ["kimi_k25"]}
    result = swap_result(
        outcome, "h1", [sleeper()], "minimax_m25", "0.26.0", clock, slept, {"elapsed": 0.1},
        {"start": {"elapsed": 29.5}}, mode="sleep",
    )  # fmt: skip
    assert (result["mode"], result["asleep"], result["stop"]) == ("sleep", ["kimi_k25"], 1.3)
    assert result["summary"] == (
        "swapped in 52 s (kimi_k25 -> minimax_m25); down 31.4 s = sleep 1.3 + GPU memory wait 0.1 + load 29.5 + the "
        "collection's own 0.5. minimax_m25 serves; kimi_k25 kept asleep"
    )
    with pytest.raises(SwapError, match="mode must be one of"):
        swap_result(outcome, "h1", [], "m", "", clock, mode="nap")
