import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.llmops.vllm.plugins.module_utils.common.clock import ClockError
from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import check_entry, serve_spec
from ansible_collections.llmops.vllm.plugins.module_utils.plan.planner import plan
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import build_serve_args
from ansible_collections.llmops.vllm.plugins.module_utils.tune.candidates import (
    TuneError,
    candidate_entry,
    expand,
    overlay_entry,
    plan_candidates,
    resume_key,
)
from ansible_collections.llmops.vllm.plugins.module_utils.tune.guard import bystanders, guard_command
from ansible_collections.llmops.vllm.plugins.module_utils.tune.ledger import (
    bench_seconds,
    count,
    outcome,
    over_budget,
    planned_rows,
    runs,
    time_split,
)
from ansible_collections.llmops.vllm.plugins.module_utils.tune.winner import check_objective, pareto_front, winner

ROOT = Path(__file__).resolve().parents[5]
WORKLOAD = {"concurrency": [1, 4], "num_requests": 8, "input_len": 32, "output_len": 16, "endpoint": "completions"}
MINIMAX_CONFIG = json.loads((ROOT / "tests/unit/fixtures/configs/MiniMax-M2.5.config.json").read_text())


def entry(name="tiny"):
    return check_entry(name, yaml.safe_load((ROOT / "models" / f"{name}.yml").read_text()))


def tune_entry():
    return check_entry("tiny_tune", yaml.safe_load((ROOT / "tests/integration/catalog/tiny_tune.yml").read_text()))


def level(concurrency, throughput, ttft, itl=10.0):
    return {"max_concurrency": concurrency, "output_throughput": throughput, "median_ttft_ms": ttft,
            "p99_itl_ms": itl, "duration": 2.0, "completed": 8, "failed": 0}  # fmt: skip


def measured(name, *levels):
    return {"name": name, "key": f"k-{name}", "verdict": "measured", "levels": list(levels)}


def test_the_layouts_times_the_grid_in_order():
    found = expand(tune_entry(), grid={"max_num_seqs": [4, 16], "max_num_batched_tokens": [32]})
    assert [item["name"] for item in found] == [
        "default max_num_seqs=4 max_num_batched_tokens=32",
        "default max_num_seqs=16 max_num_batched_tokens=32",
        "tp3 max_num_seqs=4 max_num_batched_tokens=32",
        "tp3 max_num_seqs=16 max_num_batched_tokens=32",
    ]
    assert found[2]["layout"] == {"tensor_parallel_size": 3} and found[2]["layout_name"] == "tp3"


def test_without_a_grid_each_layout_is_one_candidate():
    assert [item["name"] for item in expand(entry("minimax_m25"))] == ["default", "ep8", "dp8_ep"]
    chosen = expand(entry("minimax_m25"), layouts=["default", {"tensor_parallel_size": 8}, "ep8"])
    assert [(item["name"], item["layout"]) for item in chosen] == [
        ("default", {"tensor_parallel_size": 4}),
        ("TP8", {"tensor_parallel_size": 8}),
        ("ep8", {"tensor_parallel_size": 8, "expert_parallel_size": 8}),
    ]


def test_the_user_s_list_replaces_layouts_and_grid():
    found = expand(
        entry(),
        grid={"max_num_seqs": [1, 2, 3]},
        candidates=[{"name": "eager off", "settings": {"enforce_eager": False}}, {"settings": {"max_num_seqs": 8}}],
    )
    assert [(item["name"], item["settings"]) for item in found] == [
        ("eager off", {"enforce_eager": False}),
        ("default max_num_seqs=8", {"max_num_seqs": 8}),
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"grid": {"max_num_sequences": [8]}}, "unknown setting 'max_num_sequences'"),
        ({"grid": {"max_num_seqs": []}}, "non-empty list"),
        ({"grid": {"max_num_seqs": [0]}}, "max_num_seqs must be a whole number"),
        ({"grid": {"gpu_memory_utilization": [1.5]}}, "fraction"),
        ({"grid": {"enforce_eager": ["yes"]}}, "true or false"),
        ({"layouts": ["tp9"]}, "not a mapping nor one of tiny's"),
        ({"candidates": [{"layout": "default", "flags": []}]}, "candidate 1 must be a mapping of"),
        ({"candidates": [{"settings": {}}, {"settings": {}}]}, "two candidates are both 'default'"),
    ],
)
def test_bad_options_are_refused_with_the_reason(options, message):
    with pytest.raises(TuneError, match=message):
        expand(entry(), options.get("layouts"), options.get("grid"), options.get("candidates"))


