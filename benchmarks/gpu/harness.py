# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's own code against a real vLLM on a host without systemd: the GPU machine (README.md here).

Every server is started from the command line and environment that the collection renders for the catalog
entry (benchmarks/models/gpu_tinyllama.yml by default): `serve_spec` and `build_serve_args` for the command
line, `build_server_environment` for the unit's environment, as the vllm_server role renders them. What the
host adds is named where it is added: the interpreter (`--python`, the role's vllm_server_python), the
weights (`--model-dir`, with `--load-format dummy` for the bundle's weightless model: the role's
vllm_server_load_format), the port and memory share of each server, and the bundle's PYTHONPATH.

Each server runs in a process session of its own, standing in for its unit's cgroup (session_unit.py), and the
collection's Lifecycle (plugins/module_utils/service/lifecycle.py) starts it, waits until it serves, and stops it.
The servers of every scenario asked for are started first, one after another as each has sized its KV cache
(start_staggered), then each scenario measures, writing what it measured to OUT/gpu-harness.json as soon as
it has it (and OUT/gpu-harness.md, the tables):

  serve-bench  one compiled server (torch.compile, CUDA graphs) with 0.9 of the GPU: vllm_bench against
               `vllm bench serve`, interleaved over rounds, with the server's own counters around each run
  stops        five eager servers: stops with 0 and 16 streams in flight, drained (20 s) and not, through
               Lifecycle.stop (the fix), and one plain SIGTERM with 16 streams watched for 30 s (before it)
  sleep        sleep level 1 and 2 and wake-up through the collection's HTTP helper, with GPU memory
  sleep-swap   two servers of 0.55 of the GPU each, which cannot both be awake: a swap that puts the old one to
               sleep (Lifecycle.sleep, gpu_memory_wait fit_utilization), its rollback (stop the new one, wake the
               old one: Lifecycle.wake), its success (the sleeping one stopped), beside the same swap and rollback
               by stop and load; and the guard of the development endpoints from a non-loopback address
  orphans      SIGKILL of the API server alone: the orphan search, gpu_memory_wait naming what holds the GPU,
               then with terminate_leftovers ending it; and how soon NVML shows a release

Every server's load is split into vLLM's own phases (weights, compile, graphs, engine init, KV cache).

usage: python3 benchmarks/gpu/harness.py SCENARIO... --out DIR [--python PY] [--model-dir DIR] [--rounds N]
       python3 benchmarks/gpu/harness.py --summary DIR/gpu-harness.json --out DIR   (the Markdown again)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "benchmarks"))

# pylint: disable=wrong-import-position,import-error
from session_unit import SessionUnit, import_collection  # noqa: E402

COLLECTIONS = import_collection()

import compare_vllm_bench as compare  # noqa: E402
from vllm_phases import load_phases  # noqa: E402

