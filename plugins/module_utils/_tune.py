# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bookkeeping of a tune: the candidates, their catalog entries, the resume key, the winner, the ledger of its
time, the time budget, the guard's command, the report.

A tune deploys layouts and server settings of one catalog entry in turn, benchmarks each and keeps the best.
These pure functions take plain data (a checked catalog entry, the tune's options, the saved results, the
vllm_bench levels) so that the vllm_tune role only runs what they decide. A candidate reaches the unit as a
catalog entry of its own, derived from the model's, whose source is the weights already on the host: the
swap machinery deploys it like any other entry, and no candidate fetches the weights again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import numbers

from ansible_collections.llmops.vllm.plugins.module_utils._catalog import DERIVED_KEYS, CatalogError, check_entry
from ansible_collections.llmops.vllm.plugins.module_utils._clock import seconds
from ansible_collections.llmops.vllm.plugins.module_utils._instances import displaced
from ansible_collections.llmops.vllm.plugins.module_utils._planner import Layout

# The server settings that a grid or a candidate may set; the first two are keys of the catalog entry, the
# others reach the command line through its extra_args.
SETTINGS = ("max_num_seqs", "gpu_memory_utilization", "max_num_batched_tokens", "enforce_eager", "extra_args")
ENTRY_SETTINGS = ("max_num_seqs", "gpu_memory_utilization")
CANDIDATE_KEYS = ("name", "layout", "settings")
# What a candidate ended as. Only `measured` and `failed` are kept for a resumed run: a refusal is planned again
# (it costs milliseconds); a pending candidate (the planner passed it) or a skipped one (the time budget) never ran.
VERDICTS = ("pending", "measured", "failed", "refused", "skipped")
KEPT_VERDICTS = ("measured", "failed")
# The figures of a level that the report keeps, as vllm_bench names them.
LEVEL_FIELDS = (
    "max_concurrency", "completed", "failed", "duration", "output_throughput", "request_throughput",
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms",
)  # fmt: skip
# A run's ledger: seconds of loads, benchmarks and stops, and candidates run or taken from earlier runs.
RUN_COUNTERS = ("loads_s", "benchmarks_s", "stops_s", "measured", "resumed")
ENFORCE_EAGER = "--enforce-eager"
BATCHED_TOKENS = "--max-num-batched-tokens"


class TuneError(ValueError):
    """Tune options that do not fit the catalog entry or each other; the message says which."""


def _is_whole(value, minimum=1):
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _check_settings(settings, where):
    if not isinstance(settings, dict):
        raise TuneError(f"{where}: settings must be a mapping of {list(SETTINGS)}, got {settings!r}")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TuneError(f"{where}: unknown settings {unknown}; a tune sets {list(SETTINGS)}")
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if key in settings and not _is_whole(settings[key]):
            raise TuneError(f"{where}: {key} must be a whole number of at least 1, got {settings[key]!r}")
    fraction = settings.get("gpu_memory_utilization", 0.5)
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise TuneError(f"{where}: gpu_memory_utilization must be a fraction in (0, 1], got {fraction!r}")
    if not isinstance(settings.get("enforce_eager", False), bool):
        raise TuneError(f"{where}: enforce_eager must be true or false, got {settings['enforce_eager']!r}")
    extra = settings.get("extra_args", [])
    if not isinstance(extra, list) or not all(isinstance(arg, str) and arg for arg in extra):
        raise TuneError(f"{where}: extra_args must be a list of arguments, got {extra!r}")
    return settings


def _layouts(entry, layouts):
    """[(name, mapping)] of the layouts to try: names of the entry's own, or mappings (named as `TP8 EP8`)."""
    named = {"default": entry["layout"], **entry["alternatives"]}
    if not layouts:
        return list(named.items())
    chosen = []
    for layout in layouts:
        if isinstance(layout, dict):
            try:
                chosen.append((Layout.from_mapping(layout).describe(), layout))
            except (TypeError, ValueError):
                raise TuneError(f"layout {layout!r} must map parallel sizes to whole numbers") from None
        elif layout in named:
            chosen.append((layout, named[layout]))
        else:
            raise TuneError(f"layout {layout!r} is not a mapping nor one of {entry['name']}'s: {sorted(named)}")
    return chosen


