# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The arithmetic of a swap: which instance the new model gets, where the time went, when a rollout stops.

Pure functions over plain data (instance records, the registered results of llmops.vllm.vllm_service and
gpu_memory_wait, clock readings in seconds); the vllm_swap and vllm_rollout roles call them as filters.
"""

from __future__ import annotations

import numbers
import re

from ansible_collections.llmops.vllm.plugins.module_utils._planner import DEFAULT_GPU_MEMORY_UTILIZATION

# A swap's results, and those that count against a rollout's failure budget.
RESULTS = ("prepared", "refused", "unchanged", "swapped", "rolled back", "failed", "skipped")
FAILED_RESULTS = ("refused", "rolled back", "failed")
MODES = ("stop", "sleep")
# vLLM's sleep mode over HTTP (/sleep, /wake_up, /is_sleeping) in the V1 engine, as its docs describe it since
# 0.10; the collection has run it on 0.26 (CUDA, docs/fleet.md).
SLEEP_MIN_RELEASE = (0, 10, 0)
# Of the host's memory, the share that sleeping weights may never take: the rest of the host needs it.
HOST_MEMORY_RESERVE = 0.10
MIB = 1024 * 1024
RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class SwapError(ValueError):
    """A swap asked of instances or settings that do not fit; the message says which."""


def new_instance(model, records, version, name="", replace="", port=None, gpus=None, default_port=8000) -> dict:
    """The new instance of a swap to `model`, as the vllm_preflight role takes it: {name, model, port, gpus}.

    records: the host's instance records; version: the vLLM release the new instance runs. Its name is
    `name`, else the model's, unless the model's own instance runs another release: then MODEL-VERSION, so the
    old instance's unit stays as it was, a way back. It takes `port` and `gpus` when given, else those of the
    instance to replace, else default_port and every GPU.
    """
    if not isinstance(model, str) or not model:
        raise SwapError(f"the swap needs the new model's catalog name, got {model!r}")
    replaced = {}
    if replace:
        known = {record["instance"]: record for record in records}
        if replace not in known:
            here = ", ".join(sorted(known)) or "none"
            raise SwapError(f"the instance to replace, {replace}, is not an instance of this host; it has {here}")
        replaced = known[replace]
    if not name:
        other_release = [
            record
            for record in records
            if record["instance"] == model
            and record.get("active_state") == "active"
            and record["vllm_version"] != version
        ]
        name = f"{model}-{version}" if other_release else model
    chosen_port = port if port not in (None, "", 0) else replaced.get("port", default_port)
    chosen_gpus = gpus if gpus is not None else replaced.get("gpus", [])
    return {"name": name, "model": model, "port": chosen_port, "gpus": chosen_gpus}


def _seconds(value, what) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise SwapError(f"{what} must be a number of seconds, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise SwapError(f"{what} must be a number of seconds, got {value!r}") from None


def meminfo_mib(text: str) -> dict:
    """MiB of each /proc/meminfo field (MemTotal, MemAvailable, ...)."""
    fields = {}
    for line in text.splitlines():
        name, _colon, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            fields[name.strip()] = int(words[0]) // 1024 if words[1:] == ["kB"] else int(words[0]) // MIB
    return fields


def _release(version: str) -> tuple:
    match = RELEASE.match(str(version or ""))
    return tuple(int(part or 0) for part in match.groups()) if match else (0, 0, 0)


def sleep_plan(old_records, new_instance, device, meminfo, weights_bytes, budget_mib=0) -> dict:
    """Whether the instances that a swap replaces can sleep instead of stopping, checked before any change.

    old_records: the instance records of the instances replaced; new_instance: the planned new instance (its
    `port` and catalog `entry`); device: the build of vLLM on the host (cpu or cuda); meminfo: the text of
    /proc/meminfo; weights_bytes: the bytes of each old instance's weights, by instance, which level 1 keeps in
    CPU memory while it sleeps; budget_mib: the most CPU memory the sleeping weights may take, 0 for what the
    host has available less HOST_MEMORY_RESERVE of its total. Returns `refusals` (one sentence each; empty
    when the swap can sleep), the memory figures in MiB, and `fit_utilization`: the new instance's share of
    each GPU, which must be free beside the sleeping ones before it starts.
    """
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib < 0:
        raise SwapError(f"the sleep's CPU memory budget must be 0 (what the host has) or more MiB, got {budget_mib!r}")
    refusals = []
    if device == "cpu":
        refusals.append("vLLM's CPU build has no sleep mode (vLLM has it on CUDA, ROCm and XPU)")
    for record in old_records:
        name = record["instance"]
        if not record.get("sleep_mode"):
            refusals.append(
                f"{name} was not started with sleep mode; deploy it with `sleep_mode: true` in its catalog entry first"
            )
        if _release(record.get("vllm_version")) < SLEEP_MIN_RELEASE:
            minimum = ".".join(map(str, SLEEP_MIN_RELEASE))
            refusals.append(f"{name} runs vLLM {record.get('vllm_version')}, older than sleep mode's {minimum}")
        if record["port"] == new_instance["port"]:
            refusals.append(
                f"{name} keeps its port {record['port']} while it sleeps: the new instance needs a port of its own "
                "(vllm_swap_port)"
            )
    memory = meminfo_mib(meminfo)
    available = memory.get("MemAvailable", 0) - int(memory.get("MemTotal", 0) * HOST_MEMORY_RESERVE)
    budget = min(budget_mib, available) if budget_mib else available
    sleeping_bytes = sum(int(weights_bytes.get(record["instance"], 0)) for record in old_records)
    sleeping = round(sleeping_bytes / MIB, 1)
    if old_records and sleeping_bytes > budget * MIB:
        names = ", ".join(record["instance"] for record in old_records)
        if budget_mib and budget_mib <= available:
            how = f"budget of {budget_mib} MiB"
        else:
            spare = f"{max(available, 0)} MiB that the host can spare"
            how = f"{spare} (MemAvailable less {HOST_MEMORY_RESERVE:.0%} of MemTotal)"
        refusals.append(f"the weights of {names} take {sleeping:g} MiB of CPU memory asleep, more than the {how}")
    utilization = (new_instance.get("entry") or {}).get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION
    return {
        "refusals": refusals,
        "sleeping_mib": sleeping,
        "budget_mib": max(budget, 0),
        "fit_utilization": float(utilization),
    }


def load_seconds(started: dict | None) -> float:
    """How long the new instance's start took: its phases when it served, the whole failed attempt when not."""
    started = started or {}
    if started.get("start"):
        return _seconds(started["start"]["elapsed"], "start.elapsed")
    return _seconds(started.get("elapsed", 0), "elapsed") if started.get("failed") else 0.0


