# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_gate: its refusals before any request or record, its check mode, and its bookkeeping of a run, with the
load generator's level replaced by servers whose answers the test chooses."""

import pytest

from ansible_collections.llmops.vllm.plugins.modules import vllm_gate

REFERENCE = {"url": "http://10.0.0.8:8000", "model": "tiny", "api_key": "reference-key-4411"}
CANDIDATE = {"url": "http://10.0.0.7:8000", "model": "tiny", "api_key": "candidate-key-8822"}


@pytest.fixture
def no_requests(monkeypatch):
    """Any request fails the test: the module must refuse or predict before it sends one."""

    def refuse(*_args, **_kwargs):
        pytest.fail("a request was sent")

    monkeypatch.setattr(vllm_gate, "measure_level", refuse)
    monkeypatch.setattr(vllm_gate, "run_level", refuse)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"metrics": ["tokens_per_second"]}, "metrics ['tokens_per_second'] cannot be gated"),
        ({"min_rounds": 2}, "min_rounds must be at least 3, got 2"),
        ({"max_rounds": 4}, "max_rounds (4) must be at least min_rounds (5)"),
        ({"false_alarm_rate": 0.7}, "false_alarm_rate must be a number above 0 and below 0.5, got 0.7"),
        ({"smallest_regression_percent": 0}, "smallest_regression_percent must be a number above 0 and below 100"),
        ({"concurrency": 0}, "concurrency must list levels of 1 or more, got [0]"),
        ({"num_requests": 0}, "num_requests must be 1 or more, got 0"),
        ({"time_budget_s": 0}, "time_budget_s must be more than 0 seconds, got 0"),
        ({"seconds_per_round": 30}, "seconds_per_round plans the rounds together with spread"),
        ({"fail_on": ["pass"]}, "value of fail_on must be one or more of: regress, unknown"),
        ({"reference": {"url": "http://10.0.0.8:8000"}}, "missing parameter(s) required by 'url': model"),
        ({"reference": {"instance": "../tiny"}}, "reference.instance must be letters, digits and '_.-'"),
        ({"reference": {"instance": "tiny", "url": "http://x:1"}}, "mutually exclusive: instance|url"),
        ({"baseline": {}}, "parameters are mutually exclusive: reference|baseline"),
        ({"num_requests": 10, "duration": 10}, "parameters are mutually exclusive: num_requests|duration"),
        # A spread of 0.25 needs about 200 rounds to tell a 10% regression from none at these error rates.
        ({"spread": 0.25}, "max_rounds (40) is too few: with rounds that spread by 0.25 (log ratio), the gate needs"),
        (
            {"spread": 0.08, "seconds_per_round": 60, "time_budget_s": 600},
            "time_budget_s (600) is too short: the gate may need",
        ),
    ],
)
def test_the_gate_refuses_bad_settings_before_any_request(run_module, no_requests, args, message):
    result = run_module(vllm_gate.main, {"reference": REFERENCE, "candidate": CANDIDATE, **args}, fails=True)
    assert message in result["msg"]
    assert REFERENCE["api_key"] not in str(result) and CANDIDATE["api_key"] not in str(result)


def test_a_baseline_is_compared_on_the_candidate_s_own_host_only(run_module, no_requests):
    result = run_module(vllm_gate.main, {"candidate": CANDIDATE, "baseline": {}}, fails=True)
    assert "a baseline is compared on the candidate's own host" in result["msg"]
    assert "give candidate.instance" in result["msg"]
    result = run_module(vllm_gate.main, {"candidate": CANDIDATE}, fails=True)
    assert "a baseline is recorded on the candidate's own host" in result["msg"]


def test_check_mode_names_both_servers_and_the_rounds_and_sends_nothing(run_module, no_requests):
    result = run_module(
        vllm_gate.main,
        {"reference": REFERENCE, "candidate": CANDIDATE, "spread": 0.08, "_ansible_check_mode": True},
    )
    assert result["msg"] == (
        "check mode: would measure the candidate tiny at http://10.0.0.7:8000 against the reference tiny at"
        " http://10.0.0.8:8000, 5 to 40 rounds of 64 requests at concurrency 8 per side, within 1800 s; no request"
        " sent"
    )
    assert result["plan"]["most_rounds"] <= 40 and not result["changed"]