def _grid(grid):
    """Every combination of the grid's values, in the grid's order; [{}] for no grid."""
    if not isinstance(grid, dict):
        raise TuneError(f"the grid must map settings to lists of values, got {grid!r}")
    for key, values in grid.items():
        if key not in SETTINGS:
            raise TuneError(f"the grid has an unknown setting {key!r}; a tune sets {list(SETTINGS)}")
        if not isinstance(values, list) or not values:
            raise TuneError(f"the grid's {key} must be a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [
        dict(zip(keys, combination, strict=True)) for combination in itertools.product(*(grid[key] for key in keys))
    ]


def candidate_name(layout_name, settings):
    """`default`, `tp3 max_num_seqs=8`: the layout and the settings that differ from the entry's."""
    parts = [layout_name]
    for key in SETTINGS:
        if key in settings:
            value = " ".join(settings[key]) if key == "extra_args" else settings[key]
            parts.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value}")
    return " ".join(parts)


def expand(entry, layouts=None, grid=None, candidates=None):
    """The candidates of a tune: {name, layout_name, layout, settings}, in the order they will run.

    Either `candidates` (the user's list: each {layout: a name or a mapping, settings, name}) or the layouts
    (the entry's default and alternatives unless named) times every combination of the grid's values.
    """
    found = []
    if candidates:
        if not isinstance(candidates, list):
            raise TuneError(f"candidates must be a list of {{layout, settings, name}}, got {candidates!r}")
        for position, item in enumerate(candidates):
            where = f"candidate {position + 1}"
            if not isinstance(item, dict) or set(item) - set(CANDIDATE_KEYS):
                raise TuneError(f"{where} must be a mapping of {list(CANDIDATE_KEYS)}, got {item!r}")
            [(layout_name, layout)] = _layouts(entry, [item.get("layout", "default")])
            settings = _check_settings(item.get("settings", {}), where)
            found.append((item.get("name"), layout_name, layout, settings))
    else:
        for (layout_name, layout), settings in itertools.product(_layouts(entry, layouts), _grid(grid or {})):
            found.append((None, layout_name, layout, _check_settings(settings, candidate_name(layout_name, {}))))
    result, names = [], set()
    for name, layout_name, layout, settings in found:
        name = name or candidate_name(layout_name, settings)
        if name in names:
            raise TuneError(f"two candidates are both {name!r}")
        names.add(name)
        result.append({"name": name, "layout_name": layout_name, "layout": layout, "settings": settings})
    return result


def _with_settings(raw, layout, settings):
    """The raw entry with the candidate's layout and settings applied."""
    entry = {**raw, "layout": layout, "alternatives": {}}
    for key in ENTRY_SETTINGS:
        if key in settings:
            entry[key] = settings[key]
    extra = list(raw.get("extra_args", []))
    if "max_num_batched_tokens" in settings:
        extra = [arg for arg in extra if not arg.startswith(BATCHED_TOKENS + "=")]
        if BATCHED_TOKENS in extra:
            del extra[extra.index(BATCHED_TOKENS) : extra.index(BATCHED_TOKENS) + 2]
        extra += [BATCHED_TOKENS, str(settings["max_num_batched_tokens"])]
    if "enforce_eager" in settings:
        extra = [arg for arg in extra if arg != ENFORCE_EAGER] + ([ENFORCE_EAGER] if settings["enforce_eager"] else [])
    entry["extra_args"] = extra + list(settings.get("extra_args", []))
    return entry


def raw_entry(entry):
    """A checked catalog entry as a file holds it: without the keys that checking adds."""
    return {key: value for key, value in entry.items() if key not in DERIVED_KEYS}


def resume_key(entry, candidate, workload):
    """A hash of the model's entry, the candidate and the workload: equal keys measure the same thing."""
    subject = {
        "entry": {key: value for key, value in raw_entry(entry).items() if key != "description"},
        "layout": candidate["layout"],
        "settings": candidate["settings"],
        "workload": workload,
    }
    return hashlib.sha256(json.dumps(subject, sort_keys=True, default=str).encode()).hexdigest()[:16]