def test_a_candidate_reaches_the_command_line_through_its_own_catalog_entry():
    candidate = expand(entry(), grid={"max_num_seqs": [8], "max_num_batched_tokens": [512], "enforce_eager": [False],
                                      "extra_args": [["--no-enable-prefix-caching"]]})[0]  # fmt: skip
    name, raw, checked = candidate_entry(entry(), candidate, "0123456789abcdef", "/var/lib/vllm/models/tiny")
    assert name == "tiny_tune_0123456789"
    assert raw["source"] == {"kind": "local", "path": "/var/lib/vllm/models/tiny"}
    assert raw["alternatives"] == {} and "name" not in raw and "checkpoint_bytes" not in raw
    args = build_serve_args(serve_spec(checked, checked["layout"], model="/w"))
    assert args[args.index("--max-num-seqs") + 1] == "8"
    assert "--enforce-eager" not in args
    assert args[-3:] == ["--max-num-batched-tokens", "512", "--no-enable-prefix-caching"]


def test_a_setting_replaces_the_entry_s_own_flag_rather_than_adding_a_second():
    base = check_entry("m", {"source": {"kind": "generated"}, "served_name": "m",
                             "extra_args": ["--max-num-batched-tokens", "64", "--enforce-eager"]})  # fmt: skip
    candidate = expand(base, grid={"max_num_batched_tokens": [128], "enforce_eager": [True]})[0]
    raw = candidate_entry(base, candidate, "f" * 16)[1]
    assert raw["extra_args"] == ["--max-num-batched-tokens", "128", "--enforce-eager"]
    assert raw["source"] == {"kind": "generated"}, "without weights on a host the entry's own source stays"


def test_the_resume_key_changes_with_the_candidate_the_workload_and_the_entry():
    candidate = expand(entry(), grid={"max_num_seqs": [8]})[0]
    key = resume_key(entry(), candidate, WORKLOAD)
    assert key == resume_key(entry(), dict(candidate), dict(WORKLOAD)) and len(key) == 16
    assert key != resume_key(entry(), {**candidate, "settings": {"max_num_seqs": 16}}, WORKLOAD)
    assert key != resume_key(entry(), candidate, {**WORKLOAD, "output_len": 17})
    assert key != resume_key({**entry(), "extra_args": []}, candidate, WORKLOAD)
    # A description says nothing about what is measured.
    assert key == resume_key({**entry(), "description": "other words"}, candidate, WORKLOAD)


def test_a_saved_measurement_of_the_same_key_is_resumed_and_a_refusal_is_planned_again():
    first = plan_candidates(tune_entry(), {"workload": WORKLOAD, "weights_path": "/w"})
    saved = {"candidates": [
        {"key": first[0]["key"], "verdict": "measured", "levels": [level(1, 100, 20)], "load_s": 21.0},
        {"key": first[1]["key"], "verdict": "refused", "reason": "TP 3"},
    ]}  # fmt: skip
    again = plan_candidates(tune_entry(), {"workload": WORKLOAD, "weights_path": "/w"}, saved)
    assert again[0]["saved"]["load_s"] == 21.0 and again[1]["saved"] is None
    other = plan_candidates(tune_entry(), {"workload": {**WORKLOAD, "num_requests": 9}, "weights_path": "/w"}, saved)
    assert other[0]["saved"] is None, "another workload measures again"


