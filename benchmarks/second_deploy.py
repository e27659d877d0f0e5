# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How long a second `deploy.yml` takes on a local host where nothing is left to change.

Starts (or reuses) a local host with scripts/local-host.sh, deploys MODEL once so that it serves, then
runs deploy.yml again --runs times and prints, for each run, its wall time and the PLAY RECAP's `changed`
count, then the median. With --profile the last run also prints its slowest tasks (ansible.posix's
profile_tasks callback), to see where the time goes.

    flock -o /tmp/llmops-heavy.lock .venv/bin/python benchmarks/second_deploy.py --host llmops-vllm-bench \
        [--model tiny] [--runs 3] [--profile] [--keep] [--connection containers.podman.podman]

The host is removed afterwards unless --keep is given (a kept host makes the next call skip the first
deploy's install, but not its run). Needs the controller venv (`make venv`) and the wheelhouse.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL_HOST = ROOT / "scripts" / "local-host.sh"
RECAP = re.compile(r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)", re.MULTILINE)
PROFILE_LINE = re.compile(r"^(?P<task>.+?) -+ (?P<seconds>[0-9.]+)s$", re.MULTILINE)


def inventory(path: Path, host: str, connection: str) -> Path:
    """An inventory of the one local host, as the integration tests write it."""
    host_vars = {
        "ansible_connection": connection,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_become": False,
        "vllm_install_wheelhouse": "/opt/wheelhouse",
        "vllm_server_api_key": "benchmark-api-key",
        # As inventories/local: the container's systemd may not grant the role's LimitNOFILE=65536.
        "vllm_server_limit_nofile": 0,
    }
    path.write_text(json.dumps({"vllm_hosts": {"hosts": {host: host_vars}}}))
    return path


def deploy(hosts: Path, model: str, profile: bool) -> tuple[float, subprocess.CompletedProcess]:
    env = dict(os.environ)
    if profile:
        env["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.posix.profile_tasks"
        env["PROFILE_TASKS_TASK_OUTPUT_LIMIT"] = "15"
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(hosts), "playbooks/deploy.yml", "-e", f"model={model}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    return time.monotonic() - started, proc


def changed_count(proc: subprocess.CompletedProcess) -> int:
    recap = proc.stdout.rsplit("PLAY RECAP", 1)[-1]
    found = RECAP.search(recap)
    if proc.returncode != 0 or not found:
        sys.exit(f"deploy.yml failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return int(found["changed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="llmops-vllm-bench", help="the local host's container name")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--runs", type=int, default=3, help="second deploys to time")
    parser.add_argument("--profile", action="store_true", help="print the slowest tasks of the last run")
    parser.add_argument("--keep", action="store_true", help="keep the local host afterwards")
    parser.add_argument(
        "--connection",
        default="llmops.vllm.podman",
        help="the connection plugin (containers.podman.podman: without pipelining, for a figure before it)",
    )
    args = parser.parse_args()

    env = {**os.environ, "LLMOPS_LOCAL_NAME": args.host, "LLMOPS_LOCAL_PORT": ""}
    subprocess.run([str(LOCAL_HOST), "up"], check=True, env=env)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            hosts = inventory(Path(scratch) / "hosts.json", args.host, args.connection)
            seconds, proc = deploy(hosts, args.model, profile=False)
            print(f"first deploy: {seconds:.1f} s, changed={changed_count(proc)}")
            timings = []
            for run in range(1, args.runs + 1):
                seconds, proc = deploy(hosts, args.model, profile=args.profile and run == args.runs)
                timings.append(seconds)
                print(f"second deploy, run {run}: {seconds:.1f} s, changed={changed_count(proc)}")
            print(f"second deploy of {args.model}: median {statistics.median(timings):.1f} s over {args.runs} runs")
            if args.profile:
                print("slowest tasks of the last run:")
                for line in PROFILE_LINE.finditer(proc.stdout):
                    print(f"  {float(line['seconds']):6.2f} s  {line['task'].strip()}")
    finally:
        if not args.keep:
            subprocess.run([str(LOCAL_HOST), "down"], check=True, env=env)


if __name__ == "__main__":
    main()
