# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A gate's rounds: the reference and the candidate measured in turn, round after round, until the gate decides.

Each round measures both servers with the same workload, the reference first in odd rounds and the candidate first
in even ones, so that what drifts within a round (a warming cache, a neighbour's load) falls on each side as often,
and gives one value per metric and side. From `min_rounds` on, gate() weighs the rounds after each one; the rounds
stop when it has decided, at `max_rounds`, or when the next round would end past the time budget.

Against a saved baseline, only the candidate is measured, and its round N is paired with the baseline's round N:
the pairs are independent, so the gate's error rates hold for what the rounds show, but what drifted between the
baseline's day and this one (the machine, its neighbours, its cooling) is not cancelled, as it is in rounds measured
side by side. The baseline names the machine and workload it was measured on, and a comparison across any of them
is refused unless asked for, and then marked.

Plain data and callables, standard library only: `measure(side, round_number)` is what sends the requests.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time

from ansible_collections.llmops.vllm.plugins.module_utils.bench.error import BenchError
from ansible_collections.llmops.vllm.plugins.module_utils.bench.gate import (
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    GateSettings,
    gate,
    serial_correlation,
)
from ansible_collections.llmops.vllm.plugins.module_utils.bench.statistics import is_higher_better

REFERENCE = "reference"
CANDIDATE = "candidate"
PAIRED, BASELINE, RECORD = "paired", "baseline", "record"
DECIDED, MAX_ROUNDS, TIME_BUDGET = "decision", "max_rounds", "time_budget"
# The level fields that one round can gate on: throughputs, and the latencies' means, medians and percentiles.
GATEABLE_METRIC = re.compile(
    r"^(?:(?:request|output|total_token)_throughput|(?:mean|median|p(?P<percentile>\d+(?:\.\d+)?))_(?:ttft|tpot|itl|e2el)_ms)$"
)
BASELINE_KIND = "llmops.vllm.vllm_gate baseline"
# What a saved baseline was measured on; a comparison across any of them is refused unless allowed.
ENVIRONMENT_FIELDS = ("gpu", "driver", "vllm_version", "entry")
WORKLOAD_FIELDS = (
    "endpoint",
    "concurrency",
    "num_requests",
    "duration",
    "input_len",
    "output_len",
    "ignore_eos",
    "prompt_source",
)


def metric_directions(names: list) -> dict:
    """{metric: 'higher' or 'lower'} for the metrics to gate on; BenchError naming those that a round cannot give."""
    if not names:
        raise BenchError("metrics must name at least one metric, such as output_throughput or median_ttft_ms")
    unknown = [name for name in names if not GATEABLE_METRIC.match(str(name))]
    if unknown:
        raise BenchError(
            f"metrics {unknown} cannot be gated: name request_throughput, output_throughput, total_token_throughput,"
            " or mean_, median_ or pNN_ of ttft, tpot, itl or e2el with _ms (median_ttft_ms, p99_itl_ms)"
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise BenchError(f"metrics names {', '.join(twice)} twice")
    return {name: HIGHER_IS_BETTER if is_higher_better(name) else LOWER_IS_BETTER for name in names}


def percentiles_of(names: list) -> list:
    """The percentiles that the metrics name (p99_ttft_ms: 99), for the level's statistics."""
    found = {float(match["percentile"]) for name in names if (match := GATEABLE_METRIC.match(name))["percentile"]}
    return sorted(found) or [50.0]


def round_order(round_number: int, mode: str = PAIRED) -> tuple:
    """Who is measured first: the reference in odd rounds, the candidate in even ones; the candidate alone when the
    reference's rounds are saved ones."""
    if mode != PAIRED:
        return (CANDIDATE,)
    return (REFERENCE, CANDIDATE) if round_number % 2 else (CANDIDATE, REFERENCE)


def check_level(level: dict, side: str, round_number: int) -> None:
    """A round counts only when every request of it was served: a failure is no measure of speed."""
    if level["failed"]:
        raise BenchError(
            f"round {round_number}: {level['failed']} of {level['num_requests']} requests to the {side} failed"
            f" (first error: {level['errors'][0]}); a gate weighs served requests only"
        )


def series_of(values: dict, directions: dict, reference_rounds: dict | None) -> list:
    """gate()'s input: per metric the reference's rounds (measured or saved) and the candidate's, paired by round."""
    series = []
    for name, direction in directions.items():
        candidate = values[CANDIDATE][name]
        reference = values[REFERENCE][name] if reference_rounds is None else reference_rounds[name][: len(candidate)]
        series.append({"name": name, "direction": direction, "reference": reference, "candidate": candidate})
    return series


def run_rounds(
    measure,
    directions: dict,
    settings: GateSettings,
    mode: str = PAIRED,
    reference_rounds: dict | None = None,
    time_budget_s: float | None = None,
    clock=time.monotonic,
) -> dict:
    """Measure rounds until the gate decides, `max_rounds` are done, or the next round would pass `time_budget_s`.

    measure(side, round_number) returns one level's metrics (vllm_bench's fields) for REFERENCE or CANDIDATE.
    mode: PAIRED measures both sides each round; BASELINE the candidate alone, against `reference_rounds`
    ({metric: saved values}, at least as many as max_rounds); RECORD the candidate alone for `max_rounds` rounds,
    with no gate, to save as a baseline. Returns the values per side and metric, the seconds of each round, why
    the rounds stopped, and the gate's last answer (None in RECORD mode).
    """
    values = {side: {name: [] for name in directions} for side in (REFERENCE, CANDIDATE)}
    round_seconds = []
    started = clock()
    answer = None
    stopped_by = MAX_ROUNDS
    for round_number in range(1, settings.max_rounds + 1):
        if round_seconds and time_budget_s is not None:
            expected_end = clock() - started + math.fsum(round_seconds) / len(round_seconds)
            if expected_end > time_budget_s:
                stopped_by = TIME_BUDGET
                break
        round_started = clock()
        for side in round_order(round_number, mode):
            level = measure(side, round_number)
            check_level(level, side, round_number)
            for name in directions:
                values[side][name].append(level[name])
        round_seconds.append(clock() - round_started)
        if mode != RECORD and round_number >= settings.min_rounds:
            answer = gate(series_of(values, directions, reference_rounds), settings)
            if answer["finished"]:
                stopped_by = MAX_ROUNDS if answer["decision"] == "unknown" else DECIDED
                break
    if mode != RECORD and answer is None and round_seconds:
        answer = gate(series_of(values, directions, reference_rounds), settings)
    return {
        "mode": mode,
        "rounds": len(round_seconds),
        "round_seconds": round_seconds,
        "seconds": clock() - started,
        "stopped_by": stopped_by,
        "values": values if mode == PAIRED else {CANDIDATE: values[CANDIDATE]},
        "gate": answer,
    }


def environment_of(record: dict, gpus: list, driver: str) -> dict:
    """What a baseline is measured on: the GPUs' model (count x name, 'none' without GPUs), the driver, the vLLM
    release and the catalog entry of the candidate's instance record. `gpus`: the names of the GPUs it uses."""
    if gpus:
        names = sorted(set(gpus))
        gpu = ", ".join(f"{sum(1 for name in gpus if name == model)} x {model}" for model in names)
    else:
        gpu = "none"
    return {"gpu": gpu, "driver": driver or "none", "vllm_version": record["vllm_version"], "entry": record["model"]}


def baseline_of(run: dict, environment: dict, workload: dict) -> dict:
    """The candidate's rounds as a baseline that a later gate can take (`baseline`), with what they were measured on."""
    return {
        "kind": BASELINE_KIND,
        "environment": environment,
        "workload": {field: workload[field] for field in WORKLOAD_FIELDS},
        "rounds": run["rounds"],
        "metrics": run["values"][CANDIDATE],
    }


def baseline_rounds(saved: dict, directions: dict, settings: GateSettings) -> tuple[dict, GateSettings]:
    """The saved rounds of each metric to gate, and the settings with max_rounds cut to the rounds saved (a round of
    the candidate needs a saved round to pair with) and least_correlation raised to the saved rounds' own lag-one
    correlation (spells of the machine then recur in the candidate's rounds, and the whole baseline tells them better
    than the first rounds of a gate); BenchError for a baseline that cannot serve."""
    if saved.get("kind") != BASELINE_KIND or not isinstance(saved.get("metrics"), dict):
        raise BenchError(
            "the baseline must be the `baseline` of a vllm_gate result (kind: llmops.vllm.vllm_gate baseline), as"
            " saved from a run that measured the candidate's instance on its host; got one of kind"
            f" {saved.get('kind')!r}"
        )
    missing = [name for name in directions if name not in saved["metrics"]]
    if missing:
        raise BenchError(
            f"the baseline has no rounds of {', '.join(missing)}; it has {', '.join(sorted(saved['metrics']))}"
        )
    rounds = {name: saved["metrics"][name] for name in directions}
    for name, values in rounds.items():
        good = isinstance(values, list) and all(
            not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf for value in values
        )
        if not good:
            raise BenchError(f"the baseline's rounds of {name} must be a list of positive numbers, got {values!r}")
    count = min(len(values) for values in rounds.values())
    if count < settings.min_rounds:
        raise BenchError(
            f"the baseline holds {count} rounds, fewer than min_rounds ({settings.min_rounds}); record one with at"
            " least max_rounds rounds"
        )
    own_correlation = max(serial_correlation([math.log(value) for value in values]) for values in rounds.values())
    return rounds, dataclasses.replace(
        settings,
        max_rounds=min(settings.max_rounds, count),
        least_correlation=max(settings.least_correlation, own_correlation),
    )


def baseline_mismatches(saved: dict, environment: dict, workload: dict) -> list:
    """What differs between the baseline's machine and workload and today's, one phrase each."""
    then_environment = saved.get("environment") or {}
    then_workload = saved.get("workload") or {}
    differences = [
        f"{field} {then_environment.get(field)!r} then, {environment[field]!r} now"
        for field in ENVIRONMENT_FIELDS
        if then_environment.get(field) != environment[field]
    ]
    differences += [
        f"{field} {then_workload.get(field)!r} then, {workload[field]!r} now"
        for field in WORKLOAD_FIELDS
        if then_workload.get(field) != workload[field]
    ]
    return differences


# What a summary keeps of each metric's judgement (gate.judge_metric), beside its change, rounds and sentence.
JUDGED_FIELDS = (
    "name",
    "direction",
    "decision",
    "rounds",
    "confidence",
    "spread",
    "serial_correlation",
    "effective_rounds",
)


def summary_of(run: dict, directions: dict, settings: GateSettings, notes: list = ()) -> dict:
    """The answer for people and for the next gate: the decision, each metric's change with its interval and its
    rounds, the seconds, the measured spread (the largest metric's, for plan_rounds) and one sentence."""
    answer = run["gate"]
    seconds_per_round = math.fsum(run["round_seconds"]) / run["rounds"] if run["rounds"] else None
    summary = {
        "mode": run["mode"],
        "rounds": run["rounds"],
        "seconds": run["seconds"],
        "seconds_per_round": seconds_per_round,
        "stopped_by": run["stopped_by"],
        "notes": list(notes),
    }
    if answer is None:
        summary.update(
            decision=None,
            finished=True,
            spread=None,
            serial_correlation=None,
            metrics=[],
            sentence=_record_sentence(run, notes),
        )
        return summary
    metrics = []
    for judged in answer["metrics"]:
        name = judged["name"]
        metric = {key: judged[key] for key in JUDGED_FIELDS}
        metric.update(
            change_percent=judged["change_percent"],
            interval_percent=judged["interval_percent"],
            candidate=run["values"][CANDIDATE][name],
            sentence=judged["sentence"],
        )
        if run["mode"] == PAIRED:
            metric["reference"] = run["values"][REFERENCE][name]
        metrics.append(metric)
    spreads = [metric["spread"] for metric in metrics if metric["spread"] is not None]
    correlations = [metric["serial_correlation"] for metric in metrics if metric["serial_correlation"] is not None]
    opening = list(notes)
    if run["stopped_by"] == TIME_BUDGET:
        opening.append(
            f"stopped by the time budget after {run['rounds']} rounds of {seconds_per_round:.0f} s, before the gate"
            " could decide"
        )
    summary.update(
        decision=answer["decision"],
        finished=answer["finished"],
        spread=max(spreads) if spreads else None,
        serial_correlation=max(correlations) if correlations else None,
        metrics=metrics,
        sentence="; ".join([*opening, answer["sentence"]]) if opening else answer["sentence"],
    )
    return summary


def _record_sentence(run: dict, notes) -> str:
    text = f"recorded {run['rounds']} rounds of the candidate in {run['seconds']:.0f} s, to save as a baseline"
    return "; ".join([*notes, text])