def test_the_planner_refuses_tp3_of_tiny_from_its_config():
    candidates = plan_candidates(tune_entry(), {"workload": WORKLOAD, "weights_path": "/w"})
    config = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "intermediate_size": 512, "max_position_embeddings": 2048}  # fmt: skip
    plans = []
    for candidate in candidates:
        result = plan(candidate["entry"], config)
        plans.append({**result, "msg": result.get("reason", "")})
    rows = planned_rows(candidates, plans)
    assert [rows[candidate["key"]]["verdict"] for candidate in candidates] == ["pending", "refused"]
    reason = rows[candidates[1]["key"]]["reason"]
    assert reason.startswith("tiny_tune TP3: 4 attention heads are not divisible by tensor_parallel_size 3")
    assert candidates[1]["entry_name"] not in reason, "the model's name, not the candidate's entry"


def test_minimax_tp8_is_refused_for_fp8_alignment_and_ep8_passes():
    minimax = entry("minimax_m25")
    candidates = plan_candidates(minimax, {"layouts": [{"tensor_parallel_size": 8}, "ep8"], "workload": WORKLOAD})
    verdicts = [plan(candidate["entry"], MINIMAX_CONFIG) for candidate in candidates]
    assert [result["ok"] for result in verdicts] == [False, True]
    assert verdicts[0]["failed_rules"] == ["quantization_alignment"]


def test_outcomes_of_a_swap_and_a_benchmark():
    candidate = {**plan_candidates(entry(), {"workload": WORKLOAD})[0], "saved": None}
    swapped = {"result": "swapped", "load": 24.3, "msg": "serves"}
    bench = {"levels": [{**level(1, 100.0, 20.0), "p90_ttft_ms": 30.0}, {**level(4, 300.0, 30.0), "duration": 3.04}]}
    row = outcome(candidate, swapped, bench)
    assert (row["verdict"], row["load_s"], row["bench_s"]) == ("measured", 24.3, 5.0)
    assert "p90_ttft_ms" not in row["levels"][0] and row["levels"][0]["median_ttft_ms"] == 20.0
    rolled = outcome(candidate, {"result": "rolled back", "load": 9.1, "msg": "failed while loading: ValueError"})
    assert (rolled["verdict"], rolled["load_s"]) == ("failed", 9.1)
    assert rolled["reason"] == "failed while loading: ValueError"
    broken = outcome(candidate, swapped, {"failed": True, "msg": "C=4: 8 of 8 requests failed"})
    assert broken["verdict"] == "failed" and broken["reason"] == "benchmark: C=4: 8 of 8 requests failed"
    saved = outcome({**candidate, "saved": {"verdict": "measured", "levels": [level(1, 5, 5)], "load_s": 3.0}})
    assert saved["resumed"] and saved["load_s"] == 3.0


def test_the_winner_at_the_highest_level_and_the_runner_up():
    candidates = [
        measured("a", level(1, 100, 20), level(4, 300, 40)),
        measured("b", level(1, 120, 15), level(4, 280, 35)),
        {"name": "c", "key": "k-c", "verdict": "failed", "levels": []},
    ]
    best = winner(candidates)
    assert (best["name"], best["level"], best["output_throughput"]) == ("a", 4, 300)
    assert best["reason"] == "a: 300 output tok/s at C=4, the highest output throughput; next b with 280 tok/s (at C=4)"
    assert winner(candidates, concurrency=1)["name"] == "b"


