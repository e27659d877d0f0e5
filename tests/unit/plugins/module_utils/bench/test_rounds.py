# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's rounds: who is measured first, when the rounds stop, what a baseline holds and refuses, and what the
answer says. The servers are functions of the side and the round; the clock is counted, not read."""

import math
import random

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.gate import GateSettings
from ansible_collections.llmops.vllm.plugins.module_utils.bench.rounds import (
    BASELINE,
    BASELINE_KIND,
    CANDIDATE,
    DECIDED,
    MAX_ROUNDS,
    RECORD,
    REFERENCE,
    TIME_BUDGET,
    baseline_mismatches,
    baseline_of,
    baseline_rounds,
    environment_of,
    metric_directions,
    percentiles_of,
    run_rounds,
    summary_of,
)

DIRECTIONS = {"output_throughput": "higher", "median_ttft_ms": "lower"}


class Servers:
    """Two servers whose throughput is `base` (the candidate `change` times it) with lognormal noise of `spread`;
    their TTFT moves the other way. Each measure advances a counted clock by `seconds`."""

    def __init__(self, change=1.0, spread=0.03, seed=1, seconds=10.0, failing=None):
        self.rng = random.Random(seed)
        self.change, self.spread, self.seconds, self.failing = change, spread, seconds, failing
        self.now = 0.0
        self.calls = []

    def clock(self):
        return self.now

    def measure(self, side, round_number):
        self.calls.append((round_number, side))
        self.now += self.seconds
        throughput = 1000.0 * (self.change if side == CANDIDATE else 1.0) * math.exp(self.rng.gauss(0, self.spread))
        failed = 2 if (side, round_number) == self.failing else 0
        return {
            "output_throughput": throughput,
            "median_ttft_ms": 1e5 / throughput,
            "failed": failed,
            "num_requests": 16,
            "errors": ["HTTP 500 Internal Server Error"] if failed else [],
        }


def test_the_reference_goes_first_in_odd_rounds_and_the_candidate_in_even_ones():
    servers = Servers()
    run = run_rounds(servers.measure, DIRECTIONS, GateSettings(), clock=servers.clock)
    assert servers.calls[:6] == [
        (1, REFERENCE), (1, CANDIDATE), (2, CANDIDATE), (2, REFERENCE), (3, REFERENCE), (3, CANDIDATE),
    ]  # fmt: skip
    assert len(run["values"][REFERENCE]["output_throughput"]) == run["rounds"] == len(servers.calls) / 2


def test_a_clear_regression_stops_the_rounds_at_min_rounds():
    servers = Servers(change=0.6)
    run = run_rounds(servers.measure, DIRECTIONS, GateSettings(), clock=servers.clock)
    assert (run["gate"]["decision"], run["rounds"], run["stopped_by"]) == ("regress", 5, DECIDED)
    assert run["round_seconds"] == [20.0] * 5 and run["seconds"] == 100.0


def test_an_unchanged_candidate_passes_and_the_summary_brackets_no_change():
    servers = Servers(change=1.0)
    settings = GateSettings()
    run = run_rounds(servers.measure, DIRECTIONS, settings, clock=servers.clock)
    summary = summary_of(run, DIRECTIONS, settings)
    assert summary["decision"] == "pass" and summary["stopped_by"] == DECIDED
    for metric in summary["metrics"]:
        low, high = metric["interval_percent"]
        assert low < 0 < high and low < metric["change_percent"] < high
        assert metric["reference"] == run["values"][REFERENCE][metric["name"]]
    assert summary["spread"] == max(metric["spread"] for metric in summary["metrics"])
    assert summary["seconds_per_round"] == 20.0 and summary["sentence"].startswith("pass")


def test_rounds_that_spread_too_much_end_unknown_at_max_rounds():
    servers = Servers(change=0.95, spread=0.4)
    run = run_rounds(servers.measure, DIRECTIONS, GateSettings(max_rounds=8), clock=servers.clock)
    assert (run["gate"]["decision"], run["rounds"], run["stopped_by"]) == ("unknown", 8, MAX_ROUNDS)


def test_no_round_starts_that_would_end_past_the_time_budget():
    servers = Servers(change=0.95, spread=0.4)
    settings = GateSettings()
    run = run_rounds(servers.measure, DIRECTIONS, settings, time_budget_s=65, clock=servers.clock)
    # Three rounds of 20 s end at 60 s; a fourth would end at 80 s.
    assert (run["rounds"], run["stopped_by"]) == (3, TIME_BUDGET)
    summary = summary_of(run, DIRECTIONS, settings)
    assert summary["decision"] == "unknown" and not summary["finished"]
    assert summary["sentence"].startswith("stopped by the time budget after 3 rounds of 20 s")


def test_a_failed_request_fails_the_gate_naming_the_side_and_round():
    servers = Servers(failing=(CANDIDATE, 2))
    with pytest.raises(BenchError, match=r"round 2: 2 of 16 requests to the candidate failed \(first error: HTTP 500"):
        run_rounds(servers.measure, DIRECTIONS, GateSettings(), clock=servers.clock)


def saved(rounds=12, change=1.0, **environment):
    servers = Servers(change=change, seed=7)
    settings = GateSettings(min_rounds=min(rounds, 5), max_rounds=rounds)
    run = run_rounds(servers.measure, DIRECTIONS, settings, RECORD, clock=servers.clock)
    return baseline_of(run, {**ENVIRONMENT, **environment}, WORKLOAD)


ENVIRONMENT = {"gpu": "8 x NVIDIA H200", "driver": "580.159.04", "vllm_version": "0.32.0", "entry": "tiny"}
WORKLOAD = {"endpoint": "completions", "concurrency": 8, "num_requests": 64, "duration": None, "input_len": 128,
            "output_len": 128, "ignore_eos": True, "prompt_source": "tokenizer"}  # fmt: skip


def test_a_recorded_baseline_holds_max_rounds_of_the_candidate_alone_and_what_they_were_measured_on():
    servers = Servers()
    run = run_rounds(servers.measure, DIRECTIONS, GateSettings(max_rounds=6), RECORD, clock=servers.clock)
    assert {side for _round, side in servers.calls} == {CANDIDATE} and run["gate"] is None
    baseline = baseline_of(run, ENVIRONMENT, {**WORKLOAD, "seed": 3})
    assert baseline["kind"] == BASELINE_KIND and baseline["rounds"] == 6
    assert baseline["environment"] == ENVIRONMENT and baseline["workload"] == WORKLOAD
    assert baseline["metrics"]["output_throughput"] == run["values"][CANDIDATE]["output_throughput"]
    assert summary_of(run, DIRECTIONS, GateSettings(max_rounds=6))["decision"] is None


def test_against_a_baseline_only_the_candidate_is_measured_within_the_rounds_saved():
    rounds, settings = baseline_rounds(saved(rounds=12), DIRECTIONS, GateSettings())
    assert settings.max_rounds == 12
    servers = Servers(change=0.6, seed=3)
    run = run_rounds(servers.measure, DIRECTIONS, settings, BASELINE, rounds, clock=servers.clock)
    assert {side for _round, side in servers.calls} == {CANDIDATE}
    assert run["gate"]["decision"] == "regress" and REFERENCE not in run["values"]
    unchanged = Servers(change=1.0, spread=0.4, seed=4)
    run = run_rounds(unchanged.measure, DIRECTIONS, settings, BASELINE, rounds, clock=unchanged.clock)
    assert run["rounds"] <= 12


def test_a_baseline_whose_rounds_ran_in_spells_makes_the_gate_weigh_rounds_as_correlated():
    alternating, in_spells = saved(), saved()
    for name in DIRECTIONS:
        alternating["metrics"][name] = [1000.0, 900.0] * 6
        in_spells["metrics"][name] = [1000.0] * 6 + [900.0] * 6
    _rounds, settings = baseline_rounds(alternating, DIRECTIONS, GateSettings())
    assert settings.least_correlation == 0.0
    _rounds, settings = baseline_rounds(in_spells, DIRECTIONS, GateSettings(least_correlation=0.2))
    assert settings.least_correlation > 0.5
    _rounds, settings = baseline_rounds(alternating, DIRECTIONS, GateSettings(least_correlation=0.2))
    assert settings.least_correlation == 0.2


def test_a_baseline_that_cannot_serve_is_refused():
    with pytest.raises(BenchError, match="the `baseline` of a vllm_gate result"):
        baseline_rounds({"levels": []}, DIRECTIONS, GateSettings())
    with pytest.raises(BenchError, match="has no rounds of p99_itl_ms; it has median_ttft_ms, output_throughput"):
        baseline_rounds(saved(), {"p99_itl_ms": "lower"}, GateSettings())
    with pytest.raises(BenchError, match=r"holds 4 rounds, fewer than min_rounds \(5\)"):
        baseline_rounds(saved(rounds=4), DIRECTIONS, GateSettings())
    broken = saved()
    broken["metrics"]["output_throughput"][2] = 0
    with pytest.raises(BenchError, match="rounds of output_throughput must be a list of positive numbers"):
        baseline_rounds(broken, DIRECTIONS, GateSettings())


def test_every_difference_of_machine_release_entry_and_workload_is_named():
    baseline = saved(driver="570.86.15", vllm_version="0.31.0")
    assert baseline_mismatches(baseline, ENVIRONMENT, WORKLOAD) == [
        "driver '570.86.15' then, '580.159.04' now",
        "vllm_version '0.31.0' then, '0.32.0' now",
    ]
    assert baseline_mismatches(baseline, {**baseline["environment"]}, {**WORKLOAD, "concurrency": 16}) == [
        "concurrency 8 then, 16 now"
    ]


def test_the_environment_names_the_instance_s_gpus_driver_release_and_entry():
    record = {"vllm_version": "0.32.0", "model": "tiny"}
    assert environment_of(record, ["NVIDIA H200"] * 2 + ["NVIDIA H100"], "580.1") == {
        "gpu": "1 x NVIDIA H100, 2 x NVIDIA H200", "driver": "580.1", "vllm_version": "0.32.0", "entry": "tiny",
    }  # fmt: skip
    assert environment_of(record, [], "")["gpu"] == "none"


def test_only_metrics_that_a_round_gives_can_be_gated():
    assert metric_directions(["output_throughput", "p99_ttft_ms", "mean_e2el_ms"]) == {
        "output_throughput": "higher", "p99_ttft_ms": "lower", "mean_e2el_ms": "lower",
    }  # fmt: skip
    with pytest.raises(BenchError, match=r"metrics \['std_ttft_ms', 'request_goodput'\] cannot be gated"):
        metric_directions(["output_throughput", "std_ttft_ms", "request_goodput"])
    with pytest.raises(BenchError, match="metrics names output_throughput twice"):
        metric_directions(["output_throughput", "output_throughput"])
    with pytest.raises(BenchError, match="at least one metric"):
        metric_directions([])
    assert percentiles_of(["p99_ttft_ms", "p99.9_itl_ms", "output_throughput"]) == [99.0, 99.9]
    assert percentiles_of(["median_ttft_ms"]) == [50.0]
