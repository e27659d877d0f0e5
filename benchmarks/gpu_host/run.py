# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every playbook of the collection, run by ansible-playbook against the systemd of a GPU host (README.md here).

The host is the one scripts/gpu-host/host.sh made (`host.sh up`): each playbook runs through `host.sh play`, inside
systemd's namespaces, with the json callback, and is timed from outside. Each run's time is split into the load
(vllm_service's systemd start and model load), the stops, sleeps and wake-ups, the benchmarks and the waits for GPU
memory, and the rest, Ansible's own part (module transfers, planning, templating, Ansible's start); vLLM's own phases
of each load come from the unit's journal. After each run the journal (and the kernel's log) is scanned for
"Operation not permitted", seccomp denials and "Custom allreduce is disabled". Every result goes to
gpu-host-run.json in the logs directory as soon as it is measured, and after each step that file, its table
(gpu-host-run.md) and the logs (the playbooks' JSON, the streams' records, the tune's report, the journal) packed as
gpu-host-logs.tgz go to OUT, so that a command cut off returns what it had and a run split over two GPU commands
(which the machine keeps while they follow each other) returns all of it.

Steps (in this order; --steps picks some, e.g. to split the run over two GPU commands):
  weights   real random safetensors of the catalog's host_a weights, written on the host (GPU catalog only)
  deploy    deploy.yml of host_a, then a second deploy.yml that must change nothing
  bench     bench.yml at C = 1, 8, 32, 128
  stop      stop.yml with 16 streams in flight, then deploy.yml again
  kill      SIGKILL of the engine core under 16 streams: systemd restarts the unit, status.yml says how it died
  share     two processes sharing a CUDA tensor under the unit's sandbox, with and without expandable segments
  swap      swap.yml to host_b by stop, back to host_a by sleep, then to host_broken, rolled back by wake-up
  rollout   rollout.yml to host_b (neutral), started beside host_a on port 8001 and gated against it in the same
            rounds (vllm_swap_mode=beside)
  rollout_regression  rollout.yml to host_slow (a regression) beside whichever of host_b and host_a serves, on
            the other port, gated the same way: rolled back, the old instance serving throughout
  rollout_back  rollout.yml from host_b back to host_a beside it on port 8000 (neutral again)
  tune      tune.yml of host_a: a measured candidate, one the planner refuses, one that fails to start; then
            with host_b in its place, a tune of host_a refused before any change
  end       stop.yml of every instance; the units' state
  probe     what a Python start of vLLM costs on the host: import times (-X importtime), torch's CUDA start, where
            the packages live and whether their bytecode is there (nothing is written: PYTHONDONTWRITEBYTECODE)
  start_a   start-up of host_a by phase under the unit: a first deploy.yml, then restarts (stop, start, serving)
            timed from outside, beside host_a_pyc (host_a with its bytecode cache under the service's home)
  start_seed  the seed-shaped model (MiniMax-M2.5 cut to 16 layers, --load-format dummy): its config written on the
            host, a first deploy.yml with an empty compile cache, which it publishes to the compile cache store, and
            the planner's memory figures beside vLLM's
  fleet_seed  this host as a second host of the fleet: the seed's compile cache removed, deploy.yml unpacks the
            store's archive before the unit starts
  serve_seed  the seed-shaped model through deploy, bench (C = 1, 8, 32, 128), a swap by sleep to host_a and back
  fail_seed   the seed-shaped model deployed (with its compile cache), a swap to host_broken rolled back by waking
            it, and a stop under 16 streams
  prefetch  swap.yml from host_a to host_b by stop with the weights out of the page cache, without the prefetch, and
            back with it
  startup_a   host_a deployed, a restart timed from outside with its journal line by line, what the engine process
            imports beyond the API server's modules, then vLLM's own `vllm bench startup` (cold and warm) with the
            unit's engine arguments, the unit stopped
  startup_seed  `vllm bench startup` of the seed-shaped model with the unit's engine arguments, warm from a copy of
            the compile cache that start_seed's unit left (run start_seed first)

usage: python3 benchmarks/gpu_host/run.py --inventory INVENTORY --catalog DIR --out OUT [--steps a,b,...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

# pylint: disable=wrong-import-position,import-error
from session_unit import import_collection  # noqa: E402
from vllm_phases import load_phases, start_timeline  # noqa: E402

import_collection()

from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import api_key  # noqa: E402
from ansible_collections.llmops.vllm.plugins.module_utils.service.systemd import (  # noqa: E402
    parse_environment_assignments,
    parse_environment_file,
    unit_file_exec_start,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import without_flags  # noqa: E402

HOST_SH = ROOT / "scripts" / "gpu-host" / "host.sh"
STREAM_CLIENTS = ROOT / "tests" / "integration" / "stream_clients.py"
# The tune last of the host's life: it takes longest (a GPU command that runs out of time loses the last steps).
STEPS = (
    "weights", "deploy", "bench", "stop", "kill", "share", "swap", "rollout", "rollout_regression", "rollout_back",
    "tune", "end",
    "start_seed", "fleet_seed", "serve_seed", "fail_seed", "seed_disk", "prefetch", "start_a", "probe", "startup_a",
    "startup_seed",
)  # fmt: skip
CONFIG_DIR = Path("/etc/vllm")
UNIT_DIR = Path("/etc/systemd/system")
# The service's home (vllm_server_home), where vLLM keeps its caches (VLLM_CACHE_ROOT is ~/.cache/vllm/RELEASE/ENTRY).
SERVICE_HOME = Path("/var/lib/vllm")
# The controller's compile cache store (vllm_server_compile_cache_store); the controller is this host.
COMPILE_CACHE_STORE = Path("/var/lib/llmops-gpu-host/compile-cache")
# The seed-shaped model's deploy: random weights, its compile cache published to and taken from the store.
SEED_WITH_STORE = {
    "model": "seed",
    "vllm_server_load_format": "dummy",
    "vllm_server_compile_cache_store": str(COMPILE_CACHE_STORE),
}
# The class that vLLM inspects at a first start of the seed-shaped model, unless the cache holds its answer.
SEED_ARCHITECTURE = "MiniMaxM2ForCausalLM"
# The seed's shape with its weights on disk (catalog seed_disk): layers small enough for the machine's disk.
SEED_DISK_LAYERS = 4
# What a start that compiles or JIT-builds kernels writes in the journal (and one that loads them does not).
COMPILE_LINES = re.compile(r"Compiling a graph for compile range|Directly load|torch\.compile took|DeepGEMM warmup")
SECRETS_FILE = "secrets.json"
STREAMS = 16
BENCH_LEVELS = [1, 8, 32, 128]
# What must not appear in the journal after a run (the list), and what a seccomp denial logs where the
# kernel's audit reports one (a filter that returns EPERM logs nothing: then "Operation not permitted" shows it).
JOURNAL_ALARMS = {
    "operation_not_permitted": re.compile(r"Operation not permitted|EPERM"),
    "seccomp": re.compile(r"seccomp|type=1326|SECCOMP"),
    "custom_allreduce_disabled": re.compile(r"Custom allreduce is disabled"),
}
# The actions whose time is not Ansible's own: (result key, what).
LOAD_PARTS = ("systemd_start", "load")


def now() -> str:
    return time.strftime("%H:%M:%S")


class Results:
    """gpu-host-run.json in the logs directory, rewritten after every addition. The logs directory outlives a GPU
    command (OUT does not), so that a run split over two commands adds to one file."""

    def __init__(self, logs: Path, meta: dict, steps: list):
        self.path = logs / "gpu-host-run.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {"runs": {}, "commands": []}
        self.data.setdefault("host", {}).update(meta)
        self.data["commands"].append({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": steps})

    def add(self, step: str, key: str, value):
        self.data["runs"].setdefault(step, {})[key] = value
        self.path.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        print(f"[{now()}] {step} {key}: {json.dumps(value, sort_keys=True)[:400]}", flush=True)


class GpuHost:
    """The systemd host of host.sh: playbooks, commands and the journal inside its namespaces."""

    def __init__(self, args):
        self.inventory = str(args.inventory)
        self.catalog = str(Path(args.catalog).resolve())
        self.logs = args.logs
        self.logs.mkdir(parents=True, exist_ok=True)
        # One key for every instance of the run, kept for the run's second command: a new one would change every
        # instance's environment, and so restart it.
        # It reaches ansible-playbook in a file of mode 0600, never on a command line, and stays out of the logs.
        self.secrets = self.logs / SECRETS_FILE
        if not self.secrets.exists():
            self.secrets.touch(0o600)
            self.secrets.write_text(json.dumps({"vllm_server_api_key": secrets.token_hex(16)}))
        # Numbered on from the runs of an earlier command of the same run.
        self.count = len(list(self.logs.glob("*.log")))

    def exec(self, *command, check=True, timeout=120) -> str:
        result = subprocess.run(
            ["bash", str(HOST_SH), "exec", *command], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode:
            raise RuntimeError(f"{' '.join(command)}: rc {result.returncode}: {result.stderr.strip()[-800:]}")
        return result.stdout

    def clock(self) -> float:
        return time.time()

    def play(self, name: str, playbook: str, *variables: dict, timeout: int = 900) -> dict:
        """Run a playbook; return rc, wall time, the time split, the changes and the play's JSON (in the logs)."""
        self.count += 1
        extra = {"vllm_catalog_paths": [self.catalog]}
        for item in variables:
            extra.update(item)
        command = ["bash", str(HOST_SH), "play", self.inventory, f"playbooks/{playbook}", "-e", f"@{self.secrets}"]
        command += ["-e", json.dumps(extra)]
        stem = f"{self.count:02d}-{name}"
        record = self.logs / f"{stem}.json"
        environment = os.environ | {
            "ANSIBLE_CALLBACK_PLUGINS": str(HERE / "callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "run_record",
            "LLMOPS_RUN_RECORD": str(record),
        }
        since = self.clock()
        started = time.monotonic()
        with open(self.logs / f"{stem}.log", "w", encoding="utf-8") as log:
            result = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment, timeout=timeout, check=False
            )
        wall = time.monotonic() - started
        try:
            report = json.loads(record.read_text())
        except (OSError, ValueError):
            report = {"plays": [], "stats": {}}
        outcome = {"playbook": playbook, "rc": result.returncode, "wall_s": round(wall, 2), "since": since}
        outcome |= time_split(report, wall)
        outcome["failures"] = failures(report)
        return outcome | {"report": report}

    def journal(self, since: float, unit: str | None = None) -> list[str]:
        command = ["journalctl", "--no-pager", "-o", "cat", "--since", f"@{since:.0f}"]
        if unit:
            command += ["-u", unit]
        return self.exec(*command, check=False).splitlines()

    def record(self, instance: str) -> dict:
        return json.loads((CONFIG_DIR / f"{instance}.json").read_text())

    def key_of(self, instance: str) -> str:
        """The API key of an instance, from the EnvironmentFile its record names, as the collection reads it."""
        return api_key(self.record(instance)) or ""


def tasks_of(report: dict):
    for play in report.get("plays", []):
        yield from play.get("tasks", [])


def module_results(task: dict):
    """(action, result) of each host's result of a task, each item's of a loop."""
    for result in task.get("hosts", {}).values():
        action = result.get("action", "")
        items = result.get("results")
        if isinstance(items, list) and items and all(isinstance(item, dict) for item in items):
            for item in items:
                yield action, item
        else:
            yield action, result


def task_name(task: dict) -> str:
    """A task's own name, without the `ROLE : ` that the json callback puts before it."""
    return task["task"]["name"].split(" : ", 1)[-1]


def task_seconds(task: dict) -> float:
    duration = task["task"].get("duration") or {}
    if not duration.get("start") or not duration.get("end"):
        return 0.0
    start, end = (datetime.fromisoformat(duration[key].replace("Z", "+00:00")) for key in ("start", "end"))
    return (end - start).total_seconds()


def time_split(report: dict, wall: float) -> dict:
    """The run's time: what vLLM and the GPUs took (loads, stops, sleeps, wake-ups, benchmarks, memory waits), and
    the rest, which is Ansible's own (module transfers, planning, templating, its start and its end)."""
    parts = {"load_s": 0.0, "stop_s": 0.0, "sleep_s": 0.0, "wake_s": 0.0, "bench_s": 0.0, "gpu_wait_s": 0.0}
    loads = []
    tasks_total = 0.0
    for task in tasks_of(report):
        seconds = task_seconds(task)
        tasks_total += seconds
        # A benchmark or a memory wait counts by the task's time, once for all of a loop's items.
        actions = {action for action, _result in module_results(task)}
        if any(action.endswith("vllm_bench") for action in actions):
            parts["bench_s"] += seconds
        elif any(action.endswith("gpu_memory_wait") for action in actions):
            parts["gpu_wait_s"] += seconds
        for action, result in module_results(task):
            if action.endswith("vllm_service"):
                start = result.get("start") or {}
                if start:
                    load = sum(start.get(part) or 0 for part in LOAD_PARTS)
                    parts["load_s"] += load
                    loads.append(round(load, 2))
                parts["stop_s"] += (result.get("stop") or {}).get("elapsed") or 0
                parts["sleep_s"] += (result.get("sleep") or {}).get("elapsed") or 0
                parts["wake_s"] += (result.get("wake") or {}).get("elapsed") or 0
    vllm = sum(parts.values())
    split = {key: round(value, 2) for key, value in parts.items()}
    split |= {"loads_s": loads, "tasks_s": round(tasks_total, 2)}
    split["ansible_s"] = round(wall - vllm, 2)
    split["ansible_share"] = round((wall - vllm) / wall, 3) if wall else None
    return split


def failures(report: dict) -> list:
    found = []
    for task in tasks_of(report):
        for host, result in task.get("hosts", {}).items():
            if result.get("failed") and not result.get("ignored"):
                found.append({"task": task_name(task), "host": host, "msg": str(result.get("msg", ""))[:1500]})
    return found


def results_of(report: dict, action_suffix: str) -> list:
    return [
        result
        for task in tasks_of(report)
        for action, result in module_results(task)
        if action.endswith(action_suffix) and not result.get("skipped")
    ]


def debug_lines(report: dict, name: str) -> list:
    """The message of the first task whose own name starts with `name` (a table a role shows)."""
    for task in tasks_of(report):
        if task_name(task).startswith(name):
            for result in task.get("hosts", {}).values():
                message = result.get("msg")
                if message is not None:
                    return message if isinstance(message, list) else str(message).splitlines()
    return []


def fact_of(report: dict, name: str):
    """The last value that a task of the run gave the fact `name` (a role's result), or None."""
    found = None
    for task in tasks_of(report):
        for _action, result in module_results(task):
            found = (result.get("ansible_facts") or {}).get(name, found)
    return found


def changed_tasks(report: dict) -> list:
    return [task_name(task) for task in tasks_of(report) for result in task["hosts"].values() if result.get("changed")]


def summary(outcome: dict) -> dict:
    """What the results file keeps of a run (the JSON report stays in the logs)."""
    return {key: value for key, value in outcome.items() if key != "report"}


def host_messages(journal_json: str) -> list[str]:
    """The messages of `journalctl -o json` output, less Ansible's own: a module logs its arguments to the journal
    (`ansible-MODULE: Invoked with ...`), the unit's text with its `SystemCallErrorNumber=EPERM` line among them,
    which is the play's input, not what the host did."""
    messages = []
    for line in journal_json.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journalctl gives a message that is not UTF-8 as its bytes
            message = bytes(message).decode("utf-8", "replace")
        if isinstance(message, str) and not str(entry.get("SYSLOG_IDENTIFIER", "")).startswith("ansible-"):
            messages.append(message)
    return messages


def scan(host: GpuHost, since: float) -> dict:
    """The journal since `since` (and the kernel's log) for each alarm: the count and the first lines."""
    lines = host_messages(host.exec("journalctl", "--no-pager", "-o", "json", "--since", f"@{since:.0f}",
                                    "--output-fields=SYSLOG_IDENTIFIER,MESSAGE", check=False))  # fmt: skip
    lines = [line for message in lines for line in message.splitlines()]
    kernel = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout.splitlines()
    found = {}
    for name, pattern in JOURNAL_ALARMS.items():
        hits = [line for line in lines if pattern.search(line)]
        if name == "seccomp":
            hits += [f"kernel: {line}" for line in kernel if pattern.search(line)]
        found[name] = {"count": len(hits), "lines": hits[:5]}
    return found


def phases_of_loads(host: GpuHost, since: float, unit: str) -> list:
    """vLLM's phases of each load of the unit since `since`: the journal split at each start of the unit."""
    loads, current = [], None
    for line in host.journal(since, unit):
        if line.startswith("Started ") or line.startswith("Starting "):
            if current is not None and line.startswith("Starting "):
                loads.append(current)
            current = [] if line.startswith("Starting ") else current
            continue
        if current is not None:
            current.append(line)
    if current is not None:
        loads.append(current)
    return [phases for phases in (load_phases(lines) for lines in loads) if phases]


def unit_journal(host: GpuHost, since: float, unit: str) -> list[tuple[float, str, str]]:
    """(seconds, writer, message) of the unit's journal since `since`, in order; writer `systemd` for its lines."""
    output = host.exec("journalctl", "--no-pager", "-o", "json", "-u", unit, "--since", f"@{int(since)}",
                       "--output-fields=SYSLOG_IDENTIFIER,MESSAGE", check=False)  # fmt: skip
    entries = []
    for line in output.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        if isinstance(message, list):
            message = bytes(message).decode("utf-8", "replace")
        if isinstance(message, str):
            entries.append((int(entry["__REALTIME_TIMESTAMP"]) / 1e6, str(entry.get("SYSLOG_IDENTIFIER", "")), message))
    return entries


def starts_of(entries: list[tuple[float, str, str]]) -> list[dict]:
    """Each start of the unit in its journal (split at systemd's `Starting` lines): vLLM's phases and figures, and
    the seconds from `Started` to each mark of the start (vllm_phases.MARKS)."""
    starts, current = [], None
    for entry in entries:
        if entry[1] == "systemd" and entry[2].startswith("Starting "):
            if current:
                starts.append(current)
            current = []
        if current is not None:
            current.append(entry)
    if current:
        starts.append(current)
    return [
        {**load_phases([message for _time, _writer, message in start]), "timeline": start_timeline(start)}
        for start in starts
    ]


def plan_against_vllm(memory: dict, phases: dict) -> dict:
    """The planner's memory figures for one GPU beside what vLLM reported at its start, and how far each is off
    (plan minus vLLM, in percent of vLLM's)."""
    pairs = {
        "weights_gib": (memory["weights_bytes"] / 2**30, phases.get("weights_gib")),
        "kv_cache_gib": (memory["kv_cache_bytes"] / 2**30, phases.get("kv_cache_gib")),
        "kv_cache_tokens": (memory["kv_cache_tokens"], phases.get("kv_cache_tokens")),
        "max_concurrency": (
            memory["kv_cache_tokens"] / memory["max_model_len"] if memory.get("max_model_len") else None,
            phases.get("max_concurrency"),
        ),
    }
    compared = {}
    for key, (planned, reported) in pairs.items():
        off = round(100 * (planned - reported) / reported, 1) if planned is not None and reported else None
        compared[key] = {"plan": round(planned, 2) if planned is not None else None, "vllm": reported,
                         "off_percent": off}  # fmt: skip
    return compared


def cache_sizes(home: Path = SERVICE_HOME) -> dict:
    """Bytes of each cache under the service's home: ~/.cache/*, each release and entry's compile cache in
    ~/.cache/vllm and vLLM's own directories in it."""
    paths = [*home.glob(".cache/*"), *home.glob(".cache/vllm/*/*"), *home.glob(".cache/vllm/*/*/*")]
    paths += [path for path in (home / ".triton", home / ".nv") if path.exists()]
    sizes = {}
    for path in sorted(paths):
        completed = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False)
        if completed.returncode == 0:
            sizes[str(path.relative_to(home))] = int(completed.stdout.split()[0])
    return sizes


def wait_serving(host: GpuHost, instance: str, timeout: float) -> dict:
    """Poll one completion from the instance until it answers: seconds until then, and the last answer."""
    started = time.monotonic()
    answer = {}
    while time.monotonic() - started < timeout:
        answer = serves(host, instance)
        if answer.get("done"):
            return {"serving_after_s": round(time.monotonic() - started, 2)}
        time.sleep(0.5)
    return {"serving_after_s": None, "last_answer": answer}


def timed_restart(results: Results, host: GpuHost, step: str, name: str, instance: str, args, stop=None) -> dict:
    """Stop the unit of `stop` (default: the instance itself), start the instance's, and wait for its first
    completion, timed from outside; with vLLM's phases of the start and the caches under the service's home after
    it."""
    unit = unit_of(instance)
    since = host.clock()
    started = time.monotonic()
    host.exec("systemctl", "stop", unit_of(stop or instance), timeout=180)
    stopped = time.monotonic()
    host.exec("systemctl", "start", unit, timeout=120)
    serving = wait_serving(host, instance, args.restart_timeout)
    outcome = {
        "stop_s": round(stopped - started, 2),
        "start_to_serving_s": serving["serving_after_s"],
        "restart_s": round(time.monotonic() - started, 2) if serving["serving_after_s"] is not None else None,
        **({"last_answer": serving["last_answer"]} if "last_answer" in serving else {}),
        "starts": starts_of(unit_journal(host, since, unit)),
        "cache_bytes": cache_sizes(),
    }
    results.add(step, name, outcome)
    return outcome


def run_step(results: Results, host: GpuHost, step: str, name: str, playbook: str, *variables, unit=None, **kw):
    outcome = host.play(name, playbook, *variables, **kw)
    kept = summary(outcome)
    if unit:
        kept["vllm_phases"] = phases_of_loads(host, outcome["since"], unit)
        kept["starts"] = starts_of(unit_journal(host, outcome["since"], unit))
    kept["journal"] = scan(host, outcome["since"])
    results.add(step, name, kept)
    return outcome


def unit_of(instance: str) -> str:
    return f"vllm-{instance}.service"


def serves(host: GpuHost, instance: str, key: str | None = None) -> dict:
    """One completion from the instance at its record's URL, with its own key (or `key`)."""
    record = host.record(instance)
    completed = subprocess.run(
        [sys.executable, str(STREAM_CLIENTS), "--one", record["url"], record["served_name"],
         key if key is not None else host.key_of(instance), "8", "The GPU host serves"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    try:
        return json.loads(completed.stdout)
    except ValueError:
        return {"error": completed.stderr.strip()[-400:]}


class Streams:
    """16 streamed completions against an instance, kept going until the server stops taking them."""

    def __init__(self, host: GpuHost, instance: str, name: str, tokens: int):
        record = host.record(instance)
        self.output = host.logs / f"streams-{name}.json"
        self.process = subprocess.Popen(
            [sys.executable, str(STREAM_CLIENTS), record["url"], record["served_name"], host.key_of(instance),
             str(STREAMS), str(tokens), str(self.output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def wait_streaming(self, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        marker = Path(f"{self.output}.streaming")
        while time.monotonic() < deadline and self.process.poll() is None:
            if marker.exists():
                return True
            time.sleep(0.05)
        return marker.exists()

    def outcome(self, timeout: float = 150) -> dict:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return {"error": f"the clients still ran after {timeout} s"}
        records = json.loads(self.output.read_text()) if self.output.exists() else []
        return {
            "requests": len(records),
            "done": sum(1 for record in records if record["done"]),
            "errors": sorted({str(record["error"])[:120] for record in records if record["error"]}),
            "statuses": sorted({record["status"] for record in records if record["status"] is not None}),
        }


def machine_facts() -> dict:
    """What the run's figures depend on: the GPUs and driver, the kernel, the NVIDIA lines of /proc/devices, Yama."""
    facts = {"kernel": os.uname().release}
    completed = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    ) if shutil.which("nvidia-smi") else None  # fmt: skip
    facts["gpus"] = completed.stdout.strip().splitlines() if completed and completed.returncode == 0 else []
    devices = Path("/proc/devices").read_text().splitlines()
    facts["proc_devices_nvidia"] = [line.strip() for line in devices if "nvidia" in line]
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    facts["yama_ptrace_scope"] = scope.read_text().strip() if scope.exists() else None
    facts["nvidia_devices"] = sorted(str(path) for path in Path("/dev").glob("nvidia*"))
    return facts


def gpu_used_mib() -> list:
    if not shutil.which("nvidia-smi"):
        return []
    completed = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return [float(value) for value in completed.stdout.split()] if completed.returncode == 0 else []


# ---- steps --------------------------------------------------------------------------------------------------


def step_weights(results: Results, host: GpuHost, args):
    if not args.weights_from:
        results.add("weights", "skipped", "no --weights-from: the catalog's models are generated on the host")
        return
    started = time.monotonic()
    completed = subprocess.run(
        [args.python, str(HERE / "make_weights.py"), args.weights_from, args.weights_to],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    print(completed.stdout + completed.stderr, flush=True)
    results.add("weights", "written", {"rc": completed.returncode, "seconds": round(time.monotonic() - started, 1),
                                       "path": args.weights_to, "output": completed.stdout.strip()[-600:]})  # fmt: skip
    if completed.returncode:
        raise RuntimeError("the weights were not written")


def step_deploy(results: Results, host: GpuHost, args):
    first = run_step(results, host, "deploy", "first", "deploy.yml", {"model": "host_a"}, unit=unit_of("host_a"))
    if first["rc"]:
        raise RuntimeError("the first deploy failed")
    again = run_step(results, host, "deploy", "second", "deploy.yml", {"model": "host_a"})
    results.add(
        "deploy",
        "second_changed",
        {"changed": again["report"].get("stats", {}), "tasks": changed_tasks(again["report"])},
    )
    results.add("deploy", "serves", serves(host, "host_a"))


def step_bench(results: Results, host: GpuHost, args):
    bench_levels(results, host, "bench", {"model": "host_a"})


def bench_levels(results: Results, host: GpuHost, step: str, *variables):
    """bench.yml at BENCH_LEVELS: vllm_bench's figures per level."""
    outcome = run_step(results, host, step, "levels", "bench.yml", *variables, {"vllm_bench_concurrency": BENCH_LEVELS})
    levels = []
    for result in results_of(outcome["report"], "vllm_bench"):
        for level in result.get("levels") or []:
            levels.append({key: level.get(key) for key in (
                "max_concurrency", "completed", "failed", "output_throughput", "median_ttft_ms", "median_itl_ms",
                "median_tpot_ms", "duration")})  # fmt: skip
    results.add(step, "figures", levels)


def step_stop(results: Results, host: GpuHost, args):
    stop_under_streams(results, host, "stop", "host_a", args)
    run_step(results, host, "stop", "deploy_again", "deploy.yml", {"model": "host_a"}, unit=unit_of("host_a"))


def stop_under_streams(results: Results, host: GpuHost, step: str, instance: str, args):
    """stop.yml of the instance with 16 streams in flight: the stop's phases, the streams' outcome, the GPU memory."""
    streams = Streams(host, instance, step, args.stream_tokens)
    streaming = streams.wait_streaming()
    outcome = run_step(results, host, step, "with_streams", "stop.yml", {"instance": instance})
    results.add(step, "streams", {"streaming_before": streaming, **streams.outcome()})
    results.add(step, "service", [result.get("stop") for result in results_of(outcome["report"], "vllm_service")])
    results.add(step, "gpu_memory_wait", [
        {key: result.get(key) for key in ("elapsed", "gpus", "msg", "terminated")}
        for result in results_of(outcome["report"], "gpu_memory_wait")
    ])  # fmt: skip
    results.add(step, "gpu_used_mib_after", gpu_used_mib())


def engine_core_pid(host: GpuHost, unit: str) -> int | None:
    main = host.exec("systemctl", "show", "-p", "MainPID", "--value", unit).strip()
    for line in host.exec("ps", "-eo", "pid=,ppid=,comm=").splitlines():
        pid, ppid, comm = line.split(None, 2)
        if ppid == main and comm.startswith("VLLM::EngineCor"):
            return int(pid)
    return None


def step_kill(results: Results, host: GpuHost, args):
    unit = unit_of("host_a")
    restarts_before = int(host.exec("systemctl", "show", "-p", "NRestarts", "--value", unit).strip() or 0)
    streams = Streams(host, "host_a", "kill", args.stream_tokens)
    streaming = streams.wait_streaming()
    pid = engine_core_pid(host, unit)
    if pid is None:
        results.add("kill", "error", "no VLLM::EngineCore child of the unit's main process")
        return
    since = host.clock()
    host.exec("kill", "-KILL", str(pid))
    killed = time.monotonic()
    back, state = None, {}
    while time.monotonic() - killed < args.restart_timeout:
        state = dict(
            line.split("=", 1)
            for line in host.exec("systemctl", "show", "-p", "NRestarts", "-p", "ActiveState", "-p", "MainPID", unit)
            .splitlines() if "=" in line
        )  # fmt: skip
        if int(state.get("NRestarts", 0)) > restarts_before and serves(host, "host_a").get("done"):
            back = round(time.monotonic() - killed, 1)
            break
        time.sleep(2)
    results.add("kill", "engine_core", {"pid": pid, "streaming_before": streaming, "serving_again_after_s": back,
                                        "unit": state, "streams": streams.outcome()})  # fmt: skip
    results.add("kill", "vllm_phases_of_the_restart", phases_of_loads(host, since, unit))
    status = run_step(results, host, "kill", "status", "status.yml")
    results.add("kill", "status_table", debug_lines(status["report"], "Show the fleet"))


def step_share(results: Results, host: GpuHost, args):
    """torch's CUDA tensor sharing between two processes, in a unit with the vLLM unit's own sandbox."""
    if not gpu_used_mib():
        results.add("share", "skipped", "no NVIDIA GPU here")
        return
    sandbox = [
        line for line in (UNIT_DIR / unit_of("host_a")).read_text().splitlines()
        if re.match(r"(User|Group|NoNewPrivileges|Capability|Ambient|Protect|ReadWritePaths|Private|Device|Restrict"
                    r"|Lock|SystemCall|UMask)", line)
    ]  # fmt: skip
    probe = Path("/var/lib/vllm/llmops-cuda-share.py")
    probe.write_text((HERE / "cuda_share.py").read_text())
    probe.chmod(0o644)
    record = host.record("host_a")
    cases = {
        "default_filter": ("expandable_segments:False", []),
        "expandable_segments": ("expandable_segments:True", []),
        "expandable_segments_with_pidfd_getfd": ("expandable_segments:True", ["SystemCallFilter=pidfd_getfd"]),
    }
    for name, (allocator, extra) in cases.items():
        unit = UNIT_DIR / "llmops-cuda-share.service"
        unit.write_text("\n".join([
            "[Service]", "Type=oneshot", "WorkingDirectory=/var/lib/vllm", "Environment=HOME=/var/lib/vllm",
            f"Environment=PYTORCH_CUDA_ALLOC_CONF={allocator}",
            f"ExecStart={record['python']} {probe}", *sandbox, *extra, "",
        ]))  # fmt: skip
        since = host.clock()
        host.exec("systemctl", "daemon-reload")
        host.exec("systemctl", "start", "llmops-cuda-share.service", check=False, timeout=180)
        lines = host.journal(since, "llmops-cuda-share.service")
        verdicts = [line for line in lines if line.startswith("SHARE ")]
        results.add("share", name, {"allocator": allocator, "extra": extra, "verdicts": verdicts,
                                    "errors": [line for line in lines if "Error" in line][:4]})  # fmt: skip
    unit.unlink()
    host.exec("systemctl", "daemon-reload")


def run_swap(results: Results, host: GpuHost, name: str, *variables, unit=None, step="swap") -> dict:
    """swap.yml, with the swap's own account of its time beside the runner's split: its downtime in parts, and a
    rollback's own seconds, from its start (right after the failed step) until the old model serves again."""
    outcome = run_step(results, host, step, name, "swap.yml", *variables, unit=unit)
    account = fact_of(outcome["report"], "vllm_swap_result") or {}
    keys = ("result", "mode", "seconds", "downtime", "stop", "memory_wait", "load", "rollback", "overhead", "prefetch")
    results.add(step, f"{name}_account", {key: account.get(key) for key in keys})
    return outcome


def service_messages(outcome: dict) -> list:
    """The last messages of vllm_service in a playbook's run: a failed swap's cause and its rollback."""
    return [result.get("msg") for result in results_of(outcome["report"], "vllm_service")][-3:]


def step_swap(results: Results, host: GpuHost, args):
    run_swap(results, host, "by_stop", {"model": "host_b"}, unit=unit_of("host_b"))
    results.add("swap", "by_stop_serves", serves(host, "host_b"))
    if not args.sleep:
        results.add("swap", "by_sleep", "skipped: this host's build of vLLM has no sleep mode (--no-sleep)")
        run_swap(results, host, "back_by_stop", {"model": "host_a"}, unit=unit_of("host_a"))
        broken = run_swap(results, host, "broken_by_stop", {"model": "host_broken"})
    else:
        # An instance that sleeps keeps its port: each new one takes a port of its own.
        sleep = {"vllm_swap_mode": "sleep"}
        back = {"model": "host_a", "vllm_swap_port": 8001}
        run_swap(results, host, "back_by_sleep", back, sleep, unit=unit_of("host_a"))
        broken = {"model": "host_broken", "vllm_swap_port": 8002}
        broken = run_swap(results, host, "broken_by_sleep", broken, sleep)
    results.add("swap", "broken_result", service_messages(broken))
    results.add("swap", "old_serves_with_its_key", serves(host, "host_a"))


def step_tune(results: Results, host: GpuHost, args):
    """tune.yml of host_a as it serves; then, with host_b swapped in on its port, a tune of host_a that is refused
    before any change (the candidates would stop host_b and the tune would never start it again)."""
    report_dir = host.logs / "tune"
    tune = {
        "model": "host_a",
        "vllm_tune_layouts": ["default", {"tensor_parallel_size": 3}],
        "vllm_tune_grid": {"max_num_seqs": [16, 64], "max_num_batched_tokens": [32]},
        "vllm_tune_bench_concurrency": [1, 8],
        "vllm_tune_bench_num_requests": 16,
        "vllm_tune_bench_output_len": 64,
        "vllm_tune_report_dir": str(report_dir),
        "vllm_tune_fresh": True,
    }
    if not serves(host, "host_a").get("done"):
        # After the rollout step host_b serves in host_a's place.
        run_step(results, host, "tune", "host_a_in_place", "swap.yml", {"model": "host_a"}, unit=unit_of("host_a"))
    outcome = run_step(results, host, "tune", "tune", "tune.yml", tune, unit=unit_of("host_a-tune"))
    reports = sorted(report_dir.glob("*.json"))
    if reports:
        data = json.loads(reports[0].read_text())
        results.add("tune", "candidates", [
            {key: row.get(key) for key in ("name", "verdict", "reason", "load_s")} for row in data.get("candidates", [])
        ])  # fmt: skip
        results.add("tune", "winner", data.get("winner"))
    results.add("tune", "serves_after", serves(host, "host_a"))
    run_step(results, host, "tune", "host_b_in_place", "swap.yml", {"model": "host_b"}, unit=unit_of("host_b"))
    refused = {**tune, "vllm_tune_report_dir": str(host.logs / "tune-refused")}
    run_step(results, host, "tune", "refused_while_host_b_serves", "tune.yml", refused)
    results.add("tune", "host_b_serves_after_the_refusal", serves(host, "host_b"))
    return outcome


GATE_METRIC_FIELDS = (
    "name",
    "decision",
    "change_percent",
    "interval_percent",
    "rounds",
    "spread",
    "serial_correlation",
    "effective_rounds",
    "reference",
    "candidate",
)
# Both instances on the one GPU (0.4 of it each), the old one serving until the new one has passed its gate.
ROLLOUT_GATE = {
    "vllm_swap_mode": "beside",
    "vllm_swap_gate_num_requests": 32,
    "vllm_swap_gate_output_len": 64,
}


def step_rollout(results: Results, host: GpuHost, args):
    """rollout.yml of the one host to host_b (the same weights, another name: neutral), beside host_a: the gate
    measures both in the same rounds."""
    gated_rollout(results, host, args, "neutral", "host_b", replace="host_a", port=8001)


def step_rollout_regression(results: Results, host: GpuHost, args):
    """rollout.yml to host_slow (one sequence at a time: a regression), beside whichever of host_b (port 8001, the
    neutral rollout passed) and host_a (port 8000, it rolled back) serves, on the other port; gated as step_rollout
    is."""
    serving = "host_b" if service_started(host, "host_b") else "host_a"
    port = 8000 if serving == "host_b" else 8001
    gated_rollout(results, host, args, "regression", "host_slow", replace=serving, port=port)


def step_rollout_back(results: Results, host: GpuHost, args):
    """rollout.yml from host_b back to host_a (neutral again), gated as step_rollout is."""
    gated_rollout(results, host, args, "back", "host_a", replace="host_b", port=8000)


def gated_rollout(results: Results, host: GpuHost, args, name: str, model: str, replace: str, port: int):
    gate = {
        **ROLLOUT_GATE,
        "vllm_swap_replace": replace,
        "vllm_swap_port": port,
        "vllm_swap_gate_smallest_regression_percent": args.gate_percent,
        "vllm_swap_gate_max_rounds": args.gate_rounds,
    }
    served_before = service_started(host, replace)
    outcome = run_step(results, host, "rollout", name, "rollout.yml", {"model": model}, gate, unit=unit_of(model))
    # Beside: the old instance's process never restarted, whatever the gate answered.
    restarted = {"before": served_before, "after": service_started(host, replace)}
    results.add("rollout", f"{name}_old_instance_started_at", restarted)
    results.add(
        "rollout", f"{name}_gates", [gate_figures(result) for result in results_of(outcome["report"], "vllm_gate")]
    )
    results.add("rollout", f"{name}_summary", debug_lines(outcome["report"], "Show the rollout"))
    # Swapped, the new model serves; rolled back, the old one does.
    results.add(
        "rollout", f"after_{name}_serves", {model: serves(host, model) for model in ("host_a", "host_b", model)}
    )


def service_started(host: GpuHost, instance: str) -> str:
    """When the instance's main process last started, as systemd says (empty when it is not running)."""
    return host.exec("systemctl", "show", "-P", "ExecMainStartTimestamp", unit_of(instance)).strip()


def gate_figures(result: dict) -> dict:
    """What a vllm_gate task answered: the old instance's rounds recorded, or the new one's decision."""
    metrics = [{key: metric.get(key) for key in GATE_METRIC_FIELDS} for metric in result.get("metrics") or []]
    figures = {key: result.get(key) for key in ("mode", "decision", "rounds", "seconds", "seconds_per_round", "spread")}
    return {**figures, "metrics": metrics, "sentence": result.get("sentence") or result.get("msg")}


def step_end(results: Results, host: GpuHost, args):
    run_step(results, host, "end", "stop_all", "stop.yml")
    # The whole journal of the run, for the record (the alarms of each run are in the results already).
    (host.logs / "journal.txt").write_text(host.exec("journalctl", "--no-pager", "-o", "short-iso", check=False))
    results.add("end", "units", host.exec("systemctl", "list-units", "--all", "--no-pager", "vllm-*", check=False))
    results.add("end", "gpu_used_mib", gpu_used_mib())


PROBE_IMPORTS = """
import json, time
started = time.monotonic()
import torch
imported = time.monotonic()
if torch.cuda.is_available():
    torch.zeros(1, device="cuda")
cuda = time.monotonic()
import vllm.entrypoints.openai.api_server
print(json.dumps({"import_torch_s": round(imported - started, 2), "cuda_first_tensor_s": round(cuda - imported, 2),
                  "import_vllm_api_server_s": round(time.monotonic() - cuda, 2)}))
"""
PROBE_BYTECODE = """
import importlib.util, json, os, sys
found = {}
for name in ("torch", "vllm", "transformers", "triton"):
    spec = importlib.util.find_spec(name)
    if spec is None:
        continue
    root = list(spec.submodule_search_locations)[0]
    sources = compiled = 0
    for directory, _directories, files in os.walk(root):
        sources += sum(file.endswith(".py") for file in files)
        if os.path.basename(directory) == "__pycache__":
            compiled += sum(file.endswith("." + sys.implementation.cache_tag + ".pyc") for file in files)
    found[name] = {"root": root, "sources": sources, "compiled": compiled, "root_may_write": os.access(root, os.W_OK),
                   "read_only_filesystem": bool(os.statvfs(root).f_flag & os.ST_RDONLY)}
print(json.dumps(found))
"""


def importtime_summary(text: str, top: int = 15) -> dict:
    """`python -X importtime` output: the total of the modules' own times, the slowest top-level imports by their
    cumulative time, and the own times summed by top-level package."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|", 2)
        rows.append((int(own), int(cumulative), name.rstrip()))
    packages = {}
    for own, _cumulative, name in rows:
        package = name.strip().split(".")[0]
        packages[package] = packages.get(package, 0) + own
    top_level = sorted((row for row in rows if not row[2].startswith("  ")), key=lambda row: -row[1])
    return {
        "modules": len(rows),
        "total_own_s": round(sum(row[0] for row in rows) / 1e6, 2),
        "top_level_cumulative_s": {
            name.strip(): round(cumulative / 1e6, 2) for _own, cumulative, name in top_level[:top]
        },
        "own_s_by_package": {
            name: round(own / 1e6, 2) for name, own in sorted(packages.items(), key=lambda item: -item[1])[:top]
        },
    }


def step_probe(results: Results, host: GpuHost, args):
    """What one Python start of vLLM costs on this host, outside the unit, as root; writes no bytecode."""
    python = host.record("host_a")["python"]
    environment = os.environ | {"PYTHONDONTWRITEBYTECODE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}

    def timed(*command, timeout=300):
        started = time.monotonic()
        completed = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout,
                                   check=False)  # fmt: skip
        return completed, round(time.monotonic() - started, 2)

    _completed, bare = timed(python, "-c", "pass")
    results.add("probe", "interpreter_alone_s", bare)
    for attempt in (1, 2):
        completed, seconds = timed(python, "-c", PROBE_IMPORTS)
        last = completed.stdout.strip().splitlines()[-1:] or ["{}"]
        phases = json.loads(last[0] if last[0].startswith("{") else "{}")
        results.add(
            "probe",
            f"imports_{attempt}",
            {"seconds": seconds, "rc": completed.returncode, **phases, "stderr": completed.stderr.strip()[-300:]},
        )
    completed, seconds = timed(python, "-X", "importtime", "-c", "import vllm.entrypoints.openai.api_server")
    (host.logs / "importtime.txt").write_text(completed.stderr)
    results.add("probe", "importtime", {"seconds": seconds, **importtime_summary(completed.stderr)})
    completed, _seconds = timed(python, "-c", PROBE_BYTECODE)
    bytecode = json.loads(completed.stdout or "{}")
    results.add("probe", "bytecode", bytecode)
    mounts = {}
    for name, found in bytecode.items():
        listed = subprocess.run(["findmnt", "-n", "-o", "TARGET,SOURCE,FSTYPE,OPTIONS", "-T", found["root"]],
                                capture_output=True, text=True, check=False)  # fmt: skip
        mounts[name] = listed.stdout.strip()
    results.add("probe", "mounts", mounts)
    library = next(
        iter(Path(bytecode.get("torch", {}).get("root", "/nonexistent"), "lib").glob("libtorch_cuda.so")), None
    )
    if library:
        reads = []
        for _attempt in (1, 2):
            started = time.monotonic()
            subprocess.run(["cat", str(library)], stdout=subprocess.DEVNULL, check=False)
            reads.append(round(time.monotonic() - started, 2))
        results.add("probe", "read_libtorch_cuda", {"bytes": library.stat().st_size, "seconds": reads})
    if shutil.which("nvidia-smi"):
        completed, _seconds = timed(
            "nvidia-smi", "--query-gpu=persistence_mode,driver_version", "--format=csv,noheader"
        )
        results.add("probe", "persistence_mode", completed.stdout.strip())


# The modules a start imports, in order, each timed beyond the ones before: the API server's, then what its
# engine process (forked or spawned from it) imports before its first line.
PROBE_ENGINE_IMPORTS = """
import json, time
seconds, last = {}, time.monotonic()
for name in ("torch", "vllm.entrypoints.openai.api_server", "vllm.v1.engine.core", "vllm.v1.executor.uniproc_executor",
             "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner"):
    __import__(name)
    seconds[name], last = round(time.monotonic() - last, 2), time.monotonic()
print(json.dumps(seconds))
"""
# Flags of `vllm serve` that belong to the API server alone, each with its value: `vllm bench startup` takes the
# engine's arguments only.
API_SERVER_FLAGS = ("--host", "--port", "--api-key", "--middleware")


def engine_arguments(argv: list[str]) -> list[str]:
    """The engine's arguments of the server's argv (`python -m vllm.entrypoints.openai.api_server --model ...`): its
    flags, without the API server's own."""
    first_flag = next((index for index, argument in enumerate(argv) if argument.startswith("--")), len(argv))
    return without_flags(argv[first_flag:], API_SERVER_FLAGS)


def unit_environment(host: GpuHost, instance: str) -> dict:
    """The variables the instance's unit starts with (Environment= and its EnvironmentFile), without the API key."""
    found = parse_environment_assignments(host.exec("systemctl", "show", "-P", "Environment", unit_of(instance)))
    secrets_of = host.record(instance)["secrets"]
    found |= parse_environment_file(Path(secrets_of["environment_file"]).read_text())
    found.pop(secrets_of["api_key_variable"], None)
    return found


def bench_startup(results: Results, host: GpuHost, step: str, instance: str, iterations: dict, timeout: int):
    """vLLM's own `vllm bench startup` with the unit's engine arguments and environment, as root outside the unit;
    the unit's compile cache copied first, so that the warm iterations read what the unit left and write nothing
    of the unit's."""
    unit = unit_of(instance)
    python = host.record(instance)["python"]
    environment = unit_environment(host, instance)
    cache_root = environment.get("VLLM_CACHE_ROOT")
    scratch = Path(f"/tmp/bench-startup-{instance}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    if cache_root and Path(cache_root).is_dir():
        shutil.copytree(cache_root, scratch / "cache")
        environment = {name: value.replace(cache_root, str(scratch / "cache")) for name, value in environment.items()}
    # Root writes nothing under the service's home: no bytecode, and a home of its own.
    environment |= {"PYTHONDONTWRITEBYTECODE": "1", "HOME": str(scratch)}
    output = host.logs / f"bench-startup-{instance}.json"
    serve_argv = unit_file_exec_start((UNIT_DIR / unit).read_text())
    command = [python, "-m", "vllm.entrypoints.cli.main", "bench", "startup", *engine_arguments(serve_argv),
               "--output-json", str(output)]  # fmt: skip
    for name, count in iterations.items():
        command += [f"--num-iters-{name}", str(count)]
    started = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, env=os.environ | environment,
                               timeout=timeout, check=False)  # fmt: skip
    (host.logs / f"bench-startup-{instance}.log").write_text(completed.stdout + completed.stderr)
    outcome = {"rc": completed.returncode, "seconds": round(time.monotonic() - started, 1), "command": command[1:],
               "environment": environment, "iterations": iterations}  # fmt: skip
    if output.exists():
        outcome["result"] = {key: value for key, value in json.loads(output.read_text()).items()
                             if not key.endswith("_percentiles")}  # fmt: skip
    else:
        outcome["output_tail"] = (completed.stdout + completed.stderr)[-1500:]
    results.add(step, "bench_startup", outcome)
    shutil.rmtree(scratch, ignore_errors=True)


def journal_lines(entries: list[tuple[float, str, str]], last: int = 120) -> list[str]:
    """The last start in a unit's journal, line by line, each with its seconds from systemd's `Started`."""
    starts = [index for index, (_time, writer, message) in enumerate(entries)
              if writer == "systemd" and message.startswith("Started ")]  # fmt: skip
    if not starts:
        return []
    origin = entries[starts[-1]][0]
    return [f"{time_ - origin:7.2f} {message[:220]}" for time_, _writer, message in entries[starts[-1] :][:last]]


def step_startup_a(results: Results, host: GpuHost, args):
    """host_a's start, line by line; the engine process's imports; vLLM's own start-up benchmark beside it."""
    unit = unit_of("host_a")
    deployed = run_step(results, host, "startup_a", "deploy", "deploy.yml", {"model": "host_a"}, unit=unit)
    if deployed["rc"]:
        raise RuntimeError("the deploy of host_a failed")
    since = host.clock()
    timed_restart(results, host, "startup_a", "restart", "host_a", args)
    results.add("startup_a", "restart_journal", journal_lines(unit_journal(host, since, unit)))
    # The bytecode the unit reads, read and not written, as root.
    bytecode = unit_environment(host, "host_a").get("PYTHONPYCACHEPREFIX")
    environment = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
    if bytecode:
        environment["PYTHONPYCACHEPREFIX"] = bytecode
    for attempt in (1, 2):
        completed = subprocess.run([host.record("host_a")["python"], "-c", PROBE_ENGINE_IMPORTS], capture_output=True,
                                   text=True, env=environment, timeout=300, check=False)  # fmt: skip
        last = (completed.stdout.strip().splitlines() or ["{}"])[-1]
        seconds = json.loads(last) if last.startswith("{") else {}
        results.add("startup_a", f"imports_{attempt}",
                    {"rc": completed.returncode, **seconds, "stderr": completed.stderr[-300:]})  # fmt: skip
    host.exec("systemctl", "stop", unit, timeout=180)
    bench_startup(results, host, "startup_a", "host_a", {"cold": 2, "warmup": 1, "warm": 2}, timeout=560)


def step_startup_seed(results: Results, host: GpuHost, args):
    """`vllm bench startup` of the seed-shaped model: one cold start, one warm from the unit's compile cache."""
    host.exec("systemctl", "stop", unit_of("seed"), timeout=180)
    bench_startup(results, host, "startup_seed", "seed", {"cold": 1, "warmup": 0, "warm": 1}, timeout=560)


def plan_of(report: dict) -> dict | None:
    """The memory plan of the last vllm_plan result of a run (the preflight's, on this host's GPUs)."""
    plans = [result.get("memory") for result in results_of(report, "vllm_plan") if result.get("memory")]
    return plans[-1] if plans else None


def compare_plan(results: Results, step: str, outcome: dict, starts: list):
    memory = plan_of(outcome["report"])
    if memory is None or not starts:
        results.add(step, "plan_against_vllm", {"error": "no plan or no start in the journal"})
        return
    results.add(step, "plan", memory)
    results.add(step, "plan_against_vllm", plan_against_vllm(memory, starts[-1]))


def step_start_a(results: Results, host: GpuHost, args):
    """host_a's first start (a cold disk on a fresh machine), then restarts timed from outside, interleaved with
    host_a_pyc's: host_a, host_a_pyc, host_a, host_a_pyc."""
    unit = unit_of("host_a")
    first = run_step(results, host, "start_a", "deploy_cold", "deploy.yml", {"model": "host_a"}, unit=unit)
    if first["rc"]:
        raise RuntimeError("the first deploy of host_a failed")
    compare_plan(results, "start_a", first, starts_of(unit_journal(host, first["since"], unit)))
    results.add("start_a", "cache_bytes_after_first_start", cache_sizes())
    timed_restart(results, host, "start_a", "restart_1", "host_a", args)
    # One GPU holds one instance at a time (the preflight refuses two on a GPU): host_a stops first.
    host.exec("systemctl", "stop", unit, timeout=180)
    pyc = run_step(results, host, "start_a", "deploy_pyc_first", "deploy.yml", {"model": "host_a_pyc"},
                   unit=unit_of("host_a_pyc"))  # fmt: skip
    if pyc["rc"]:
        raise RuntimeError("the first deploy of host_a_pyc failed")
    timed_restart(results, host, "start_a", "restart_pyc_1", "host_a_pyc", args)
    timed_restart(results, host, "start_a", "switch_to_a_2", "host_a", args, stop="host_a_pyc")
    timed_restart(results, host, "start_a", "switch_to_pyc_2", "host_a_pyc", args, stop="host_a")
    host.exec("systemctl", "stop", unit_of("host_a_pyc"), timeout=180)


def step_start_seed(results: Results, host: GpuHost, args):
    """The seed-shaped model: its config on the host, a first start with an empty compile cache, the planner beside
    vLLM, then a restart with the cache that the first start left; every unit stopped after."""
    if args.seed_from:
        completed = subprocess.run(
            [args.python, str(HERE / "make_seed_model.py"), args.seed_from, args.weights_from, args.seed_to],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        results.add("start_seed", "model", {"rc": completed.returncode, "output": completed.stdout.strip()[-400:],
                                            "stderr": completed.stderr.strip()[-400:]})  # fmt: skip
        if completed.returncode:
            raise RuntimeError("the seed-shaped model's config was not written")
    # Cold means no compile cache, here or in the store: whatever an earlier run left goes first.
    results.add("start_seed", "cache_bytes_removed_before", cache_sizes())
    shutil.rmtree(SERVICE_HOME / ".cache" / "vllm", ignore_errors=True)
    shutil.rmtree(COMPILE_CACHE_STORE, ignore_errors=True)
    unit = unit_of("seed")
    first = run_step(results, host, "start_seed", "deploy_cold", "deploy.yml", SEED_WITH_STORE, unit=unit,
                     timeout=1200)  # fmt: skip
    compare_plan(results, "start_seed", first, starts_of(unit_journal(host, first["since"], unit)))
    results.add("start_seed", "cache_bytes_after_first_start", cache_sizes())
    results.add("start_seed", "compile_lines", compile_lines(host, first["since"], unit))
    if first["rc"]:
        raise RuntimeError("the first deploy of the seed-shaped model failed")
    results.add("start_seed", "store", stored_archives())
    results.add("start_seed", "serves", serves(host, "seed"))
    run_step(results, host, "start_seed", "stop_all", "stop.yml")


def step_fleet_seed(results: Results, host: GpuHost, args):
    """This host as another host of the fleet that has never run the seed-shaped model: the seed's compile cache and
    vLLM's answer about its class gone (what other entries left stays, and so does the bytecode under the home, as
    on a host whose packages were installed with theirs), the archive that start_seed published in the store;
    deploy.yml unpacks it before the unit starts."""
    if not stored_archives():
        raise RuntimeError("the compile cache store holds no archive: run start_seed first")
    unit = unit_of("seed")
    host.exec("systemctl", "stop", unit, timeout=180)
    caches = SERVICE_HOME / ".cache" / "vllm"
    for entry in caches.glob("*/seed"):
        shutil.rmtree(entry)
    for answer in caches.glob(f"*/modelinfos/*{SEED_ARCHITECTURE}*"):
        answer.unlink()
    outcome = run_step(results, host, "fleet_seed", "deploy_with_store", "deploy.yml", SEED_WITH_STORE, unit=unit,
                       timeout=900)  # fmt: skip
    unpacked = [result.get("msg") for result in results_of(outcome["report"], "vllm_compile_cache")]
    results.add("fleet_seed", "compile_cache_module", unpacked)
    results.add("fleet_seed", "compile_lines", compile_lines(host, outcome["since"], unit))
    results.add("fleet_seed", "cache_bytes", cache_sizes())
    if outcome["rc"]:
        raise RuntimeError("the deploy of the seed-shaped model with the store failed")
    results.add("fleet_seed", "serves", serves(host, "seed"))
    run_step(results, host, "fleet_seed", "stop_all", "stop.yml")


def deploy_seed(results: Results, host: GpuHost, step: str) -> str:
    """deploy.yml of the seed-shaped model with the compile cache store; its unit."""
    unit = unit_of("seed")
    deployed = run_step(results, host, step, "deploy", "deploy.yml", SEED_WITH_STORE, unit=unit, timeout=900)
    if deployed["rc"]:
        raise RuntimeError("the deploy of the seed-shaped model failed")
    return unit


def seed_swap_settings(args) -> tuple[dict, dict]:
    """The compile cache store and the swap's mode of the seed's swaps. A sleeping instance keeps its port: each new
    one takes a port of its own. An instance without sleep mode is stopped instead (each swap's account says which)."""
    store = {key: value for key, value in SEED_WITH_STORE.items() if key != "model"}
    mode = {"vllm_swap_mode": "sleep", "vllm_swap_sleep_fallback": True} if args.sleep else {}
    return store, mode


def step_serve_seed(results: Results, host: GpuHost, args):
    """The seed-shaped model through the playbooks that host_a's steps run: deploy.yml (with the compile cache that
    start_seed left), bench.yml at C = 1, 8, 32, 128, swap.yml by sleep to host_a and back to the seed. Every load of
    this step is of random weights (vllm_server_load_format is the host's), host_a's too."""
    unit = deploy_seed(results, host, "serve_seed")
    bench_levels(results, host, "serve_seed", {"model": "seed"})
    store, mode = seed_swap_settings(args)
    run_swap(results, host, "to_a", {"model": "host_a", "vllm_swap_port": 8001}, store, mode, unit=unit_of("host_a"),
             step="serve_seed")  # fmt: skip
    results.add("serve_seed", "to_a_serves", serves(host, "host_a"))
    run_swap(results, host, "back_to_seed", {"model": "seed", "vllm_swap_port": 8002}, store, mode, unit=unit,
             step="serve_seed")  # fmt: skip
    results.add("serve_seed", "back_to_seed_serves", serves(host, "seed"))


def step_fail_seed(results: Results, host: GpuHost, args):
    """The seed-shaped model deployed (its compile cache in place: start_seed first), swap.yml to host_broken, rolled
    back by waking the seed, then stop.yml with 16 streams in flight."""
    deploy_seed(results, host, "fail_seed")
    store, mode = seed_swap_settings(args)
    broken = run_swap(results, host, "to_broken", {"model": "host_broken", "vllm_swap_port": 8003}, store, mode,
                      step="fail_seed")  # fmt: skip
    results.add("fail_seed", "broken_result", service_messages(broken))
    results.add("fail_seed", "seed_serves_after_the_rollback", serves(host, "seed"))
    stop_under_streams(results, host, "fail_seed", "seed", args)


def step_seed_disk(results: Results, host: GpuHost, args):
    """The seed's shape with real FP8 weights on disk (SEED_DISK_LAYERS layers, written here once): a first start
    from a cold page cache; swap.yml by stop to host_a; the weights out of the page cache again, and swap.yml back by
    stop with the prefetch, which reads them while host_a serves."""
    target = Path(args.seed_disk_to)
    if args.seed_from:
        command = [args.python, str(HERE / "make_seed_model.py"), args.seed_from, args.weights_from, str(target),
                   "--layers", str(SEED_DISK_LAYERS), "--weights"]  # fmt: skip
        started = time.monotonic()
        completed = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        seconds = round(time.monotonic() - started, 1)
        results.add("seed_disk", "weights", {"rc": completed.returncode, "seconds": seconds,
                                             "output": completed.stdout.strip()[-400:],
                                             "stderr": completed.stderr.strip()[-400:]})  # fmt: skip
        if completed.returncode:
            raise RuntimeError("the seed's weights were not written")
    unit = unit_of("seed_disk")
    results.add("seed_disk", "evicted_before_cold", evict(target))
    cold = run_step(results, host, "seed_disk", "deploy_cold", "deploy.yml", {"model": "seed_disk"}, unit=unit,
                    timeout=900)  # fmt: skip
    compare_plan(results, "seed_disk", cold, starts_of(unit_journal(host, cold["since"], unit)))
    if cold["rc"]:
        raise RuntimeError("the deploy of the seed's shape with weights on disk failed")
    results.add("seed_disk", "serves", serves(host, "seed_disk"))
    run_swap(results, host, "to_a", {"model": "host_a", "vllm_swap_prefetch": False}, unit=unit_of("host_a"),
             step="seed_disk")  # fmt: skip
    results.add("seed_disk", "evicted_before_prefetch", evict(target))
    run_swap(results, host, "back_with_prefetch", {"model": "seed_disk", "vllm_swap_prefetch": True}, unit=unit,
             step="seed_disk")  # fmt: skip
    results.add("seed_disk", "serves_after_the_swap", serves(host, "seed_disk"))
    run_step(results, host, "seed_disk", "stop_all", "stop.yml")


def evict(path: Path) -> dict:
    """Drop the page cache of every file under `path` (posix_fadvise DONTNEED, as memory pressure would), and say
    how much of it stays resident (fincore), as before a swap on a host whose memory went to other work."""
    for file in (item for item in path.rglob("*") if item.is_file()):
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())  # dirty pages stay cached until written
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    files = [str(item) for item in path.rglob("*.safetensors")]
    if not shutil.which("fincore"):
        return {"resident_bytes": None, "bytes": sum(Path(file).stat().st_size for file in files)}
    listed = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE", *files], capture_output=True, text=True,
                            check=False)  # fmt: skip
    resident = [line.split() for line in listed.stdout.splitlines() if line.strip()]
    return {
        "resident_bytes": sum(int(res) for res, _size in resident),
        "bytes": sum(int(size) for _res, size in resident),
    }


def step_prefetch(results: Results, host: GpuHost, args):
    """host_a serving, its weights out of the page cache; swap.yml to host_b (the same files) by stop without the
    prefetch; then out of the page cache again, and back to host_a with it."""
    weights = Path(args.weights_to)
    run_step(results, host, "prefetch", "deploy_a", "deploy.yml", {"model": "host_a"}, unit=unit_of("host_a"))
    results.add("prefetch", "evicted_before_without", evict(weights))
    run_swap(results, host, "to_b_without_prefetch", {"model": "host_b", "vllm_swap_prefetch": False},
             unit=unit_of("host_b"), step="prefetch")  # fmt: skip
    results.add("prefetch", "evicted_before_with", evict(weights))
    run_swap(results, host, "to_a_with_prefetch", {"model": "host_a", "vllm_swap_prefetch": True},
             unit=unit_of("host_a"), step="prefetch")  # fmt: skip
    results.add("prefetch", "serves", serves(host, "host_a"))
    run_step(results, host, "prefetch", "stop_all", "stop.yml")


def stored_archives() -> list[dict]:
    return [{"name": path.name, "bytes": path.stat().st_size} for path in sorted(COMPILE_CACHE_STORE.glob("*.tar.gz"))]


def compile_lines(host: GpuHost, since: float, unit: str) -> list[str]:
    """The journal's lines of compilation, compiled graphs loaded and DeepGEMM's warm-up (its last progress line
    gives its time), since `since`."""
    lines = [line for line in host.journal(since, unit) if COMPILE_LINES.search(line)]
    return [line[-300:] for line in lines][-12:]


# ---- report -------------------------------------------------------------------------------------------------


def markdown(data: dict) -> str:
    lines = [
        "# ansible-playbook on the GPU host",
        "",
        f"Host: `{json.dumps(data.get('host', {}), sort_keys=True)}`",
        "",
    ]
    columns = ["step", "run", "playbook", "rc", "wall s", "load s", "stop s", "sleep+wake s", "bench s", "GPU wait s"]
    columns += ["Ansible s", "vLLM phases", "alarms"]
    lines += ["| " + " | ".join(columns) + " |", "| --- | --- | --- |" + " ---: |" * 8 + " --- | --- |"]
    for step, runs in data.get("runs", {}).items():
        for name, run in runs.items():
            if not isinstance(run, dict) or "wall_s" not in run:
                continue
            phases = "; ".join(
                ", ".join(f"{key.removesuffix('_s')} {value:g}" for key, value in load.items() if key.endswith("_s"))
                for load in run.get("vllm_phases", [])
            )
            alarms = ", ".join(
                f"{key} {value['count']}" for key, value in run.get("journal", {}).items() if value["count"]
            )
            lines.append(
                f"| {step} | {name} | {run['playbook']} | {run['rc']} | {run['wall_s']} | {run['load_s']} | "
                f"{run['stop_s']} | {round(run['sleep_s'] + run['wake_s'], 2)} | {run['bench_s']} | "
                f"{run['gpu_wait_s']} | {run['ansible_s']} | {phases or '-'} | {alarms or 'none'} |"
            )
    return "\n".join(lines) + "\n"


def publish(results: Results, logs: Path, out: Path):
    """The results, their table and the logs (one file: what comes back from a GPU command is a few files)."""
    (logs / "gpu-host-run.md").write_text(markdown(results.data))
    for name in ("gpu-host-run.json", "gpu-host-run.md"):
        shutil.copyfile(logs / name, out / name)
    with tarfile.open(out / "gpu-host-logs.tgz", "w:gz") as archive:
        archive.add(logs, arcname="logs", filter=lambda item: None if item.name.endswith(SECRETS_FILE) else item)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inventory", required=True, help="the GPU host's inventory (inventories/gpu-host)")
    parser.add_argument("--catalog", required=True, help="the catalog of host_a, host_b, host_broken, host_slow")
    parser.add_argument("--out", required=True, type=Path, help="where the results go ($OUT of a GPU command)")
    parser.add_argument(
        "--logs",
        type=Path,
        default=Path("/var/lib/llmops-gpu-host/run-logs"),
        help="the playbooks' JSON, the streams' records, the tune's report (packed into OUT)",
    )
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {','.join(STEPS)}")
    parser.add_argument("--python", default=sys.executable, help="the Python with torch, for make_weights.py")
    parser.add_argument("--weights-from", default="", help="the model directory (config, tokenizer) to give weights")
    parser.add_argument("--weights-to", default="/var/lib/llmops-gpu-host/models/llama-1b")
    parser.add_argument("--seed-from", default="", help="MiniMax-M2.5's config.json, for the seed-shaped model")
    parser.add_argument("--seed-to", default="/var/lib/llmops-gpu-host/models/minimax-m25-16l")
    parser.add_argument("--seed-disk-to", default="/var/lib/llmops-gpu-host/models/minimax-m25-4l")
    parser.add_argument("--no-sleep", dest="sleep", action="store_false", help="the build has no sleep mode (CPU)")
    parser.add_argument("--restart-timeout", type=float, default=300)
    # Enough to be streaming through a stop; within the catalog's max_model_len (the CPU catalog's tiny: 2048).
    parser.add_argument("--stream-tokens", type=int, default=3000, help="tokens each of the 16 streams asks for")
    parser.add_argument(
        "--gate-percent", type=float, default=10.0, help="the smallest regression that the rollout gate rolls back"
    )
    parser.add_argument("--gate-rounds", type=int, default=40, help="the rollout gate's rounds at most")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    steps = [step for step in args.steps.split(",") if step]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {list(STEPS)}")
    host = GpuHost(args)
    meta = {"inventory": args.inventory, "catalog": args.catalog}
    results = Results(args.logs, meta | machine_facts(), steps)
    os.chdir(ROOT)
    functions = {name: globals()[f"step_{name}"] for name in STEPS}
    try:
        for step in STEPS:
            if step not in steps:
                continue
            started = time.monotonic()
            print(f"[{now()}] == {step}", flush=True)
            try:
                functions[step](results, host, args)
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as error:
                results.add(step, "error", f"{type(error).__name__}: {error}")
                if step in ("weights", "deploy"):
                    break
            finally:
                results.add(step, "step_s", round(time.monotonic() - started, 1))
                publish(results, args.logs, args.out)
    finally:
        publish(results, args.logs, args.out)


if __name__ == "__main__":
    main()