from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import (  # noqa: E402
    check_entry,
    find_entry_file,
    serve_spec,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.lifecycle import Lifecycle, Settings  # noqa: E402
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import list_processes  # noqa: E402
from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import (  # noqa: E402
    build_serve_args,
    build_server_environment,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import get, one_token_completion, post  # noqa: E402

CATALOGS = [str(ROOT / "benchmarks" / "models"), str(ROOT / "models")]
STREAM_CLIENTS = ROOT / "tests" / "integration" / "stream_clients.py"
INSTALL_FILES = ROOT / "roles" / "vllm_install" / "files"
MODULES = "ansible_collections.llmops.vllm.plugins.modules"
LAUNCHER = ["-m", "vllm.entrypoints.openai.api_server"]
# systemd's default PATH for a service; the unit's EnvironmentFile adds the rest.
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STREAMS = 16
STREAM_TOKENS = 3000
# Seconds between a server's "Available KV cache memory" line and the next server's start: the cache is
# allocated just after the line.
KV_CACHE_ALLOCATION_MARGIN = 2.0
# ---- results --------------------------------------------------------------------------------------------


class Results:
    """What the run measured, written to OUT/NAME.json (gpu-harness.json) after every addition."""

    def __init__(self, out: Path, args, name: str = "gpu-harness"):
        self.path = out / f"{name}.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.data.setdefault("host", host_facts(args))

    def add(self, scenario: str, key: str, value):
        self.data.setdefault(scenario, {})[key] = value
        self.path.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        print(f"[{time.strftime('%H:%M:%S')}] {scenario} {key}: {json.dumps(value)[:600]}", flush=True)


def host_facts(args) -> dict:
    facts = {"python": args.python, "device": args.device, "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.device == "cuda":
        query = "name,driver_version,memory.total"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, check=False
        )
        facts["gpus"] = out.stdout.strip().splitlines()
    version = subprocess.run(
        [args.python, "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        env=server_env_base(args),
        check=False,
    )
    facts["vllm"] = version.stdout.strip() or version.stderr.strip()[-300:]
    return facts


# ---- GPU memory (NVML) ----------------------------------------------------------------------------------


def nvml():
    import pynvml  # pylint: disable=import-outside-toplevel

    pynvml.nvmlInit()
    return pynvml


def gpu_used_mib(args) -> float | None:
    if args.device != "cuda":
        return None
    pynvml = nvml()
    return round(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used / 2**20, 1)


def session_gpu_mib(args, server) -> float | None:
    """GPU memory held by the processes of a server's session (NVML's per-process accounting)."""
    unit = server.unit
    if args.device != "cuda" or unit.leader is None:
        return None
    pynvml = nvml()
    members = {process.pid for process in list_processes() if process.session == unit.leader.pid}
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    held = [p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in members]
    return round(sum(held) / 2**20, 1)


# ---- servers --------------------------------------------------------------------------------------------


def load_entry(name: str, catalogs: tuple = ()) -> dict:
    """The catalog entry NAME, looked up in `catalogs` first, then in the project's catalogs."""
    with open(find_entry_file(name, [*catalogs, *CATALOGS]), encoding="utf-8") as stream:
        return check_entry(name, yaml.safe_load(stream))


def server_env_base(args) -> dict:
    # The vllm_install role puts the guard of the development endpoints into the venv; here it is on the path.
    env = {"PATH": SERVICE_PATH, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pythonpath, str(INSTALL_FILES)]))
    return env


class Server:
    """One instance of the catalog entry, rendered by the collection, in a session of its own."""

    # pylint: disable-next=too-many-arguments
    def __init__(
        self, args, name, port, utilization, drain, eager=False, sleep_mode=False, kill_mode="mixed", host=None,
        entry=None, layout=None, gpus=None,
    ):  # fmt: skip
        """`entry`, `layout` and `gpus`: another catalog entry than --entry (served from its own source path), a
        layout other than its own, and the GPUs its instance holds (CUDA_VISIBLE_DEVICES, as the role renders it)."""
        chosen = load_entry(entry or args.entry, args.catalog)
        model_dir = chosen["source"]["path"] if entry else args.model_dir
        entry = {**chosen, "sleep_mode": sleep_mode}
        extra_args = list(entry["extra_args"]) + (["--enforce-eager"] if eager else [])
        spec = serve_spec(
            {**entry, "extra_args": extra_args}, layout or entry["layout"], model_dir, host or "127.0.0.1", port
        )
        spec.update(shutdown_timeout=drain, load_format=args.load_format, gpu_memory_utilization=utilization)
        settings = {
            "home": args.home,
            "load_timeout": entry["load_timeout"],
            "device": args.device,
            "env": entry["env"],
            "cuda_visible_devices": ",".join(gpus or []),
            "sleep_mode": sleep_mode,
        }
        environment = build_server_environment(settings)
        self.argv = [args.python, *LAUNCHER, *build_serve_args(spec)]
        self.env = {**server_env_base(args), **environment}
        self.url = f"http://127.0.0.1:{port}"
        self.served_name = entry["served_name"]
        self.model_dir = model_dir
        self.unit = SessionUnit(f"vllm-{name}", self.argv, self.env, str(args.logs / f"server-{name}.log"), kill_mode)
        self.settings = Settings(
            url=self.url, served_name=self.served_name, load_timeout=entry["load_timeout"], poll_interval=0.2
        )
        self.lifecycle = Lifecycle(self.unit, self.settings)
        self.name = name

    def extend(self, extra_args: list[str]):
        """More server flags, as the role's vllm_server_extra_args adds them after the catalog's."""
        self.argv += extra_args
        self.unit.argv += extra_args

    def start(self) -> dict:
        before = self.unit.state()
        timings = self.lifecycle.start(before)
        return {"ready_s": timings["elapsed"], **load_phases(self.unit.log_lines())}

    def stop(self) -> dict:
        return self.lifecycle.stop(self.unit.state())


def start_staggered(servers: list[Server]) -> dict:
    """Start the servers, each through its Lifecycle, the next once the one before has its KV cache.

    vLLM sizes its KV cache from the GPU memory it sees used while it profiles: a second server loading on the
    same GPU at that moment would be counted as the first one's own use. Loads overlap outside that window.
    """
    with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
        futures = {}
        for server in servers:
            futures[server.name] = pool.submit(server.start)
            deadline = time.monotonic() + server.settings.load_timeout
            while time.monotonic() < deadline and not futures[server.name].done():
                if "kv_cache_gib" in load_phases(server.unit.log_lines()):
                    time.sleep(KV_CACHE_ALLOCATION_MARGIN)
                    break
                time.sleep(0.2)
    results = {}
    for name, future in futures.items():
        try:
            results[name] = future.result()
        except Exception as error:  # pylint: disable=broad-except
            results[name] = {"error": str(error)[-2000:]}
    return results


def start_streams(server: Server, out: Path, count: int = STREAMS) -> tuple[subprocess.Popen, Path]:
    """`count` streams kept going against the server; returns once every one has received a chunk."""
    output = out / f"streams-{server.name}.json"
    command = [sys.executable, str(STREAM_CLIENTS), server.url, server.served_name, "none", str(count)]
    clients = subprocess.Popen([*command, str(STREAM_TOKENS), str(output)])  # pylint: disable=consider-using-with
    marker = Path(str(output) + ".streaming")
    deadline = time.monotonic() + 120
    while not marker.exists():
        if time.monotonic() > deadline or clients.poll() is not None:
            raise RuntimeError(f"the {count} streams of {server.name} did not all begin")
        time.sleep(0.05)
    return clients, output


def stream_outcome(clients: subprocess.Popen, output: Path) -> dict:
    clients.wait(timeout=180)
    records = json.loads(output.read_text())
    return {
        "requests": len(records),
        "done": sum(1 for record in records if record["done"]),
        "complete": sum(1 for record in records if record["tokens"] == STREAM_TOKENS),
        "with_chunks": sum(1 for record in records if record["chunks"]),
    }


# ---- scenarios ------------------------------------------------------------------------------------------


def watch_gone(server: Server, args, since: float, timeout: float = 60.0) -> dict:
    """Seconds from `since` until every process of the server's session is gone, and until its GPU memory is."""
    gone = free = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (gone is None or free is None):
        now = time.monotonic()
        if gone is None and not server.unit.pids(None):
            gone = round(now - since, 3)
        if free is None and (args.device != "cuda" or not session_gpu_mib(args, server)):
            free = round(now - since, 3)
        time.sleep(0.02)
    return {"all_processes_gone_s": gone, "gpu_memory_free_s": free}


STOP_CASES = [
    # name, streams in flight, the server's --shutdown-timeout
    ("idle-nodrain", 0, 0),
    ("idle-drain20", 0, 20),
    ("streams-nodrain", STREAMS, 0),
    ("streams-drain20", STREAMS, 20),
    ("before-fix-streams-nodrain", STREAMS, 0),
]


def stops_servers(args) -> list:
    return [
        Server(args, name, args.port + index, args.small_utilization, drain, eager=True)
        for index, (name, _streams, drain) in enumerate(STOP_CASES)
    ]


def measure_stops(args, results: Results, servers: dict):
    """Stops through Lifecycle.stop with 0 and 16 streams, drained (20 s) and not; then one plain SIGTERM."""
    for name, streams, _drain in STOP_CASES:
        server = servers[name]
        clients = start_streams(server, args.logs, streams) if streams else None
        time.sleep(1)
        if name.startswith("before-fix"):
            # What a stop was before the fix: SIGTERM, then the module waited stop_timeout (30 s) for the exit.
            server.unit.stop()
            report = {"watched_s": 30, **watch_engine_and_main(server, args, server.unit.sigterm_at, 30.0)}
            server.unit.kill_session()
        else:
            report = server.stop()
        report.update(watch_gone(server, args, server.unit.sigterm_at))
        if clients:
            report["streams"] = stream_outcome(*clients)
        results.add("stops", name, report)


def watch_engine_and_main(server: Server, args, since: float, timeout: float) -> dict:
    """Seconds until the engine core and the main process are gone, each; None when not within `timeout`."""
    main = server.unit.popen
    engine_gone = main_gone = None
    deadline = since + timeout
    while time.monotonic() < deadline and main_gone is None:
        now = time.monotonic()
        members = [p for p in list_processes() if server.unit.leader and p.session == server.unit.leader.pid]
        if engine_gone is None and not any(p.cmdline.startswith("VLLM::EngineCore") for p in members):
            engine_gone = round(now - since, 3)
        if main.poll() is not None:
            main_gone = round(now - since, 3)
        time.sleep(0.05)
    return {
        "engine_gone_s": engine_gone,
        "main_exited_s": main_gone,
        "gpu_mib_held_at_end": session_gpu_mib(args, server),
        "left_in_session": [
            f"{p.pid} {p.cmdline[:60]}"
            for p in list_processes()
            if server.unit.leader and p.session == server.unit.leader.pid
        ],
    }


@contextlib.contextmanager
def module_command(name: str, **module_args):
    """How Ansible runs one of the collection's modules on a host: the command and its environment, for as long
    as the command runs (its arguments file is removed afterwards)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [COLLECTIONS, os.environ.get("PYTHONPATH")]))}
    # In a file, as Ansible passes them: AnsibleModule takes a long argument for a path and fails on its length.
    with tempfile.NamedTemporaryFile("w", prefix=f"{name}-args-", suffix=".json") as args_file:
        json.dump({"ANSIBLE_MODULE_ARGS": module_args}, args_file)
        args_file.flush()
        yield [sys.executable, "-m", f"{MODULES}.{name}", args_file.name], env


def run_module(name: str, **module_args) -> dict:
    """One of the collection's modules, run as Ansible runs it on a host: its JSON result."""
    with module_command(name, **module_args) as (command, env):
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {
            "failed": True,
            "msg": f"no JSON from {name} (rc {proc.returncode}): {proc.stdout[-800:]} {proc.stderr[-1500:]}",
        }


def orphans_servers(args) -> list:
    # KillMode=process: nothing ends what is left once the main process is gone.
    return [Server(args, "orphans", args.port + 10, args.small_utilization, 0, eager=True, kill_mode="process")]


def measure_orphans(args, results: Results, servers: dict):
    """SIGKILL of the API server alone, outside systemd's KillMode=mixed: what is left, found and ended."""
    server = servers["orphans"]
    before = server.unit.state()
    held_before = session_gpu_mib(args, server)
    os.kill(before.main_pid, signal.SIGKILL)
    server.unit.popen.wait(timeout=10)
    time.sleep(2)
    orphans = server.lifecycle.find_orphans(before)
    found = {
        "gpu_mib_before_kill": held_before,
        "gpu_mib_2s_after_kill": session_gpu_mib(args, server),
        "orphans": [{"pid": p.pid, "cmdline": p.cmdline, "session": p.session} for p in orphans],
    }
    results.add("orphans", "found", found)
    if args.device != "cuda":
        return
    waited = run_module("gpu_memory_wait", gpus=["0"], timeout=5, interval=0.05, consecutive=1)
    results.add(
        "orphans", "gpu_memory_wait", {key: waited.get(key) for key in ("failed", "msg", "processes", "elapsed")}
    )
    ended = run_module(
        "gpu_memory_wait", gpus=["0"], timeout=5, interval=0.05, consecutive=1, terminate_leftovers=True, grace=5
    )
    fields = ("failed", "msg", "terminated", "elapsed", "used_mib", "polls")
    results.add("orphans", "terminate_leftovers", {key: ended.get(key) for key in fields})
    results.add("orphans", "release_latency", release_latency(args))


HOLDER = """
import signal, sys, time, torch
block = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("held", flush=True)
time.sleep(3600)
"""


def release_latency(args, gib: float = 64.0, runs: int = 3) -> list:
    """Seconds from a holder's reaping to gpu_memory_wait's answer that the GPU is free (NVML, fast polls)."""
    figures = []
    for _run in range(runs):
        holder = subprocess.Popen(
            [args.python, "-c", HOLDER, str(gib)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **server_env_base(args)},
        )  # pylint: disable=consider-using-with
        if holder.stdout.readline().strip() != "held":
            holder.kill()
            return [*figures, {"error": "the holder did not start"}]
        with module_command("gpu_memory_wait", gpus=["0"], timeout=30, interval=0.02, consecutive=1) as (command, env):
            waiting = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)  # pylint: disable=consider-using-with
            time.sleep(2)
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            reaped = time.monotonic()
            out, _err = waiting.communicate(timeout=60)
            answered = time.monotonic()
        result = json.loads(out)
        figures.append(
            {
                "gib": gib,
                "detected_after_reaping_s": round(answered - reaped, 4),
                "module_elapsed_s": result.get("elapsed"),
                "failed": result.get("failed", False),
            }
        )
    return figures