def candidate_entry(entry, candidate, key, weights_path=""):
    """(name, raw entry, checked entry) of the catalog entry that deploys `candidate` from `weights_path`, the
    tuned instance's weights on the host (empty: the entry's own source, for a plan before any deploy)."""
    name = f"{entry['name']}_tune_{key[:10]}"
    raw = _with_settings(raw_entry(entry), candidate["layout"], candidate["settings"])
    raw["description"] = f"{entry['name']} tune candidate {candidate['name']}"
    if weights_path:
        raw["source"] = {"kind": "local", "path": weights_path}
    try:
        return name, raw, check_entry(name, raw)
    except CatalogError as error:
        raise TuneError(f"candidate {candidate['name']}: {error}") from None


def overlay_entry(entry, candidate):
    """The model's own entry with the winner's layout and settings: the catalog overlay that deploy.yml reads."""
    raw = _with_settings(raw_entry(entry), candidate["layout"], candidate["settings"])
    raw["description"] = f"{entry.get('description') or entry['name']}; layout and settings from a tune"
    raw["alternatives"] = entry["alternatives"]
    check_entry(entry["name"], raw)
    return raw


def plan_candidates(entry, options, saved=None):
    """Each candidate with its resume key, its derived entry and what a saved run measured of it.

    options: layouts, grid, candidates, workload, weights_path (the tuned instance's weights on the host).
    saved: a previous report of this host (its `candidates`); a candidate whose key it holds as measured or
    failed is not run again.
    """
    kept = {item["key"]: item for item in (saved or {}).get("candidates", []) if item.get("verdict") in KEPT_VERDICTS}
    result = []
    for candidate in expand(entry, options.get("layouts"), options.get("grid"), options.get("candidates")):
        key = resume_key(entry, candidate, options["workload"])
        name, raw, checked = candidate_entry(entry, candidate, key, options.get("weights_path", ""))
        result.append({**candidate, "key": key, "entry_name": name, "entry": checked, "raw_entry": raw,
                       "saved": kept.get(key)})  # fmt: skip
    return result


def level_figures(levels):
    """The figures of each vllm_bench level that the report keeps."""
    return [{field: level.get(field) for field in LEVEL_FIELDS if field in level} for level in levels or []]


def check_objective(concurrency, slo, levels):
    """Refuse an objective that cannot be scored: a level not benchmarked, an SLO on no latency."""
    if not isinstance(levels, list) or not levels or not all(_is_whole(level) for level in levels):
        raise TuneError(f"the concurrency levels must be a non-empty list of whole numbers, got {levels!r}")
    if concurrency and slo:
        raise TuneError("choose an objective: a concurrency (throughput there) or an SLO (the highest level it meets)")
    if concurrency and concurrency not in levels:
        raise TuneError(f"the objective's concurrency {concurrency} is not one of the levels benchmarked, {levels}")
    if not isinstance(slo, dict):
        raise TuneError(f"the SLO must map latency fields (median_ttft_ms, p99_itl_ms, ...) to ms, got {slo!r}")
    for metric, limit in slo.items():
        if not metric.endswith("_ms") or metric not in LEVEL_FIELDS:
            known = [field for field in LEVEL_FIELDS if field.endswith("_ms")]
            raise TuneError(f"the SLO's {metric!r} is not a latency the tune keeps; one of {known}")
        if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or limit <= 0:
            raise TuneError(f"the SLO's {metric} must be a number of ms above 0, got {limit!r}")


def score(levels, concurrency=0, slo=None):
    """(level, output tok/s, why) of one candidate's levels under the objective; level None when none counts."""
    by_level = {level["max_concurrency"]: level for level in levels}
    if slo:
        meeting = [
            level for level in levels if all(level.get(metric, float("inf")) <= limit for metric, limit in slo.items())
        ]
        if not meeting:
            return None, 0.0, "no level meets the SLO"
        best = max(meeting, key=lambda level: level["max_concurrency"])
        return best["max_concurrency"], best["output_throughput"], f"meets the SLO up to C={best['max_concurrency']}"
    chosen = concurrency or max(by_level)
    if chosen not in by_level:
        return None, 0.0, f"C={chosen} was not measured"
    return chosen, by_level[chosen]["output_throughput"], f"at C={chosen}"


