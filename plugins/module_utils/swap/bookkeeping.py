# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bookkeeping of a swap: which instance the new model gets, whether the old ones can sleep, what the swap
ended as and where its time went, when a rollout stops.

Pure functions over plain data (instance records, the registered results of llmops.vllm.vllm_service,
gpu_memory_wait and ansible.builtin.find, clock readings in seconds); the vllm_swap and vllm_rollout roles call
them as filters.
"""

from __future__ import annotations

import re

from ansible_collections.llmops.vllm.plugins.module_utils.common.clock import seconds
from ansible_collections.llmops.vllm.plugins.module_utils.gpu.memory import CUDA_RESERVED_MIB
from ansible_collections.llmops.vllm.plugins.module_utils.instance.host_instances import gpu_set
from ansible_collections.llmops.vllm.plugins.module_utils.plan.planner import DEFAULT_GPU_MEMORY_UTILIZATION
from ansible_collections.llmops.vllm.plugins.module_utils.weights.page_cache import meminfo_bytes

# A swap's results, and those that count against a rollout's failure budget.
RESULTS = ("prepared", "refused", "unchanged", "swapped", "rolled back", "failed", "skipped")
FAILED_RESULTS = ("refused", "rolled back", "failed")
MODES = ("stop", "sleep", "beside")
# vLLM's sleep mode over HTTP (/sleep, /wake_up, /is_sleeping) in the V1 engine, as its docs describe it since
# 0.10; the collection has run it on 0.26 (CUDA, docs/fleet.md).
SLEEP_MIN_RELEASE = (0, 10, 0)
# Of the host's memory, the share that sleeping weights may never take: the rest of the host needs it.
HOST_MEMORY_RESERVE = 0.10
MIB = 1024 * 1024
RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class SwapError(ValueError):
    """A swap asked of instances or settings that do not fit; the message says which."""


def new_instance(
    model, records, version, name="", replace="", port=None, gpus=None, default_port=8000, catalog_paths=()
) -> dict:
    """The new instance of a swap to `model`, as the vllm_preflight role takes it: {name, model, port, gpus}, and
    catalog_paths where given (directories searched for the model before the user's catalog).

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
    spec = {"name": name, "model": model, "port": chosen_port, "gpus": chosen_gpus}
    return {**spec, "catalog_paths": list(catalog_paths)} if catalog_paths else spec


def meminfo_mib(text: str) -> dict:
    """MiB of each /proc/meminfo field (MemTotal, MemAvailable, ...)."""
    return {name: value // MIB for name, value in meminfo_bytes(text).items()}


def _release(version: str) -> tuple:
    match = RELEASE.match(str(version or ""))
    return tuple(int(part or 0) for part in match.groups()) if match else (0, 0, 0)


def weights_bytes(found) -> dict:
    """The bytes of each old instance's weights, by instance, from the registered loop of ansible.builtin.find
    over their model paths (each item the instance's record)."""
    return {
        result["item"]["instance"]: sum(int(file["size"]) for file in result.get("files") or [])
        for result in (found or {}).get("results") or []
    }


def sleep_plan(old_records, new_instance, device, meminfo, weights_found, budget_mib=0) -> dict:
    """Whether the instances that a swap replaces can sleep instead of stopping, checked before any change.

    old_records: the instance records of the instances replaced; new_instance: the planned new instance (its
    `port` and catalog `entry`); device: the build of vLLM on the host (cpu or cuda); meminfo: the text of
    /proc/meminfo; weights_found: the registered loop of ansible.builtin.find over the old instances' weights
    (weights_bytes), which level 1 keeps in CPU memory while they sleep; budget_mib: the most CPU memory the
    sleeping weights may take, 0 for what the host has available less HOST_MEMORY_RESERVE of its total. Returns
    `refusals` (one sentence each; empty when the swap can sleep), the memory figures in MiB, and
    `fit_utilization`: the new instance's share of each GPU, which must be free beside the sleeping ones before
    it starts.
    """
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib < 0:
        raise SwapError(f"the sleep's CPU memory budget must be 0 (what the host has) or more MiB, got {budget_mib!r}")
    refusals = []
    if device == "cpu":
        refusals.append("vLLM's CPU build has no sleep mode (vLLM has it on CUDA, ROCm and XPU)")
    refusals += group_refusals(old_records, new_instance)
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
    sizes = weights_bytes(weights_found)
    sleeping_bytes = sum(sizes.get(record["instance"], 0) for record in old_records)
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


def group_refusals(old_records, new_instance) -> list:
    """The refusal of a swap mode that moves one host's instance alone, where a multi-host group is involved."""
    groups = [record["instance"] for record in old_records if record.get("group")]
    if new_instance.get("group"):
        groups.append(new_instance.get("name", "the new instance"))
    if not groups:
        return []
    return [
        f"{', '.join(groups)} {'is a' if len(groups) == 1 else 'are'} multi-host group"
        f"{'' if len(groups) == 1 else 's'}, whose members stop and start together"
    ]


def beside_plan(old_records, new_instance, gpus) -> dict:
    """Whether the new instance can start beside the instances it replaces, which serve on until it has passed its
    gate (vllm_swap_mode=beside), checked before any change.

    old_records: the records of the instances replaced; new_instance: the planned new instance (its `name`, `port`,
    `gpus` and catalog `entry`); gpus: the host's GPUs as gpu_facts reads them (`index`, `memory_total_mib`,
    `memory_used_mib`, read while the old instances serve), [] on a host without GPUs. Returns `refusals` (one
    sentence each; empty when it can) and `fit_utilization`, the new instance's share of each of its GPUs, which
    must be free beside what they hold.
    """
    refusals = group_refusals(old_records, new_instance)
    for record in old_records:
        if int(record["port"]) == int(new_instance["port"]):
            refusals.append(
                f"{record['instance']} serves on port {record['port']} until the new instance has passed its gate:"
                " the new instance needs a port of its own (vllm_swap_port)"
            )
    entry = new_instance.get("entry") or {}
    utilization = float(entry.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    wanted = gpu_set(new_instance.get("gpus") or [], len(gpus))
    for gpu in gpus:
        if gpu["index"] not in wanted:
            continue
        total, used = gpu["memory_total_mib"], gpu["memory_used_mib"]
        needed = round(utilization * total)
        if used + needed + CUDA_RESERVED_MIB > total:
            refusals.append(
                f"GPU {gpu['index']} holds {used} of {total} MiB while the old instances serve, and the new one's"
                f" share ({utilization:g}, {needed} MiB) does not fit beside them: lower its gpu_memory_utilization,"
                " or swap by stop or sleep"
            )
    return {"refusals": refusals, "fit_utilization": utilization}


def to_deploy(planned, mode, device) -> list:
    """The new instance as the vllm_deploy role takes it, in a list: a swap in sleep mode on a build that has it
    starts it with sleep mode, so that the next swap can put it to sleep too."""
    if mode not in MODES:
        raise SwapError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if mode == "sleep" and device != "cpu":
        return [{**planned, "entry": {**planned["entry"], "sleep_mode": True}}]
    return [planned]


def _models(records) -> str:
    return ", ".join(record["model"] for record in records) or "nothing"


def swap_outcome(
    result,
    model,
    old=(),
    sleep=None,
    sleeping=False,
    keep_asleep=False,
    skip_reason="",
    failure="",
    rollback="",
    beside=False,
) -> dict:
    """A swap's outcome for people, {result, msg, asleep}, as the switch-over ends.

    result: unchanged (skipped when a skip_reason is given: the new instance is prepared and left stopped),
    swapped, refused, rolled back or failed. old: the records of the instances replaced; sleep: the sleep plan
    (its refusals, when sleep mode was asked for and the old instances stopped instead); sleeping: they slept;
    keep_asleep: they are left asleep; beside: they served beside the new one until it was gated. failure: what
    made the swap fail (refused, rolled back, failed); rollback: what made the rollback fail too.
    """
    asleep = []
    if result == "unchanged" and skip_reason:
        result, msg = "skipped", f"{skip_reason}; {model} is prepared but not started"
    elif result == "unchanged":
        msg = f"{model} already serves"
    elif result == "swapped":
        refusals = (sleep or {}).get("refusals") or []
        msg = f"{model} serves"
        if refusals:
            msg += f"; sleep mode refused ({'; '.join(refusals)}), the old instances stopped instead"
        names = [record["instance"] for record in old]
        if sleeping and keep_asleep:
            asleep = names
        elif sleeping:
            msg += f"; {', '.join(names)} slept, then stopped"
        elif beside and names:
            msg += f"; {', '.join(names)} served beside it until its gate, then stopped"
    elif result == "refused":
        msg = failure
    elif result == "rolled back":
        msg = f"{failure}; rolled back, {_models(old)} serves again"
    elif result == "failed":
        msg = f"{failure}; the rollback failed too ({rollback}); check the host"
    else:
        raise SwapError(f"an outcome is one of unchanged, swapped, refused, rolled back and failed, got {result!r}")
    return {"result": result, "msg": msg, "asleep": asleep}


def loadseconds(started: dict | None) -> float:
    """How long the new instance's start took: its phases when it served, the whole failed attempt when not."""
    started = started or {}
    if started.get("start"):
        return seconds(started["start"]["elapsed"], "start.elapsed")
    return seconds(started.get("elapsed", 0), "elapsed") if started.get("failed") else 0.0


def stopseconds(stopped: dict | None) -> float:
    """The stops (or sleeps) of the replaced instances (a loop's registered results), as the module timed each."""
    results = (stopped or {}).get("results") or []
    return sum(
        seconds(result[step]["elapsed"], f"{step}.elapsed")
        for result in results
        for step in ("stop", "sleep")
        if result.get(step)
    )


def cut_off(stopped: dict | None) -> dict:
    """The requests that the stops (or sleeps) of the replaced instances aborted, and those they refused after
    SIGTERM, as the module counted them."""
    reports = [result[step] for result in (stopped or {}).get("results") or [] for step in ("stop", "sleep")
               if result.get(step)]  # fmt: skip
    return {
        "aborted_requests": sum(report.get("aborted_requests") or 0 for report in reports),
        "refused_requests": sum(report.get("refused_requests") or 0 for report in reports),
    }


def timings(clock: dict, now, stopped=None, memory=None, started=None) -> dict:
    """Where a swap's time went, in seconds rounded to 0.1.

    clock: readings of one clock, in seconds: `prepare` and `prepared` (the preparation began and ended; a
    preparation that was refused never ended), `switch` (the switch-over began; absent when it did not), `down`
    (the first stop began; absent when nothing stopped), `rollback` (the rollback began), `up` (a model served
    again; absent or null when none does: the downtime lasts until `now`). The downtime is split into the stops,
    the GPU memory wait, the new instance's load, the rollback, and the collection's own part, the rest.
    """
    marks = {key: seconds(value, f"clock.{key}") for key, value in clock.items() if value not in (None, "")}
    now = seconds(now, "now")
    up = marks.get("up", now)
    downtime = up - marks["down"] if "down" in marks else 0.0
    parts = {
        "stop": stopseconds(stopped),
        "memory_wait": seconds((memory or {}).get("elapsed", 0), "memory_wait"),
        "load": loadseconds(started),
        "rollback": up - marks["rollback"] if "rollback" in marks else 0.0,
    }
    preparation = marks.get("prepared", now) - marks["prepare"] if "prepare" in marks else 0.0
    result = {
        "seconds": preparation + (now - marks["switch"] if "switch" in marks else 0.0),
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


def gate_summary(registered: dict | None) -> dict | None:
    """What the gate of the new instance answered (llmops.vllm.vllm_gate's registered result, failed or not):
    the decision, its rounds and seconds, the measured spread and serial correlation (for the next gate), and each
    deciding metric's change with its interval; None when no gate answered (none ran, or it failed before an
    answer)."""
    registered = registered or {}
    if not registered.get("decision"):
        return None
    metrics = registered.get("metrics") or []
    deciding = [metric for metric in metrics if metric["decision"] == registered["decision"]] or metrics
    shown = []
    for metric in deciding:
        interval = metric.get("interval_percent")
        change = metric.get("change_percent")
        shown.append(
            {
                "name": metric["name"],
                "decision": metric["decision"],
                "change_percent": None if change is None else round(change, 1),
                "interval_percent": None if interval is None else [round(bound, 1) for bound in interval],
            }
        )
    described = [
        f"{metric['name']} {metric['change_percent']:+.1f}% [{metric['interval_percent'][0]:+.1f}%,"
        f" {metric['interval_percent'][1]:+.1f}%]"
        for metric in shown
        if metric["interval_percent"] is not None
    ]
    answer = f"{registered['decision']} in {registered['rounds']} rounds" + (
        f": {', '.join(described)}" if described else ""
    )
    return {
        "decision": registered["decision"],
        "mode": registered.get("mode"),
        "rounds": registered["rounds"],
        "seconds": round(seconds(registered.get("seconds", 0), "gate.seconds"), 1),
        "spread": registered.get("spread"),
        "serial_correlation": registered.get("serial_correlation"),
        "metrics": shown,
        "answer": answer,
    }


def gate_offer(old_records, host, address, config_dir, kind) -> dict:
    """How a prepared host offers the instance it still serves as the gate's reference to hosts that switch over
    before it: where the controller reaches it, where its records lie, its kind (the vLLM build and its GPUs' names)
    and the instances it serves until its own switch-over."""
    return {
        "host": host,
        "address": address,
        "config_dir": config_dir,
        "kind": kind,
        "instances": [
            {field: record[field] for field in ("instance", "model", "served_name", "vllm_version")}
            for record in old_records
        ],
    }


def _serves(offer: dict) -> list:
    return sorted((item["model"], item["served_name"], item["vllm_version"]) for item in offer["instances"])


def gate_reference(results, host, batch) -> dict:
    """The gate's reference for `host` of this `batch`: an instance of a host of the same kind outside the batch,
    prepared but not switched over, that serves what `host` served before (the same entry, name and release);
    {} when none does (then a saved baseline may serve).

    results: every host's vllm_swap_result; a prepared host's holds its `reference` offer (gate_offer). The hosts
    of the batch take the peers in the play's order, each its own, so that no reference serves two gates at once.
    """
    by_host = {result.get("host"): result for result in results}
    if (by_host.get(host) or {}).get("group"):
        return {}  # a multi-host group's readiness (every rank computes) is its gate: the gate measures one host
    peers = [
        result["reference"]
        for result in results
        if result.get("result") == "prepared"
        and result.get("reference")
        and not result.get("group")
        and result.get("host") not in batch
    ]
    taken = set()
    for member in batch:
        offer = (by_host.get(member) or {}).get("reference")
        if not offer or len(offer["instances"]) != 1:
            continue
        match = next(
            (
                peer
                for peer in peers
                if peer["host"] not in taken and peer["kind"] == offer["kind"] and _serves(peer) == _serves(offer)
            ),
            None,
        )
        if match is None:
            continue
        taken.add(match["host"])
        if member == host:
            return {
                "host": match["host"],
                "address": match["address"],
                "config_dir": match["config_dir"],
                "instance": match["instances"][0]["instance"],
            }
    return {}


def summary_line(result: dict) -> str:
    """One line for people: the result, where the downtime went, and the message."""
    rollback = f" + rollback {result['rollback']:g}" if result["rollback"] else ""
    asleep = f"; {', '.join(result['asleep'])} kept asleep" if result["asleep"] else ""
    prefetch = f"; prefetch: {result['prefetch']}" if result["prefetch"] else ""
    requests = [f"{result[key]} {word}" for key, word in (("aborted_requests", "aborted"), ("refused_requests",
                "refused after SIGTERM")) if result.get(key)]  # fmt: skip
    cut = f"; requests the {result['mode']} cut off: {', '.join(requests)}" if requests else ""
    gate = f"; gate: {result['gate']['answer']} ({result['gate']['seconds']:g} s)" if result.get("gate") else ""
    return (
        f"{result['result']} in {result['seconds']:g} s ({result['old']} -> {result['new']}); down "
        f"{result['downtime']:g} s = {result['mode']} {result['stop']:g} + GPU memory wait {result['memory_wait']:g}"
        f" + load {result['load']:g}{rollback} + the collection's own {result['overhead']:g}. {result['msg']}{asleep}"
        f"{cut}{gate}{prefetch}"
    )


def swap_result(outcome, host, model, steps, now) -> dict:
    """The vllm_swap_result of one host: the outcome ({result, msg, asleep}) with what was swapped and where the
    time went.

    steps: what the swap did, as the role registered it: `old` (the records of the instances replaced), `record`
    (the new instance's record; empty when none was written), `running` (the records of the model's own instance
    when it serves already), `sleeping` (the old instances slept rather than stopped), `beside` (they served
    beside the new one until its gate), `clock` (see timings), and
    the registered results `stopped` (the loop that stopped or slept the old instances), `memory`
    (gpu_memory_wait), `started` (the new instance's start), `prefetch` (weights_prefetch, whose message the
    result keeps) and `gate` (vllm_gate, see gate_summary). now: the clock's reading now.
    """
    if outcome.get("result") not in RESULTS:
        raise SwapError(f"result must be one of {list(RESULTS)}, got {outcome.get('result')!r}")
    old_records = steps.get("old") or []
    version = (steps.get("record") or {}).get("vllm_version") or next(
        (record["vllm_version"] for record in steps.get("running") or []), ""
    )
    result = {
        "host": host,
        "result": outcome["result"],
        "msg": outcome.get("msg", ""),
        "old": ", ".join(record["model"] for record in old_records) or "-",
        "new": model,
        "vllm": versions(old_records, version),
        "mode": "sleep" if steps.get("sleeping") else "beside" if steps.get("beside") else "stop",
        "asleep": list(outcome.get("asleep") or []),
        "prefetch": (steps.get("prefetch") or {}).get("msg", ""),
        "gate": gate_summary(steps.get("gate")),
        **cut_off(steps.get("stopped")),
        **timings(steps.get("clock") or {}, now, steps.get("stopped"), steps.get("memory"), steps.get("started")),
    }
    result["gate_answer"] = result["gate"]["answer"] if result["gate"] else None
    result["summary"] = summary_line(result)
    return result


def _batch_sizes(batch, host_count: int) -> list[int]:
    """`batch` as Ansible's `serial` takes it (a number of hosts, 0 for all; a percentage of them, at least one; or a
    list of such, the last repeated), as numbers of hosts."""
    problem = f"vllm_rollout_batch must be a number of hosts, a percentage of them or a list of such, got {batch!r}"
    sizes = []
    for item in batch if isinstance(batch, list) else [batch]:
        text = str(item).strip()
        if isinstance(item, bool) or not re.fullmatch(r"\d+%?", text):
            raise SwapError(problem)
        size = int(text.rstrip("%"))
        if text.endswith("%"):
            size = max(1, size * host_count // 100)
        sizes.append(size or host_count)
    if not sizes:
        raise SwapError(problem)
    return sizes


def rollout_batches(hosts, results, batch) -> list[int]:
    """The sizes of a rollout's batches over `hosts` (the play's, in its order), as `serial` takes them: `batch`
    (vllm_rollout_batch), each batch grown until it holds every host of each multi-host group that one of its hosts
    belongs to, since a group switches over whole.

    results: every host's vllm_swap_result; a prepared host's `group` lists the hosts of its new group.
    """
    position = {host: index for index, host in enumerate(hosts)}
    group_of = {result.get("host"): result.get("group") or [] for result in results}
    sizes = _batch_sizes(batch, len(hosts))
    batches, start = [], 0
    while start < len(hosts):
        end = min(len(hosts), start + sizes[min(len(batches), len(sizes) - 1)])
        # Grow the batch to the last host of each group of its hosts, until that adds no group.
        while True:
            reach = max((position[member] + 1 for host in hosts[start:end] for member in group_of.get(host, [])
                         if member in position), default=end)  # fmt: skip
            if reach <= end:
                break
            end = reach
        batches.append(end - start)
        start = end
    return batches


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