def sleep_servers(args) -> list:
    return [Server(args, "sleep", args.port + 20, args.small_utilization, 0, eager=True, sleep_mode=True)]


def measure_sleep(args, results: Results, servers: dict):
    """Sleep level 1 and 2 and wake-up through the collection's HTTP helper (service/vllm_api.post)."""
    server = servers["sleep"]
    for level in (1, 2):
        figures = {"gpu_mib_awake": gpu_used_mib(args), "session_gpu_mib_awake": session_gpu_mib(args, server)}
        began = time.monotonic()
        reply = post(server.url, f"/sleep?level={level}", timeout=120)
        figures.update(sleep_s=round(time.monotonic() - began, 3), sleep_status=reply.status)
        figures["is_sleeping"] = get(server.url, "/is_sleeping").body.strip()
        figures["gpu_mib_asleep"] = gpu_used_mib(args)
        figures["session_gpu_mib_asleep"] = session_gpu_mib(args, server)
        began = time.monotonic()
        reply = post(server.url, "/wake_up", timeout=120)
        figures.update(wake_s=round(time.monotonic() - began, 3), wake_status=reply.status)
        figures["session_gpu_mib_woken"] = session_gpu_mib(args, server)
        results.add("sleep", f"level{level}", figures)
    results.add("sleep", "stop", server.stop())


