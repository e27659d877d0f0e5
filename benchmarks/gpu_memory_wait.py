# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_memory_wait and gpu_facts on a real NVIDIA host: detection latency, poll cost, failures, topology.

Runs the collection's real modules as Ansible runs them on a host (`python -m ...modules.NAME ARGS`, the
module's stdout is its JSON result), against memory held by torch in child processes:

1. release: a child holds --gib GiB on GPU 0; the module starts waiting; the child gets SIGTERM; we record
   how long the module took, after the child was reaped, to report the GPU free (per backend, per setting);
2. poll cost: one memory poll (`gpus()` of each backend, the call the wait loop makes), and one process list;
3. a holder that never exits: the module fails, naming its PID, for each backend;
4. leftovers: a holder named like a vLLM worker that ignores SIGTERM: check mode names it and leaves it,
   `terminate_leftovers` ends it (SIGKILL after the grace) and the wait succeeds;
5. facts from both backends (they must agree); with two GPUs or more, the link between GPU 0 and 1, and a
   wait on GPU 0 that a holder on GPU 1 does not delay.

Needs python3 with torch (CUDA), ansible-core, and nvidia-ml-py for the NVML backend. Usage:

    python3 benchmarks/gpu_memory_wait.py --out DIR [--name NAME] [--gib 8] [--repeats 3]

It writes DIR/NAME.json (every figure), DIR/NAME.md (a summary) and DIR/nvidia-smi-captures.json (raw
nvidia-smi outputs, for parser fixtures); NAME is gpu-memory-wait unless given.
`--summary FILE.json --out DIR` writes only the summary of an earlier report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = "ansible_collections.llmops.vllm.plugins.modules"
# The module's defaults, and the tightest setting worth using (one clean poll, 50 ms apart).
SETTINGS = {
    "default (interval 0.25 s, 2 in a row)": {},
    "fast (interval 0.05 s, 1)": {"interval": 0.05, "consecutive": 1},
}

# A child that takes GIB GiB on one GPU, says "ready" with its PID, then sleeps until it is ended.
# With a title it renames itself (as vLLM's workers do with setproctitle) and ignores SIGTERM.
HOLDER = r"""
import ctypes, signal, sys, time
import torch
gpu, gib, title = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if title:
    ctypes.CDLL(None).prctl(15, title.encode(), 0, 0, 0)  # PR_SET_NAME: /proc/PID/comm
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=f"cuda:{gpu}")
torch.cuda.synchronize(gpu)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


def collection_path() -> str:
    """A folder where `ansible_collections.llmops.vllm` is this checkout, as Ansible lays collections out."""
    root = Path(tempfile.mkdtemp(prefix="llmops-collections-"))
    link = root / "ansible_collections" / "llmops" / "vllm"
    link.parent.mkdir(parents=True)
    link.symlink_to(ROOT)
    return str(root)


HOLDER_SCRIPT = Path(tempfile.mkdtemp(prefix="llmops-holder-")) / "gpu_holder.py"
HOLDER_SCRIPT.write_text(HOLDER)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [collection_path(), os.environ.get("PYTHONPATH")]))}
sys.path.insert(0, ENV["PYTHONPATH"].split(os.pathsep)[0])


def start_module(name: str, **args) -> subprocess.Popen:
    """Start one module the way Ansible runs it on a host; its result is the JSON it prints."""
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": args})
    command = [sys.executable, "-m", f"{MODULES}.{name}", payload]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def result_of(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    try:
        return json.loads(out)
    except ValueError:
        raise RuntimeError(f"module printed no JSON (rc {proc.returncode}):\n{out}\n{err}") from None


def run_module(name: str, **args) -> dict:
    return result_of(start_module(name, **args))


def hold(gpu: int, gib: float, title: str = "") -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, str(HOLDER_SCRIPT), str(gpu), str(gib), title], stdout=subprocess.PIPE, text=True, env=ENV
    )
    if holder.stdout.readline().strip() != "ready":
        holder.kill()
        raise RuntimeError(f"the holder of {gib} GiB on GPU {gpu} did not start")
    return holder


def nvidia_smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True).stdout


def release(backend: str, settings: dict, gib: float) -> dict:
    """Hold, start waiting, SIGTERM the holder: seconds from the holder's reaping to the module's answer."""
    holder = hold(0, gib)
    waiting = start_module("gpu_memory_wait", gpus=["0"], timeout=60, backend=backend, **settings)
    time.sleep(3)  # the module is polling and sees the memory held
    if waiting.poll() is not None:
        holder.kill()
        raise RuntimeError(f"the wait ended while memory was held: {result_of(waiting)}")
    signalled = time.monotonic()
    holder.send_signal(signal.SIGTERM)
    holder.wait()
    reaped = time.monotonic()
    result = result_of(waiting)
    answered = time.monotonic()
    if result.get("failed"):
        raise RuntimeError(f"the wait failed: {result}")
    return {
        "holder_exit_s": round(reaped - signalled, 4),
        "detected_after_exit_s": round(answered - reaped, 4),
        "module_elapsed_s": result["elapsed"],
        "polls": result["polls"],
        "used_mib_after": result["used_mib"]["0"],
    }


def poll_cost(samples: dict) -> dict:
    """Seconds per call of each backend's reads, in this process, with the module_utils the module uses."""
    try:
        import pynvml
    except ImportError:
        pynvml = None

    from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import open_backend

    def run(command):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    costs = {}
    for backend_name in samples:
        backend = open_backend(backend_name, pynvml, shutil.which("nvidia-smi"), run)
        calls = samples[backend_name]
        per_call = {}
        for read in ("gpus", "processes"):
            timings = []
            for _call in range(calls):
                start = time.perf_counter()
                getattr(backend, read)()
                timings.append(time.perf_counter() - start)
            per_call[read] = {
                "calls": calls,
                "median_ms": round(statistics.median(timings) * 1000, 4),
                "p90_ms": round(sorted(timings)[int(calls * 0.9)] * 1000, 4),
            }
        backend.close()
        costs[backend_name] = per_call
    return costs