def slo_text(slo):
    return " and ".join(f"{metric} <= {limit:g}" for metric, limit in slo.items())


def winner(candidates, concurrency=0, slo=None):
    """The measured candidate with the highest output throughput under the objective, and why; None when none."""
    scored = []
    for candidate in candidates:
        if candidate.get("verdict") != "measured":
            continue
        level, throughput, why = score(candidate["levels"], concurrency, slo)
        if level is not None:
            ttft = next(item["median_ttft_ms"] for item in candidate["levels"] if item["max_concurrency"] == level)
            scored.append((throughput, -ttft, candidate, level, why))
    if not scored:
        objective = f"the SLO {slo_text(slo)}" if slo else "the objective"
        return {"name": None, "key": None, "reason": f"no candidate was measured that meets {objective}"}
    scored.sort(key=lambda item: item[:2], reverse=True)
    throughput, best, level, why = scored[0][0], *scored[0][2:]
    runner_up = ""
    if len(scored) > 1:
        second = scored[1]
        runner_up = f"; next {second[2]['name']} with {second[0]:.0f} tok/s ({second[4]})"
    objective = f"under the SLO {slo_text(slo)}" if slo else "the highest output throughput"
    reason = f"{best['name']}: {throughput:.0f} output tok/s {why}, {objective}{runner_up}"
    return {"name": best["name"], "key": best["key"], "level": level, "output_throughput": throughput, "reason": reason}


def pareto_front(points):
    """The points (ttft_ms, tok_s, ...) that no other point beats on both: lower TTFT and higher throughput."""
    front = []
    for point in sorted(points, key=lambda item: (item[0], -item[1])):
        if not front or point[1] > front[-1][1]:
            front.append(point)
    return front


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


def bystanders(tuned, records, candidate, gpu_count=0):
    """The running instances, other than the tuned one, that the tune's candidates would stop and never start again.

    tuned: the record of the tuned instance; records: the host's instance records; candidate: the name of the
    candidates' instance. Each candidate takes the tuned instance's port and GPUs, and the swap machinery stops
    whatever runs there; the tune brings back the tuned instance alone. A candidate left running by an earlier
    run is not one: the tune stops it anyway.
    """
    if not isinstance(tuned, dict) or not {"instance", "port"} <= tuned.keys():
        raise TuneError(f"the tuned instance's record needs its instance and port, got {tuned!r}")
    new = {"name": candidate, "port": tuned["port"], "gpus": tuned.get("gpus") or []}
    stopped = displaced(new, records, gpu_count)
    return [record["instance"] for record in stopped if record["instance"] != tuned["instance"]]


def guard_command(unit, after, instance, stop_unit="", start_unit=""):
    """The argument list of systemd-run that arms the tune's guard, a timer `unit` that fires `after` seconds from
    now. Its service stops and disables stop_unit (the candidate running, if any), then starts start_unit (the
    tuned instance, if it served) without waiting for its load. No shell: each command is a line of the service
    (ExecStartPre=, ExecStart=), and a failure of the stop or the disable (a unit already stopped) is ignored.
    """
    if isinstance(after, bool) or not isinstance(after, int) or after <= 0:
        raise TuneError(f"the guard fires after a whole number of seconds above 0, got {after!r}")
    for name in (unit, stop_unit, start_unit):
        if name and (not isinstance(name, str) or any(char.isspace() for char in name)):
            raise TuneError(f"{name!r} is not a unit name")
    command = [
        "systemd-run",
        f"--unit={unit}",
        f"--on-active={after}",
        "--timer-property=AccuracySec=1s",
        f"--description=llmops.vllm tune guard of {instance}",
    ]
    if stop_unit:
        command += [f"--property=ExecStartPre=-systemctl stop {stop_unit}",
                    f"--property=ExecStartPre=-systemctl disable {stop_unit}"]  # fmt: skip
    return command + (["systemctl", "start", "--no-block", start_unit] if start_unit else ["true"])


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