SWAP_UTILIZATION = 0.55  # two servers of this share cannot both be awake on one GPU


def sleep_swap_servers(args) -> list:
    # Every address, so that the guard of the development endpoints can be asked from a non-loopback one.
    return [Server(args, "swap-old", args.port + 40, SWAP_UTILIZATION, 0, eager=True, sleep_mode=True, host="0.0.0.0")]


def rss_mib(server) -> float:
    """Resident CPU memory of a server's processes (where level 1 keeps the weights while it sleeps)."""
    total = 0
    for pid in server.unit.pids(server.unit.state()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return round(total / 1024, 1)


def timed(step) -> tuple[float, object]:
    began = time.monotonic()
    value = step()
    return round(time.monotonic() - began, 3), value


def serves(server) -> bool:
    return one_token_completion(server.url, server.served_name, None).status == 200


def wait_room(args, **how) -> dict:
    """gpu_memory_wait on GPU 0 as the swap role runs it: the new server's share free, or back to a baseline."""
    waited = run_module("gpu_memory_wait", gpus=["0"], timeout=60, interval=0.05, **how)
    return {key: waited.get(key) for key in ("failed", "msg", "elapsed", "used_mib")}


def measure_sleep_swap(args, results: Results, servers: dict):
    """A swap whose old server sleeps, its rollback and its success, beside the same by stop and load."""
    old = servers["swap-old"]
    new = Server(args, "swap-new", args.port + 41, SWAP_UTILIZATION, 0, eager=True, sleep_mode=True)
    try:
        results.add(
            "sleep_swap", "old_serves", {"gpu_mib": gpu_used_mib(args), "rss_mib": rss_mib(old), "serves": serves(old)}
        )
        results.add("sleep_swap", "guard", guard_check(old))

        def swap_by_sleep(name):
            figures = {}
            began = time.monotonic()
            figures["sleep_s"], report = timed(lambda: old.lifecycle.sleep(old.unit.state()))
            figures.update(sleep=report, gpu_mib_asleep=gpu_used_mib(args), rss_mib_asleep=rss_mib(old))
            figures["room_s"], figures["room"] = timed(lambda: wait_room(args, fit_utilization=SWAP_UTILIZATION))
            figures["load_s"], figures["start"] = timed(new.start)
            figures["downtime_s"] = round(time.monotonic() - began, 3)
            figures.update(new_serves=serves(new), gpu_mib_both=gpu_used_mib(args))
            results.add("sleep_swap", name, figures)
            return figures

        swapped = swap_by_sleep("swap_by_sleep")
        # The rollback: the new server fails (here: on purpose), is stopped, and the old one wakes.
        figures = {}
        began = time.monotonic()
        figures["stop_new_s"], figures["stop_new"] = timed(new.stop)
        baseline = swapped["room"].get("used_mib") or {}
        figures["memory_back_s"], figures["memory_back"] = timed(
            lambda: wait_room(args, baseline=baseline, max_above_baseline_mib=256)
        )
        figures["wake_s"], figures["wake"] = timed(old.lifecycle.wake)
        figures["rollback_s"] = round(time.monotonic() - began, 3)
        figures.update(old_serves=serves(old), gpu_mib=gpu_used_mib(args), rss_mib=rss_mib(old))
        results.add("sleep_swap", "rollback_by_wake", figures)
        # The success: the old one sleeps again, the new one serves, and the sleeping one is stopped.
        swap_by_sleep("swap_by_sleep_again")
        stop_s, report = timed(old.stop)
        results.add("sleep_swap", "stop_asleep", {"stop_s": stop_s, "stop": report, "gpu_mib": gpu_used_mib(args)})
        # The same swap and rollback by stop and load: the new one stops, the old one loads again, and back.
        results.add("sleep_swap", "swap_by_stop", swap_by_stop(args, new, old, "downtime_s"))
        results.add("sleep_swap", "rollback_by_load", swap_by_stop(args, old, new, "rollback_s"))
        new.stop()
    finally:
        new.unit.kill_session()


def swap_by_stop(args, leaving, coming, total_key: str) -> dict:
    """The swap without sleep, timed: the serving server stops, its GPU is waited for, the other one loads."""
    figures = {}
    began = time.monotonic()
    figures["stop_s"], _stop = timed(leaving.stop)
    figures["room_s"], figures["room"] = timed(lambda: wait_room(args, fit_utilization=SWAP_UTILIZATION))
    figures["load_s"], figures["start"] = timed(coming.start)
    figures[total_key] = round(time.monotonic() - began, 3)
    return figures


def local_address() -> str | None:
    """An address of this host other than loopback (no packet is sent), or None."""
    import socket  # pylint: disable=import-outside-toplevel

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def guard_check(server) -> dict:
    """What the development endpoints answer on loopback and on a non-loopback address of the host."""
    port = server.url.rsplit(":", 1)[1]
    address = local_address()
    found = {"address": address, "loopback_reset_prefix_cache": post(server.url, "/reset_prefix_cache").status}
    if address:
        remote = f"http://{address}:{port}"
        found["remote_reset_prefix_cache"] = post(remote, "/reset_prefix_cache").status
        found["remote_sleep"] = post(remote, "/sleep?level=1").status
        found["remote_models"] = get(remote, "/v1/models").status
        found["still_awake"] = get(server.url, "/is_sleeping").body.strip()
    return found


def bench_servers(args) -> list:
    # Compiled (torch.compile and CUDA graphs), as real models run, on the GPU; the CPU build runs eager. No
    # prefix caching: both clients draw their prompts as vLLM's random dataset does, and prompts that start
    # at the same offset would be served from the cache for whichever client comes second. Its share of GPU memory
    # and its sleep mode are the entry's, unless --bench-utilization says otherwise.
    entry = load_entry(args.entry, args.catalog)
    utilization = args.bench_utilization or entry["gpu_memory_utilization"]
    server = Server(
        args, "bench", args.port + 30, utilization, 0, eager=args.device != "cuda", sleep_mode=entry["sleep_mode"]
    )
    server.extend(["--no-enable-prefix-caching"])
    return [server]


def measure_bench(args, results: Results, servers: dict):
    """Both clients over every level, interleaved: A B in one round, B A in the next."""
    server = servers["bench"]
    levels = [tuple(int(part) for part in level.split(":")) for level in args.levels]
    runs = {"vllm bench serve": {}, "vllm_bench": {}}
    for round_number in range(args.rounds):
        clients = ["vllm bench serve", "vllm_bench"]
        for client in clients if round_number % 2 == 0 else reversed(clients):
            measured = bench_round(args, server, client, levels, 1000 * (round_number + 1))
            for level in measured:
                runs[client].setdefault(str(level["max_concurrency"]), []).append(level)
            results.add("serve_bench", "runs", runs)
        # After every round, so that a run cut off still has the rounds it completed.
        results.add("serve_bench", "summary", bench_summary(runs))
    results.add("serve_bench", "stop", server.stop())


def bench_level(server: Server, concurrency: int, requests: int, seed: int) -> dict:
    """One level of the vllm_bench module against the server, random 128 tokens in and 128 out."""
    result = run_module(
        "vllm_bench", url=server.url, model=server.served_name, concurrency=[concurrency], num_requests=requests,
        input_len=128, output_len=128, tokenizer=server.model_dir, warmup_requests=1, seed=seed,
    )  # fmt: skip
    if result.get("failed"):
        raise RuntimeError(f"vllm_bench C={concurrency}: {result.get('msg')}")
    return result["levels"][0]


def bench_round(args, server: Server, client: str, levels, seed: int) -> list:
    """One client over every level, each level's run with the server's own counters around it."""
    if client == "vllm_bench":
        measured = []
        for concurrency, requests in levels:
            before = compare_counters(server)
            level = bench_level(server, concurrency, requests, seed + concurrency)
            level.update(server_view(before, compare_counters(server)))
            measured.append(level)
        return measured
    bench_args = [
        "--backend", "openai", "--base-url", server.url, "--endpoint", "/v1/completions", "--model", args.model_dir,
        "--served-model-name", server.served_name, "--dataset-name", "random", "--random-input-len", "128",
        "--random-output-len", "128", "--ignore-eos", "--num-warmups", "0", "--disable-tqdm",
    ]  # fmt: skip
    specs = [f"{concurrency}:{requests}:{seed + concurrency}" for concurrency, requests in levels]
    command = [
        args.python,
        str(ROOT / "benchmarks" / "vllm_bench_serve_cpu.py"),
        "/dev/null",
        *specs,
        "--",
        *bench_args,
    ]
    counters = [compare_counters(server)]
    measured = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, **server_env_base(args)}
    ) as proc:
        for line in proc.stdout:
            if line.startswith('{"max_concurrency"'):
                counters.append(compare_counters(server))
                level = json.loads(line)
                level.update(server_view(counters[-2], counters[-1]))
                measured.append(level)
    if len(measured) != len(levels):
        raise RuntimeError(f"vllm bench serve gave {len(measured)} of {len(levels)} levels (rc {proc.returncode})")
    return measured