def never_exits(backend: str, gib: float) -> dict:
    holder = hold(0, gib)
    try:
        result = run_module("gpu_memory_wait", gpus=["0"], timeout=3, backend=backend)
    finally:
        holder.kill()
        holder.wait()
    named = [process for process in result.get("processes", []) if process["pid"] == holder.pid]
    return {
        "failed": bool(result.get("failed")),
        "holder_pid": holder.pid,
        "pid_named": bool(named) and str(holder.pid) in result.get("msg", ""),
        # The driver's PID is the process /proc shows (its command line), not only a number.
        "described_from_proc": bool(named) and named[0]["cmdline"].endswith(f"gpu_holder.py 0 {float(gib)}"),
        "msg": result.get("msg"),
        "processes": result.get("processes"),
    }


def leftovers(gib: float) -> dict:
    from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import read_process

    holder = hold(0, gib, title="VLLM::Worker_TP")
    try:
        args = {"gpus": ["0"], "timeout": 2, "terminate_leftovers": True, "grace": 1}
        # Where this machine puts processes in a systemd unit or scope, the holder's counts as the owner.
        owner = read_process(holder.pid).unit
        if owner:
            args["owner_unit"] = owner
        checked = run_module("gpu_memory_wait", _ansible_check_mode=True, **args)
        alive_after_check = holder.poll() is None
        ended = run_module("gpu_memory_wait", **args)
    finally:
        holder.kill()
        holder.wait()
    return {
        "holder_pid": holder.pid,
        "check_mode": {key: checked.get(key) for key in ("changed", "failed", "would_terminate", "msg")},
        "alive_after_check_mode": alive_after_check,
        "terminate": {key: ended.get(key) for key in ("changed", "failed", "terminated", "elapsed", "used_mib", "msg")},
    }


def two_gpus(gib: float) -> dict:
    holder = hold(1, gib)
    try:
        other = run_module("gpu_memory_wait", gpus=["0"], timeout=5)
        held = run_module("gpu_memory_wait", gpus=["1"], timeout=2)
    finally:
        holder.kill()
        holder.wait()
    return {
        "wait_on_gpu0": {key: other.get(key) for key in ("failed", "elapsed", "polls", "used_mib")},
        "wait_on_gpu1": {
            "failed": held.get("failed"),
            "named_gpu1_holder": [p["gpu"] for p in held.get("processes", []) if p["pid"] == holder.pid] == [1],
            "msg": held.get("msg"),
        },
    }