def test_the_winner_under_an_slo_is_scored_at_the_highest_level_that_meets_it():
    candidates = [
        measured("fast", level(1, 100, 20), level(4, 400, 600)),
        measured("steady", level(1, 90, 25), level(4, 350, 300)),
    ]
    best = winner(candidates, slo={"median_ttft_ms": 500})
    assert (best["name"], best["level"]) == ("steady", 4)
    assert "meets the SLO up to C=4, under the SLO median_ttft_ms <= 500" in best["reason"]
    none = winner(candidates, slo={"median_ttft_ms": 1})
    assert none["name"] is None and "median_ttft_ms <= 1" in none["reason"]


@pytest.mark.parametrize(
    ("concurrency", "slo", "message"),
    [
        (8, {}, "not one of the levels benchmarked"),
        (1, {"median_ttft_ms": 500}, "choose an objective"),
        (0, {"output_throughput": 5}, "not a latency"),
        (0, {"median_ttft_ms": -1}, "above 0"),
    ],
)
def test_an_objective_that_cannot_be_scored_is_refused(concurrency, slo, message):
    with pytest.raises(TuneError, match=message):
        check_objective(concurrency, slo, [1, 4])


def test_the_pareto_front_keeps_what_nothing_beats_on_both():
    points = [(10, 100, "a"), (20, 90, "b"), (30, 300, "c"), (25, 200, "d"), (40, 250, "e")]
    assert pareto_front(points) == [(10, 100, "a"), (25, 200, "d"), (30, 300, "c")]


def test_the_budget_stops_the_next_candidate_at_the_mean_cost():
    assert over_budget([], 0, 1000, 1100) == ""
    assert over_budget([], 120, 1000, 1100) == "", "the first candidate always runs"
    assert over_budget([[1005, 1045]], 120, 1000, 1050) == ""
    assert over_budget([[1000, 1040], ["1040", "1090"]], 120, 1000, 1090) == (
        "time budget: 90 s spent of 120 s, and a candidate takes about 45 s"
    )
    with pytest.raises(ClockError, match="now must be a number of seconds, got 'soon'"):
        over_budget([], 120, 1000, "soon")


def test_the_ledger_counts_each_step_from_its_own_result():
    run = count({"started": "2026-12-03T14:00:00+00:00"})
    assert run == {"started": "2026-12-03T14:00:00+00:00", "loads_s": 0, "benchmarks_s": 0, "stops_s": 0,
                   "measured": 0, "resumed": 0}  # fmt: skip
    run = count(run, stop={"changed": True, "stop": {"elapsed": 1.5}})
    run = count(run, resumed=True)
    rolled_back = {"result": "rolled back", "load": 30.0, "rollback": 12.5}
    run = count(run, swap=rolled_back, bench={}, stop={"skipped": True}, measured=True)
    swapped = {"result": "swapped", "load": 20.0, "rollback": 0.0}
    bench = {"levels": [level(1, 100, 20), level(4, 300, 30)]}
    run = count(run, swap=swapped, bench=bench, stop={"stop": {"elapsed": 2.0}}, measured=True)
    run = count(run, start={"start": {"elapsed": 8.0}})
    assert run == {"started": "2026-12-03T14:00:00+00:00", "loads_s": 58.0, "benchmarks_s": 4.0, "stops_s": 16.0,
                   "measured": 2, "resumed": 1}  # fmt: skip


def test_a_benchmark_that_failed_took_no_benchmark_time():
    assert bench_seconds({"failed": True, "msg": "C=4: 8 of 8 requests failed"}) == 0.0
    assert bench_seconds(None) == 0.0
    assert bench_seconds({"levels": [level(1, 1, 1), {**level(4, 1, 1), "duration": 0.5}]}) == 2.5


def test_the_runs_of_the_report_end_with_this_one_and_its_total():
    saved = {"runs": [{"started": "a", "total_s": 10.0}, {"started": "b", "total_s": 3.0}]}
    assert runs({"started": "b", "measured": 1}, saved, 1000, 1042.5) == [
        {"started": "a", "total_s": 10.0},
        {"started": "b", "measured": 1, "total_s": 42.5},
    ]
    assert runs({"started": "c"}, {}, 5, 6) == [{"started": "c", "total_s": 1.0}]