# compare_vllm_bench's counters, and the server's own inter-token latency.
SERVER_COUNTERS = (
    *compare.SERVER_COUNTERS,
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
)


def compare_counters(server: Server) -> dict:
    """SERVER_COUNTERS, read from the server's /metrics with the collection's helper."""
    metrics = get(server.url, "/metrics").body
    return {name: compare.metric_total(metrics, name) or 0.0 for name in SERVER_COUNTERS}


def server_view(before: dict, after: dict) -> dict:
    """compare_vllm_bench's view of a run from the server's counters, and the server's mean ITL (ms)."""
    itl_sum, itl_count = (after[name] - before[name] for name in SERVER_COUNTERS[-2:])
    return {
        **compare.server_view(before, after),
        "server_mean_itl_ms": itl_sum / itl_count * 1000 if itl_count else None,
    }


def median_of(runs: list, field: str) -> float | None:
    values = [run.get(field) for run in runs]
    return None if None in values else statistics.median(values)


def bench_summary(runs: dict) -> dict:
    """Per level: medians of each client, vllm_bench's paired ratios, client CPU per 1,000 output tokens."""
    summary = {}
    for concurrency, theirs in runs["vllm bench serve"].items():
        ours = runs["vllm_bench"][concurrency]
        level = {}
        fields = ("output_throughput", "median_ttft_ms", "mean_ttft_ms", "server_mean_ttft_ms", "median_itl_ms")
        for field in (*fields, "server_mean_itl_ms"):
            level[field] = {"vllm bench serve": median_of(theirs, field), "vllm_bench": median_of(ours, field)}
        for field in ("output_throughput", "median_ttft_ms"):
            mean, low, high = compare.paired_ratio([r[field] for r in ours], [r[field] for r in theirs])
            level[f"{field}_paired_percent"] = [
                round(mean, 2),
                round(low, 2),
                round(high, 2),
                compare.verdict(low, high),
            ]
        level["client_cpu_s_per_1k_tokens"] = {
            client: statistics.median(
                run["client_cpu_seconds"] / run["total_output_tokens"] * 1000 for run in client_runs
            )
            for client, client_runs in (("vllm bench serve", theirs), ("vllm_bench", ours))
        }
        level["failed"] = {
            "vllm bench serve": sum(r["failed"] for r in theirs),
            "vllm_bench": sum(r["failed"] for r in ours),
        }
        summary[concurrency] = level
    return summary