def summary(report: dict) -> str:
    facts = next(iter(report["facts"].values()))
    lines = [
        "# gpu_memory_wait and gpu_facts on a real GPU host",
        "",
        f"Host: {facts['count']} x {facts['gpus'][0]['name']}, driver {facts['driver_version']}, "
        f"CUDA {facts['cuda_version']}; Python {report['python']}, torch {report['torch']}. "
        f"Run {report['date']} with `{report['command']}`; every figure is in {report['name']}.json.",
        "",
        f"## Detection latency after release ({report['gib']} GiB held on GPU 0, {report['repeats']} runs each)",
        "",
        "Seconds from the holder's reaping (after SIGTERM) to the module's answer, module exit included.",
        "",
        "| backend | setting | holder exit after SIGTERM (s) | detected after exit, median (s) | max (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for backend, by_setting in report["release"].items():
        for setting, runs in by_setting.items():
            exits = statistics.median(run["holder_exit_s"] for run in runs)
            detected = [run["detected_after_exit_s"] for run in runs]
            lines.append(
                f"| {backend} | {setting} | {exits:.3f} | {statistics.median(detected):.3f} | {max(detected):.3f} |"
            )
    lines += [
        "",
        "## Poll cost (one call, in-process, median / p90 ms)",
        "",
        "| backend | memory poll | process list |",
    ]
    lines.append("| --- | --- | --- |")
    for backend, cost in report["poll_cost"].items():
        lines.append(
            f"| {backend} | {cost['gpus']['median_ms']} / {cost['gpus']['p90_ms']} "
            f"| {cost['processes']['median_ms']} / {cost['processes']['p90_ms']} |"
        )
    lines += ["", "## A holder that never exits (timeout 3 s)", ""]
    for backend, outcome in report["never_exits"].items():
        lines.append(
            f"- {backend}: failed={outcome['failed']}, PID {outcome['holder_pid']} named={outcome['pid_named']}, "
            f"command line from /proc={outcome['described_from_proc']}:"
        )
        lines.append(f"  `{outcome['msg']}`")
    left = report["leftovers"]
    lines += [
        "",
        "## Leftover vLLM-named holder that ignores SIGTERM",
        "",
        f"- check mode: would_terminate={left['check_mode']['would_terminate']}, holder still alive: "
        f"{left['alive_after_check_mode']}",
        f"- terminate_leftovers: changed={left['terminate']['changed']}, failed={left['terminate']['failed']}, "
        f"terminated={left['terminate']['terminated']}",
        "",
        "## Facts",
        "",
        f"- backends agree: {report['facts_agree']}",
        f"- topology: `{json.dumps(facts['topology'])}`",
    ]
    if "two_gpus" in report:
        two = report["two_gpus"]
        lines += [
            f"- wait on GPU 0 while GPU 1 is held: failed={two['wait_on_gpu0']['failed']}, "
            f"elapsed {two['wait_on_gpu0']['elapsed']} s",
            f"- wait on GPU 1 while held: failed={two['wait_on_gpu1']['failed']}, holder named on GPU 1: "
            f"{two['wait_on_gpu1']['named_gpu1_holder']}",
        ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--name", default="gpu-memory-wait", help="file name of the report, without suffix")
    parser.add_argument("--summary", type=Path, help="only write the summary of this earlier JSON report to --out")
    parser.add_argument("--gib", type=float, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default="nvml,nvidia-smi", help="comma-separated; nvml needs nvidia-ml-py")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    if options.summary:
        report = json.loads(options.summary.read_text())
        (options.out / f"{report['name']}.md").write_text(summary(report))
        return
    import torch

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python3", "benchmarks/gpu_memory_wait.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "name": options.name,
        "gib": options.gib,
        "repeats": options.repeats,
    }
    backends = options.backends.split(",")
    report["facts"] = {
        backend: run_module("gpu_facts", backend=backend)["ansible_facts"]["vllm_gpus"] for backend in backends
    }
    facts = [dict(report["facts"][backend], backend=None) for backend in backends]
    report["facts_agree"] = all(other == facts[0] for other in facts)
    print("facts:", json.dumps(report["facts"]), flush=True)

    report["poll_cost"] = poll_cost({backend: 2000 if backend == "nvml" else 40 for backend in backends})
    print("poll cost:", report["poll_cost"], flush=True)

    report["release"] = {
        backend: {
            name: [release(backend, settings, options.gib) for _repeat in range(options.repeats)]
            for name, settings in SETTINGS.items()
        }
        for backend in backends
    }
    print("release:", json.dumps(report["release"]), flush=True)

    report["never_exits"] = {backend: never_exits(backend, options.gib) for backend in backends}
    print("never exits:", json.dumps(report["never_exits"]), flush=True)
    report["leftovers"] = leftovers(options.gib)
    print("leftovers:", json.dumps(report["leftovers"]), flush=True)

    captures = {
        "query-gpu.csv": nvidia_smi(
            "--query-gpu=index,uuid,name,memory.total,memory.used,mig.mode.current,pci.bus_id",
            "--format=csv,noheader,nounits",
        ),
        "topo-m.txt": nvidia_smi("topo", "-m"),
        "query.xml": nvidia_smi("-q", "-x"),
    }
    if facts[0]["count"] >= 2:
        report["two_gpus"] = two_gpus(options.gib)
        print("two gpus:", json.dumps(report["two_gpus"]), flush=True)
    holder = hold(0, options.gib)
    try:
        captures["query-compute-apps.csv"] = nvidia_smi(
            "--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"
        )
        captures["query-compute-apps.pid"] = str(holder.pid)
    finally:
        holder.kill()
        holder.wait()

    (options.out / f"{options.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (options.out / f"{options.name}.md").write_text(summary(report))
    (options.out / "nvidia-smi-captures.json").write_text(json.dumps(captures, indent=1) + "\n")
    print(summary(report))


if __name__ == "__main__":
    main()
