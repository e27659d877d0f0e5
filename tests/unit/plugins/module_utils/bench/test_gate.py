# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout gate: its distribution functions against tables, its decisions on rounds whose answer is known, its
planning, and its refusals."""

import math
import random

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.bench.gate import (
    GateSettings,
    effective_rounds,
    gate,
    plan_rounds,
    regression_log_threshold,
    serial_correlation,
    student_t_cdf,
    student_t_quantile,
)


# Student t quantiles as printed in statistical tables (10 significant digits).
@pytest.mark.parametrize(
    ("p", "df", "quantile"),
    [
        (0.975, 1, 12.70620474),
        (0.975, 2, 4.302652730),
        (0.9, 3, 1.637744354),
        (0.995, 4, 4.604094871),
        (0.975, 5, 2.570581836),
        (0.95, 10, 1.812461123),
        (0.975, 30, 2.042272456),
        (0.999, 100, 3.173739493),
    ],
)
def test_student_t_quantiles_match_the_tables(p, df, quantile):
    assert student_t_quantile(p, df) == pytest.approx(quantile, rel=1e-8)
    assert student_t_quantile(1 - p, df) == pytest.approx(-quantile, rel=1e-8)
    assert student_t_cdf(quantile, df) == pytest.approx(p, abs=1e-9)


def test_student_t_cdf_in_closed_form_for_one_and_two_degrees():
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi)
        assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)))


def test_student_t_approaches_the_normal_law():
    assert student_t_quantile(0.975, 2000) == pytest.approx(1.959963985, rel=1e-3)


def rounds(change, spread, count, seed, base=1000.0):
    """Paired rounds: the candidate is `change` times the reference, times lognormal noise of `spread`."""
    rng = random.Random(seed)
    reference = [base * math.exp(rng.gauss(0, 0.2)) for _round in range(count)]
    candidate = [value * change * math.exp(rng.gauss(0, spread)) for value in reference]
    return reference, candidate


def metric(name, direction, reference, candidate):
    return {"name": name, "direction": direction, "reference": reference, "candidate": candidate}


def test_an_unchanged_candidate_passes_at_the_minimum_rounds():
    reference, candidate = rounds(1.0, 0.01, 5, seed=1)
    result = gate([metric("C=8 output_throughput", "higher", reference, candidate)])
    assert (result["decision"], result["finished"], result["rounds"]) == ("pass", True, 5)
    judged = result["metrics"][0]
    low, high = judged["interval_percent"]
    assert -3 < low < judged["change_percent"] < high < 3
    assert judged["confidence"] == pytest.approx(0.95)
    assert result["sentence"].startswith("pass;") and "after 5 of at most 40 rounds" in result["sentence"]


def test_a_clear_regression_stops_early():
    reference, candidate = rounds(0.8, 0.02, 40, seed=2)
    result = gate([metric("C=8 output_throughput", "higher", reference, candidate)])
    assert result["decision"] == "regress" and result["finished"]
    assert result["rounds"] == 5
    assert result["metrics"][0]["change_percent"] == pytest.approx(-20, abs=2)
    assert result["sentence"].startswith("regress;")
    assert "C=8 output_throughput: regress after 5 of at most 40 rounds (candidate -" in result["sentence"]


def halfway_rounds(count):
    """Rounds whose mean lies halfway between no change and a 10% regression, spread far wider than 10%."""
    return [1000.0] * count, [1000 * 0.95 * math.exp(0.3 * (-1) ** index) for index in range(count)]


def test_rounds_halfway_and_spread_wide_stay_unknown_until_the_maximum():
    settings = GateSettings(min_rounds=5, max_rounds=12)
    so_far = gate([metric("ttft", "lower", *halfway_rounds(8))], settings)
    assert (so_far["decision"], so_far["finished"]) == ("unknown", False)
    assert "run another round" in so_far["sentence"]
    at_most = gate([metric("ttft", "lower", *halfway_rounds(12))], settings)
    assert (at_most["decision"], at_most["finished"], at_most["rounds"]) == ("unknown", True, 12)
    assert "maximum of 12 rounds" in at_most["sentence"]


def test_fewer_rounds_than_the_minimum_decide_nothing():
    reference, candidate = rounds(0.5, 0.01, 4, seed=4)
    result = gate([metric("tok/s", "higher", reference, candidate)])
    assert (result["decision"], result["finished"]) == ("unknown", False)


def test_direction_decides_what_is_worse():
    reference, candidate = rounds(1.25, 0.02, 10, seed=5)
    assert gate([metric("tok/s", "higher", reference, candidate)])["decision"] == "pass"
    assert gate([metric("ttft", "lower", reference, candidate)])["decision"] == "regress"


def test_the_threshold_is_a_ratio_of_the_reference():
    assert regression_log_threshold(10, "higher") == pytest.approx(-math.log(0.9))
    assert regression_log_threshold(10, "lower") == pytest.approx(math.log(1.1))


def test_a_regression_below_the_smallest_worth_a_rollback_passes():
    reference, candidate = rounds(0.98, 0.005, 10, seed=6)
    assert gate([metric("tok/s", "higher", reference, candidate)])["decision"] == "pass"


def test_one_regressing_metric_regresses_the_gate_and_the_false_alarms_split():
    steady, same = rounds(1.0, 0.01, 10, seed=7)
    slow, slower = rounds(0.7, 0.01, 10, seed=8)
    result = gate([metric("C=1", "higher", steady, same), metric("C=8", "higher", slow, slower)])
    assert result["decision"] == "regress"
    assert [m["decision"] for m in result["metrics"]] == ["pass", "regress"]
    assert result["false_alarm_rate_per_metric"] == pytest.approx(0.025)
    assert result["metrics"][0]["confidence"] == pytest.approx(0.975)
    assert "C=8" in result["sentence"] and "C=1:" not in result["sentence"]


def test_a_split_false_alarm_rate_needs_more_evidence():
    """Rounds that regress after 5 when gated alone take a round more beside 19 steady metrics."""
    reference = [1000.0] * 6
    candidate = [1000 * ratio for ratio in (0.86, 0.90, 0.84, 0.89, 0.87, 0.85)]
    alone = gate([metric("m0", "higher", reference, candidate)])
    steady = [metric(f"m{index}", "higher", reference, reference) for index in range(1, 20)]
    shared = gate([metric("m0", "higher", reference, candidate), *steady])
    assert (alone["decision"], alone["rounds"]) == ("regress", 5)
    assert (shared["decision"], shared["metrics"][0]["rounds"]) == ("regress", 6)
    assert shared["false_alarm_rate_per_metric"] == pytest.approx(0.0025)


def spells(count, correlation, spread, seed):
    """Log values of an AR(1) process: spells of fast and slow rounds."""
    rng = random.Random(seed)
    level = rng.gauss(0, spread)
    values = []
    for _round in range(count):
        values.append(level)
        level = correlation * level + rng.gauss(0, spread * math.sqrt(1 - correlation**2))
    return values


def test_the_serial_correlation_is_found_in_spells_and_not_in_independent_rounds():
    rng = random.Random(11)
    independent = [serial_correlation([rng.gauss(0, 1) for _round in range(40)]) for _gate in range(200)]
    in_spells = [serial_correlation(spells(40, 0.6, 1.0, seed)) for seed in range(200)]
    assert sum(independent) / 200 < 0.15 < 0.45 < sum(in_spells) / 200
    assert serial_correlation([1.0, 2.0, 3.0]) == 0.0  # too few rounds to tell
    assert serial_correlation([5.0] * 10) == 0.0
    # A steady climb is as correlated as rounds get, and the test believes no more than MOST_CORRELATION.
    assert serial_correlation([float(n) for n in range(20)]) == pytest.approx(0.9)
    assert effective_rounds(40, 0.0) == 40 and effective_rounds(40, 0.6) == pytest.approx(10)


def test_rounds_in_spells_widen_the_interval_that_the_same_rounds_alternating_give():
    # The same sixteen log ratios, 5% up and down: alternating, then in spells of four.
    alternating = [0.05 * (-1) ** index for index in range(16)]
    in_spells = [0.05 * (-1) ** (index // 4) for index in range(16)]
    settings = GateSettings(min_rounds=16, max_rounds=16)
    judged = {}
    for name, values in (("alternating", alternating), ("in spells", in_spells)):
        candidate = [1000 * math.exp(value) for value in values]
        judged[name] = gate([metric("tok/s", "higher", [1000.0] * 16, candidate)], settings)["metrics"][0]
    assert judged["alternating"]["serial_correlation"] == 0.0
    assert judged["in spells"]["serial_correlation"] > 0.5
    assert judged["in spells"]["effective_rounds"] < 6
    width = {name: high - low for name, (low, high) in
             ((name, metric["interval_percent"]) for name, metric in judged.items())}  # fmt: skip
    assert width["in spells"] > 2 * width["alternating"]
    assert judged["alternating"]["decision"] == "pass" and judged["in spells"]["decision"] == "unknown"
    assert "rounds correlated in time" in judged["in spells"]["sentence"]


def test_a_correlation_measured_before_holds_up_the_one_estimated_from_few_rounds():
    reference, candidate = rounds(1.0, 0.03, 5, seed=2)
    alone = gate([metric("tok/s", "higher", reference, candidate)])
    held = gate([metric("tok/s", "higher", reference, candidate)], GateSettings(least_correlation=0.5))
    assert held["metrics"][0]["serial_correlation"] == 0.5 > alone["metrics"][0]["serial_correlation"]
    low, high = held["metrics"][0]["interval_percent"]
    alone_low, alone_high = alone["metrics"][0]["interval_percent"]
    assert high - low > alone_high - alone_low
    # The plan counts with it: rounds worth a third as much need about three times as many.
    plain = plan_rounds(0.05)
    correlated = plan_rounds(0.05, GateSettings(least_correlation=0.5, max_rounds=200))
    assert correlated["most_rounds"] > 2 * plain["most_rounds"]
    with pytest.raises(ValueError, match=r"correlated in time by 0\.8"):
        plan_rounds(0.09, GateSettings(least_correlation=0.8))


def test_identical_rounds_pass():
    assert gate([metric("tok/s", "higher", [100.0] * 5, [100.0] * 5)])["decision"] == "pass"


def test_the_plan_grows_with_the_spread_and_refuses_what_cannot_fit():
    quiet = plan_rounds(0.05)
    noisy = plan_rounds(0.09)
    assert quiet["expected_rounds_no_change"] <= noisy["expected_rounds_no_change"]
    assert quiet["most_rounds"] < noisy["most_rounds"] <= 40
    with pytest.raises(ValueError, match=r"max_rounds \(40\) is too few.*up to \d+ rounds"):
        plan_rounds(0.25)
    assert plan_rounds(0.25, GateSettings(smallest_regression_percent=30))["most_rounds"] <= 40


def test_the_plan_splits_the_false_alarms_over_the_metrics():
    one = plan_rounds(0.09, metrics=1)
    five = plan_rounds(0.09, metrics=5, settings=GateSettings(max_rounds=100))
    assert five["false_alarm_rate_per_metric"] == pytest.approx(0.01)
    assert five["most_rounds"] > one["most_rounds"]


def test_the_plan_refuses_a_time_budget_too_short():
    plan = plan_rounds(0.05, seconds_per_round=60)
    assert plan["seconds"]["most"] == 60 * plan["most_rounds"]
    with pytest.raises(ValueError, match=r"time_budget_s \(300\) is too short"):
        plan_rounds(0.05, seconds_per_round=60, time_budget_s=300)
    with pytest.raises(ValueError, match="time_budget_s needs seconds_per_round"):
        plan_rounds(0.05, time_budget_s=300)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"smallest_regression_percent": 0}, "smallest_regression_percent must be a number above 0"),
        ({"smallest_regression_percent": 100}, "smallest_regression_percent .* below 100"),
        ({"false_alarm_rate": 0.5}, "false_alarm_rate .* below 0.5"),
        ({"miss_rate": "5%"}, "miss_rate must be a number"),
        ({"min_rounds": 2}, "min_rounds must be at least 3"),
        ({"min_rounds": 5.5}, "min_rounds must be a whole number"),
        ({"min_rounds": 10, "max_rounds": 8}, r"max_rounds \(8\) must be at least min_rounds \(10\)"),
        ({"least_correlation": 0.95}, "least_correlation must be a lag-one correlation from 0 to 0.9, got 0.95"),
        ({"least_correlation": -0.1}, "least_correlation must be a lag-one correlation"),
    ],
)
def test_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        GateSettings(**settings)


@pytest.mark.parametrize(
    ("series", "message"),
    [
        ([], "at least one metric"),
        ([{"name": "tok/s", "direction": "higher", "reference": [1.0]}], "'tok/s' lacks candidate"),
        ([metric("tok/s", "up", [1.0], [1.0])], "direction must be 'higher' .* got 'up'"),
        ([metric("tok/s", "higher", [1.0, 2.0], [1.0])], "same length"),
        ([metric("tok/s", "higher", [1.0, 0.0], [1.0, 1.0])], "reference's value of round 2 must be a positive"),
        ([metric("tok/s", "higher", [1.0], [math.nan])], "candidate's value of round 1"),
        ([metric("a", "higher", [1.0], [1.0]), metric("a", "lower", [1.0], [1.0])], "'a' is given twice"),
        ([metric("a", "higher", [1.0], [1.0]), metric("b", "lower", [1.0] * 2, [1.0] * 2)], "the same rounds"),
        ([metric("a", "higher", [1.0] * 41, [1.0] * 41)], r"41 rounds given, more than max_rounds \(40\)"),
    ],
)
def test_measurements_are_refused_with_the_metric_and_round(series, message):
    with pytest.raises(ValueError, match=message):
        gate(series)


def test_plan_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="spread must be a number above 0"):
        plan_rounds(0)
    with pytest.raises(ValueError, match="metrics must be the whole number"):
        plan_rounds(0.05, metrics=0)