# Each scenario: the servers it needs, and what it measures once they serve.
SCENARIOS = {
    "serve-bench": (bench_servers, measure_bench),
    "stops": (stops_servers, measure_stops),
    "sleep": (sleep_servers, measure_sleep),
    "sleep-swap": (sleep_swap_servers, measure_sleep_swap),
    "orphans": (orphans_servers, measure_orphans),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"any of {', '.join(SCENARIOS)}")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary", type=Path, help="write only the Markdown of an earlier run's JSON")
    parser.add_argument("--logs", type=Path, help="where the servers' and streams' output goes (default OUT/logs)")
    parser.add_argument("--entry", default="gpu_tinyllama", help="catalog entry (--catalog, benchmarks/models, models)")
    parser.add_argument(
        "--catalog", action="append", default=[], metavar="DIR", help="a catalog searched first (repeatable)"
    )
    parser.add_argument("--python", default="/opt/torch/.venv/bin/python3", help="the server's interpreter")
    parser.add_argument("--pythonpath", default="/tmp/site", help="where the bundle's vLLM lies ('' for none)")
    parser.add_argument("--model-dir", default="/tmp/tinyllama")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--home", default="/tmp/llmops-vllm-home", help="the unit's HOME (vllm_server_home)")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--small-utilization", type=float, default=0.12, help="GPU memory share of the eager servers")
    parser.add_argument("--bench-utilization", type=float, help="the bench server's share (default: the entry's)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--levels", nargs="+", default=["1:24", "8:96", "32:256", "128:512"], help="CONCURRENCY:REQUESTS"
    )
    args = parser.parse_args()
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown or not (args.scenarios or args.summary):
        parser.error(f"choose scenarios from {', '.join(SCENARIOS)} (got {', '.join(unknown) or 'none'})")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summary:
        data = json.loads(args.summary.read_text())
        if "runs" in data.get("serve_bench", {}):  # with this version's summary of the runs
            data["serve_bench"]["summary"] = bench_summary(data["serve_bench"]["runs"])
        (args.out / "gpu-harness.md").write_text(markdown(data))
        return
    args.logs = args.logs or args.out / "logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    os.makedirs(args.home, exist_ok=True)
    results = Results(args.out, args)
    servers = {server.name: server for name in args.scenarios for server in SCENARIOS[name][0](args)}
    try:
        began = time.monotonic()
        starts = start_staggered(list(servers.values()))
        results.add("starts", "servers", starts)
        results.add("starts", "wall_s", round(time.monotonic() - began, 1))
        for name in args.scenarios:
            began = time.monotonic()
            ready = [server.name for server in SCENARIOS[name][0](args) if "error" not in starts[server.name]]
            try:
                if ready:
                    SCENARIOS[name][1](args, results, {key: servers[key] for key in ready})
            except Exception as error:  # pylint: disable=broad-except
                results.add(name.replace("-", "_"), "error", repr(error)[-3000:])
            results.add(name.replace("-", "_"), "wall_s", round(time.monotonic() - began, 1))
            (args.out / "gpu-harness.md").write_text(markdown(results.data))
    finally:
        for server in servers.values():
            server.unit.kill_session()
        (args.out / "gpu-harness.md").write_text(markdown(results.data))