def stop_seconds(stopped: dict | None) -> float:
    """The stops (or sleeps) of the replaced instances (a loop's registered results), as the module timed each."""
    results = (stopped or {}).get("results") or []
    return sum(
        _seconds(result[step]["elapsed"], f"{step}.elapsed")
        for result in results
        for step in ("stop", "sleep")
        if result.get(step)
    )


def timings(clock: dict, stopped=None, memory=None, started=None) -> dict:
    """Where a swap's time went, in seconds rounded to 0.1.

    clock: `prepared` (seconds the preparation took), and readings of one clock: `switch` (the switch-over
    began), `down` (the first stop began; absent when nothing stopped), `rollback` (the rollback began),
    `up` (a model served again; absent when none does: the downtime lasts until `now`) and `now`. The
    downtime is split into the stops, the GPU memory wait, the new instance's load, the rollback, and the
    collection's own part, the rest.
    """
    marks = {key: _seconds(value, f"clock.{key}") for key, value in clock.items() if value not in (None, "")}
    now = marks["now"]
    up = marks.get("up", now)
    downtime = up - marks["down"] if "down" in marks else 0.0
    parts = {
        "stop": stop_seconds(stopped),
        "memory_wait": _seconds((memory or {}).get("elapsed", 0), "memory_wait"),
        "load": load_seconds(started),
        "rollback": up - marks["rollback"] if "rollback" in marks else 0.0,
    }
    result = {
        "seconds": marks.get("prepared", 0.0) + now - marks["switch"],
        "downtime": downtime,
        **parts,
        "overhead": max(downtime - sum(parts.values()), 0.0),
    }
    return {key: round(value, 1) for key, value in result.items()}


def versions(old_records, new_version) -> str:
    """The vLLM release before and after: one when it stays, OLD -> NEW when it changes."""
    found = []
    for release in [record.get("vllm_version") for record in old_records] + [new_version]:
        if release and release not in found:
            found.append(release)
    return " -> ".join(found) or "-"


def summary_line(result: dict) -> str:
    """One line for people: the result, where the downtime went, and the message."""
    rollback = f" + rollback {result['rollback']:g}" if result["rollback"] else ""
    asleep = f"; {', '.join(result['asleep'])} kept asleep" if result["asleep"] else ""
    return (
        f"{result['result']} in {result['seconds']:g} s ({result['old']} -> {result['new']}); down "
        f"{result['downtime']:g} s = {result['mode']} {result['stop']:g} + GPU memory wait {result['memory_wait']:g}"
        f" + load {result['load']:g}{rollback} + the collection's own {result['overhead']:g}. {result['msg']}{asleep}"
    )


def swap_result(
    outcome, host, old_records, new_model, new_version, clock, stopped=None, memory=None, started=None, mode="stop"
):
    """The vllm_swap_result of one host: outcome ({result, msg, asleep}) with what was swapped and where the time went.

    mode: how the replaced instances left their GPUs, stopped or asleep; outcome's `asleep` names those that
    still sleep at the end.
    """
    if outcome.get("result") not in RESULTS:
        raise SwapError(f"result must be one of {list(RESULTS)}, got {outcome.get('result')!r}")
    if mode not in MODES:
        raise SwapError(f"mode must be one of {list(MODES)}, got {mode!r}")
    result = {
        "host": host,
        "result": outcome["result"],
        "msg": outcome.get("msg", ""),
        "old": ", ".join(record["model"] for record in old_records) or "-",
        "new": new_model,
        "vllm": versions(old_records, new_version),
        "mode": mode,
        "asleep": list(outcome.get("asleep") or []),
        **timings(clock, stopped, memory, started),
    }
    result["summary"] = summary_line(result)
    return result


def budget_spent(results, max_fail_percentage, host_count) -> str:
    """Why a rollout stops: more of its hosts failed than the budget allows; "" while it goes on.

    results: the vllm_swap_result of each host that has one.
    """
    if isinstance(max_fail_percentage, bool):
        raise SwapError(f"max_fail_percentage must be a whole number from 0 to 100, got {max_fail_percentage!r}")
    try:
        percentage = int(str(max_fail_percentage))
    except ValueError:
        percentage = -1
    if not 0 <= percentage <= 100:
        raise SwapError(f"max_fail_percentage must be a whole number from 0 to 100, got {max_fail_percentage!r}")
    failed = [result for result in results if result.get("result") in FAILED_RESULTS]
    if len(failed) * 100 <= percentage * host_count:
        return ""
    return f"the rollout stopped: {len(failed)} of {host_count} hosts failed, more than {percentage}%"
