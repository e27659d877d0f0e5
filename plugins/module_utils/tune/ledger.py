# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tune run's ledger: the time budget, the seconds of loads, benchmarks and stops, the candidates run or taken
from earlier runs, and the report's row of each candidate."""

from __future__ import annotations

from ansible_collections.llmops.vllm.plugins.module_utils.common.clock import seconds
from ansible_collections.llmops.vllm.plugins.module_utils.tune.candidates import TuneError
from ansible_collections.llmops.vllm.plugins.module_utils.tune.winner import level_figures

# A run's ledger: seconds of loads, benchmarks and stops, and candidates run or taken from earlier runs.
RUN_COUNTERS = ("loads_s", "benchmarks_s", "stops_s", "measured", "resumed")


def over_budget(laps, budget, started, now):
    """Why the next candidate is not started: the budget would be spent by then at the mean cost so far.

    laps: the clock's readings [start, end] of each candidate that ran; started: the tune began; now: the reading
    now.
    """
    if not budget:
        return ""
    spent = [seconds(end, "a lap's end") - seconds(start, "a lap's start") for start, end in laps]
    elapsed = seconds(now, "now") - seconds(started, "the tune's start")
    mean = sum(spent) / len(spent) if spent else 0.0
    if elapsed + mean <= budget:
        return ""
    return f"time budget: {elapsed:.0f} s spent of {budget:g} s, and a candidate takes about {mean:.0f} s"


def _step_seconds(registered, step):
    """The seconds that llmops.vllm.vllm_service timed for a step (start, stop) of its registered result; 0 for a
    task that was skipped or took no such step."""
    timed = (registered or {}).get(step) or {}
    return float(timed.get("elapsed") or 0)


def bench_seconds(bench):
    """The seconds that a benchmark's levels took; 0 for none, or for one that failed."""
    if not bench or bench.get("failed"):
        return 0.0
    return float(sum(level.get("duration") or 0 for level in bench.get("levels") or []))


def count(run, swap=None, bench=None, stop=None, start=None, measured=False, resumed=False):
    """A run's ledger (`started` and the counters of RUN_COUNTERS) with one more step counted, from its result.

    swap: a vllm_swap_result (its load is a load, its rollback a stop); bench: a vllm_bench_result (its levels'
    durations); stop, start: the registered result of llmops.vllm.vllm_service stopping or starting an instance;
    measured: a candidate ran; resumed: a candidate was taken from an earlier run. With nothing, the counters of a
    new run.
    """
    swap = swap or {}
    ledger = {**run, **{key: run.get(key, 0) for key in RUN_COUNTERS}}
    ledger["loads_s"] += float(swap.get("load") or 0) + _step_seconds(start, "start")
    ledger["stops_s"] += _step_seconds(stop, "stop") + float(swap.get("rollback") or 0)
    ledger["benchmarks_s"] += bench_seconds(bench)
    ledger["measured"] += int(bool(measured))
    ledger["resumed"] += int(bool(resumed))
    return ledger


def runs(run, saved, started, now):
    """The runs of the report: those saved by earlier runs, then this one with its total so far."""
    earlier = [item for item in (saved or {}).get("runs", []) if item.get("started") != run.get("started")]
    return [*earlier, {**run, "total_s": seconds(now, "now") - seconds(started, "the tune's start")}]


def time_split(run):
    """Where a run's time went: loads, benchmarks, stops, and the collection's own part (the rest)."""
    total = float(run.get("total_s", 0))
    parts = {key: float(run.get(key, 0)) for key in ("loads_s", "benchmarks_s", "stops_s")}
    return {"total_s": round(total, 1), **{key: round(value, 1) for key, value in parts.items()},
            "overhead_s": round(max(total - sum(parts.values()), 0.0), 1)}  # fmt: skip


def outcome(candidate, swap=None, bench=None, refusal="", plan=""):
    """The report's row of one candidate: what the planner, the swap and the benchmark made of it.

    swap: its vllm_swap_result; bench: its vllm_bench_result, or {failed, msg} when the benchmark failed;
    refusal: the planner's reason; plan: what the planner found of a layout it passed. A candidate that a saved run
    measured comes back as that run left it.
    """
    row = {key: candidate[key] for key in ("name", "key", "layout_name", "layout", "settings", "entry_name")}
    row.update(verdict="pending", reason=plan, load_s=None, bench_s=None, levels=[], resumed=False)
    if candidate.get("saved"):
        return {**row, **candidate["saved"], "resumed": True}
    if refusal:
        return {**row, "verdict": "refused", "reason": refusal}
    if not swap:
        return row
    row["load_s"] = swap.get("load")
    if swap.get("result") != "swapped":
        return {**row, "verdict": "failed", "reason": swap.get("msg") or swap.get("result", "")}
    if not bench or bench.get("failed"):
        return {**row, "verdict": "failed", "reason": f"benchmark: {(bench or {}).get('msg', 'not run')}"}
    return {
        **row,
        "verdict": "measured",
        "bench_s": round(bench_seconds(bench), 1),
        "levels": level_figures(bench["levels"]),
    }


def planned_rows(candidates, plans):
    """The report's rows before any candidate runs, by key: saved, refused (the planner's reason) or to run.

    plans: the registered results of llmops.vllm.vllm_plan for each candidate, in the same order; a plan that did
    not pass (`ok` false, or no plan at all: a config.json that cannot be read) refuses its candidate.
    """
    if len(candidates) != len(plans):
        raise TuneError(f"{len(candidates)} candidates but {len(plans)} plans")
    rows = {}
    for candidate, plan in zip(candidates, plans, strict=True):
        # The planner names the candidate's entry; the model's name says the same to people.
        model = candidate["entry_name"].rpartition("_tune_")[0]
        found = (plan.get("summary", "") if plan.get("ok") else plan.get("msg") or "not planned").replace(
            candidate["entry_name"], model
        )
        rows[candidate["key"]] = outcome(
            candidate, refusal="" if plan.get("ok") else found, plan=found if plan.get("ok") else ""
        )
    return rows