PHASE_COLUMNS = ("ready_s", "weights_s", "compile_s", "graphs_s", "engine_init_s", "kv_cache_gib", "kv_cache_tokens")


def markdown(data: dict) -> str:
    """The figures of a run, as tables; the JSON beside it holds every figure."""
    host = data.get("host", {})
    lines = [
        "# The collection against a real vLLM (benchmarks/gpu/harness.py)",
        "",
        f"Host: {'; '.join(host.get('gpus', [])) or host.get('device')}; vLLM {host.get('vllm')}; {host.get('time')}.",
        "",
    ]
    starts = data.get("starts", {}).get("servers", {})
    if starts:
        lines += ["## Loads (seconds; vLLM's own phases from its log)", ""]
        lines += [table_row(["server", *PHASE_COLUMNS]), table_row(["---"] * (len(PHASE_COLUMNS) + 1))]
        for name, start in starts.items():
            cells = [start.get(column, "-") for column in PHASE_COLUMNS] if "error" not in start else ["error"]
            lines.append(table_row([name, *cells]))
        lines.append("")
    summary = data.get("serve_bench", {}).get("summary")
    if summary:
        lines += ["## vllm_bench beside `vllm bench serve` (medians of the rounds; paired: vllm_bench's ratio)", ""]
        header = ["C", "out tok/s vllm / ours", "paired % [95%]", "median TTFT ms vllm / ours", "paired % [95%]"]
        header += ["server's mean TTFT ms in vllm's / ours' runs", "median ITL ms vllm / ours"]
        header += ["server's mean ITL ms in vllm's / ours' runs", "client CPU s per 1k tokens vllm / ours"]
        lines += [table_row(header), table_row(["---"] * len(header))]
        for concurrency, level in sorted(summary.items(), key=lambda item: int(item[0])):
            keys = ("output_throughput", "median_ttft_ms", "server_mean_ttft_ms", "median_itl_ms", "server_mean_itl_ms")
            pairs = [level.get(key) for key in keys] + [level["client_cpu_s_per_1k_tokens"]]
            cells = [pair_text(pair, digits) for pair, digits in zip(pairs, (0, 2, 2, 2, 2, 4), strict=True)]
            paired = [fmt_ratio(level[f"{key}_paired_percent"]) for key in ("output_throughput", "median_ttft_ms")]
            lines.append(table_row([concurrency, cells[0], paired[0], cells[1], paired[1], *cells[2:]]))
        lines.append("")
    stops = {key: value for key, value in data.get("stops", {}).items() if isinstance(value, dict)}
    if stops:
        lines += ["## Stops (seconds from SIGTERM)", ""]
        header = [
            "case",
            "module's stop",
            "what it did",
            "all processes gone",
            "GPU memory free",
            "streams done / complete / of",
        ]
        lines += [table_row(header), table_row(["---"] * len(header))]
        for case, stop in stops.items():
            lines.append(
                table_row(
                    [
                        case,
                        stop.get("elapsed", "-"),
                        stop_action(stop),
                        stop.get("all_processes_gone_s"),
                        stop.get("gpu_memory_free_s"),
                        streams_text(stop.get("streams")),
                    ]
                )
            )
        lines.append("")
    lines += sleep_swap_table(data.get("sleep_swap", {}))
    for scenario in ("sleep", "orphans"):
        if scenario in data:
            lines += [f"## {scenario}", "", "```json", json.dumps(data[scenario], indent=1)[:8000], "```", ""]
    return "\n".join(lines) + "\n"