def test_the_guard_is_a_timer_whose_service_runs_each_command_as_a_line_of_its_own():
    head = ["systemd-run", "--unit=llmops-vllm-tune-guard-tiny", "--on-active=1200", "--timer-property=AccuracySec=1s",
            "--description=llmops.vllm tune guard of tiny"]  # fmt: skip
    command = guard_command("llmops-vllm-tune-guard-tiny", 1200, "tiny", "vllm-tiny-tune.service", "vllm-tiny.service")
    assert command == [
        *head,
        "--property=ExecStartPre=-systemctl stop vllm-tiny-tune.service",
        "--property=ExecStartPre=-systemctl disable vllm-tiny-tune.service",
        "systemctl", "start", "--no-block", "vllm-tiny.service",
    ]  # fmt: skip
    # Before the first candidate nothing is to be stopped; an instance that did not serve is not started.
    assert guard_command("llmops-vllm-tune-guard-tiny", 1200, "tiny", "", "") == [*head, "true"]


@pytest.mark.parametrize(
    ("after", "unit", "message"),
    [(0, "vllm-tiny.service", "above 0"), ("900", "vllm-tiny.service", "above 0"), (60, "vllm tiny", "not a unit")],
)
def test_a_guard_that_cannot_fire_as_meant_is_refused(after, unit, message):
    with pytest.raises(TuneError, match=message):
        guard_command("llmops-vllm-tune-guard-tiny", after, "tiny", unit)


def test_the_time_split_gives_the_rest_to_the_collection():
    assert time_split({"total_s": 100, "loads_s": 60, "benchmarks_s": 20.04, "stops_s": 5}) == {
        "total_s": 100.0, "loads_s": 60.0, "benchmarks_s": 20.0, "stops_s": 5.0, "overhead_s": 15.0,
    }  # fmt: skip


def test_the_overlay_is_the_model_s_own_entry_with_the_winner_s_layout_and_settings():
    candidate = expand(tune_entry(), grid={"max_num_seqs": [16]})[0]
    raw = overlay_entry(tune_entry(), candidate)
    assert raw["source"] == {"kind": "generated"} and raw["max_num_seqs"] == 16
    assert raw["alternatives"] == {"tp3": {"tensor_parallel_size": 3}}
    assert check_entry("tiny_tune", raw)["max_num_seqs"] == 16


def record(instance, port, gpus=(), state="active"):
    return {"instance": instance, "port": port, "gpus": list(gpus), "active_state": state}


def test_bystanders_are_the_running_instances_on_the_tuned_instance_s_port_or_gpus():
    tuned = record("host_a", 8000, state="inactive")
    records = [
        tuned,
        record("host_b", 8000),  # the port: the H200 run's case, host_a stopped by a rollout, host_b serving
        record("host_c", 8001, gpus=[0]),  # the GPU
        record("host_d", 8002, gpus=[1]),  # neither
        record("host_e", 8000, state="inactive"),  # not running
        record("host_a-tune", 8000),  # a candidate an interrupted run left: the tune stops it itself
    ]
    assert bystanders(tuned | {"gpus": [0]}, records, "host_a-tune", gpu_count=2) == ["host_b", "host_c"]


def test_a_tuned_instance_without_gpus_listed_uses_them_all_and_no_other_instance_is_a_bystander_of_itself():
    tuned = record("tiny", 8000)
    assert bystanders(tuned, [tuned, record("other", 8001, gpus=[1])], "tiny-tune", gpu_count=2) == ["other"]
    assert bystanders(tuned, [tuned, record("other", 8001)], "tiny-tune") == []


def test_bystanders_need_the_tuned_instance_s_record():
    with pytest.raises(TuneError, match="needs its instance and port"):
        bystanders({}, [], "tiny-tune")