def test_an_instance_is_read_from_its_record_and_its_key_never_shown(run_module, no_requests, tmp_path, write_instance):
    write_instance(tmp_path, "tiny", 8000, 300, "record-key-5533")
    write_instance(tmp_path, "tiny-0.33.0", 8001, 300, "record-key-6644")
    result = run_module(
        vllm_gate.main,
        {"reference": {"instance": "tiny"}, "candidate": {"instance": "tiny-0.33.0"}, "config_dir": str(tmp_path),
         "_ansible_check_mode": True},
    )  # fmt: skip
    assert "candidate tiny-0.33.0-served at http://127.0.0.1:8001" in result["msg"]
    assert "reference tiny-served at http://127.0.0.1:8000" in result["msg"]
    assert "record-key" not in str(result)


def test_a_baseline_of_another_release_is_refused_unless_allowed_and_then_marked(
    run_module, no_requests, tmp_path, write_instance
):
    write_instance(tmp_path, "tiny", 8000, 300, "record-key-5533")
    baseline = {
        "kind": "llmops.vllm.vllm_gate baseline",
        "environment": {"gpu": "none", "driver": "none", "vllm_version": "0.31.0", "entry": "tiny"},
        "workload": vllm_gate.workload_of(
            {"endpoint": "completions", "concurrency": 8, "num_requests": 64, "duration": None, "input_len": 128,
             "output_len": 128, "ignore_eos": True}, "fixed"),
        "rounds": 10,
        "metrics": {"output_throughput": [1000.0] * 10},
    }  # fmt: skip
    args = {"candidate": {"instance": "tiny"}, "config_dir": str(tmp_path), "baseline": baseline}
    result = run_module(vllm_gate.main, {**args, "_ansible_check_mode": True}, fails=True)
    assert result["msg"].startswith("the baseline was measured otherwise: vllm_version '0.31.0' then, '0.32.0' now.")
    assert "allow_baseline_mismatch" in result["msg"]
    result = run_module(vllm_gate.main, {**args, "allow_baseline_mismatch": True, "_ansible_check_mode": True})
    assert result["notes"] == [
        "against a saved baseline, unpaired: drift since it was measured is not cancelled",
        "compared across a different machine or workload (vllm_version '0.31.0' then, '0.32.0' now)",
    ]


class Levels:
    """The level of each measure, by URL: the candidate's throughput `change` times the reference's, every round."""

    def __init__(self, change):
        self.change = change
        self.measured = []
        self.warmed = []

    def measure_level(self, target, prompts, concurrency, timeout, duration, percentiles):
        self.measured.append((target.port, [prompt for prompt, _tokens in prompts]))
        throughput = 1000.0 * (self.change if target.port == 8001 else 1.0) * (1 + 0.01 * (len(self.measured) % 3))
        return {"output_throughput": throughput, "failed": 0, "num_requests": len(prompts), "errors": []}

    def run_level(self, target, prompts, concurrency, timeout):
        self.warmed.append((target.port, len(prompts)))


@pytest.mark.parametrize(("change", "decision", "fails"), [(0.6, "regress", True), (1.0, "pass", False)])
def test_a_run_interleaves_the_sides_with_one_workload_per_round_and_answers(
    run_module, monkeypatch, change, decision, fails
):
    levels = Levels(change)
    monkeypatch.setattr(vllm_gate, "measure_level", levels.measure_level)
    monkeypatch.setattr(vllm_gate, "run_level", levels.run_level)
    reference = {**REFERENCE, "url": "http://127.0.0.1:8000"}
    candidate = {**CANDIDATE, "url": "http://127.0.0.1:8001"}
    result = run_module(
        vllm_gate.main, {"reference": reference, "candidate": candidate, "num_requests": 4}, fails=fails
    )
    assert levels.warmed == [(8000, 16), (8001, 16)]
    ports = [port for port, _prompts in levels.measured]
    assert ports[:4] == [8000, 8001, 8001, 8000]
    # Both sides of a round get the same prompts; no round repeats another's.
    rounds = [levels.measured[index : index + 2] for index in range(0, len(levels.measured), 2)]
    assert all(first[1] == second[1] and len(first[1]) == 4 for first, second in rounds)
    assert len({tuple(first[1]) for first, _second in rounds}) == len(rounds) == result["rounds"]
    assert result["decision"] == decision and result["mode"] == "paired" and "baseline" not in result
    metric = result["metrics"][0]
    low, high = metric["interval_percent"]
    assert low <= metric["change_percent"] <= high and low <= (change - 1) * 100 <= high
    assert len(metric["reference"]) == len(metric["candidate"]) == result["rounds"]
    assert result["sentence"].startswith(decision) and (result["msg"] == result["sentence"] if fails else True)
    assert "key" not in str(result)