def sleep_swap_table(swap: dict) -> list:
    """The swap and its rollback, by sleep and by stop and load, in seconds."""
    if "swap_by_sleep" not in swap:
        return []
    rows = [
        ("swap, old one asleep", swap["swap_by_sleep"], ("sleep_s", "room_s", "load_s", "downtime_s")),
        (
            "rollback: stop new, wake old",
            swap.get("rollback_by_wake"),
            ("stop_new_s", "memory_back_s", "wake_s", "rollback_s"),
        ),
        ("swap, old one stopped", swap.get("swap_by_stop"), ("stop_s", "room_s", "load_s", "downtime_s")),
        ("rollback: stop new, load old", swap.get("rollback_by_load"), ("stop_s", "room_s", "load_s", "rollback_s")),
    ]
    lines = ["## A swap by sleep beside a swap by stop (seconds)", ""]
    lines += [table_row(["case", "old out / new stopped", "GPU room", "load or wake", "total"]), table_row(["---"] * 5)]
    for case, figures, keys in rows:
        lines.append(table_row([case, *[(figures or {}).get(key, "-") for key in keys]]))
    return [*lines, ""]


def pair_text(pair, digits) -> str:
    if not pair or None in pair.values():
        return "-"
    return f"{pair['vllm bench serve']:.{digits}f} / {pair['vllm_bench']:.{digits}f}"


def table_row(cells) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def stop_action(stop: dict) -> str:
    if "watched_s" in stop:  # the stop before the fix: SIGTERM and a watch
        if stop.get("main_exited_s") is None:
            return (
                f"main process alive {stop['watched_s']} s after SIGTERM (engine gone at {stop.get('engine_gone_s')} s)"
            )
        return f"main process exited at {stop['main_exited_s']} s"
    hang = stop.get("api_server_hang")
    if hang:
        return (
            f"API server outlived its engine (gone at {hang['engine_exited']} s), {hang['connections']} connections:"
            f" killed at {hang['killed_after']} s"
        )
    return "SIGKILL after stop_timeout" if stop.get("escalated") else "exited on SIGTERM"


def streams_text(streams) -> str:
    return f"{streams['done']} / {streams['complete']} / {streams['requests']}" if streams else "-"


def fmt_ratio(values) -> str:
    mean, low, high, verdict = values
    return f"{mean:+.1f} [{low:+.1f}, {high:+.1f}] {verdict}"


if __name__ == "__main__":
    main()
