# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard of one member of a multi-host vLLM group, run by systemd beside the member's unit (llmops.vllm).

vLLM does not heal a group: a headless worker whose head restarts neither exits nor reconnects, a dead or hung
engine of another host leaves the head answering /health, and requests handed to that rank wait for ever. Each
member's guard brings its own part back, and together they recreate the group:

- the head's guard sends a one-token completion to every data parallel rank through the head's API server (vLLM's
  X-data-parallel-rank header); when a rank fails `--failures` checks in a row after the group has served, it
  names the rank and its host in the journal and restarts the head;
- a worker's guard watches the head's /health; when a head that answered stops answering (it restarts, or hangs),
  the worker restarts, so that it joins the head's next start.

A worker that restarts by itself (its engine died: vLLM then exits) waits for the head's handshake; the head's guard
sees the rank fail and restarts the head, which the waiting worker joins. The guard restarts its unit with
`systemctl try-restart`, which never starts a unit that is stopped; its unit is PartOf= the member's, so a stop of
the member stops the guard first. The head unit's start limit (StartLimitBurst=) bounds the group's restarts: a head
that systemd refuses to start again is left failed, and the guards do nothing more. A worker's restarts follow its
head's, so its guard clears the worker's start limit before each: the head's limit is the group's.

Each guard serves Prometheus metrics on the port that the record's group names (`guard_port`): whether its member
runs, whether each rank computed at the head's last check once the group served, and its restarts of the member by
the host whose failure caused them, kept in a state file across the guard's own restarts (its member's restart
restarts it too). Like the servers' /metrics (llmops_vllm_dev_guard.MetricsReaders, from the venv), they answer the
host itself and the readers that the collection lists, 403 to everyone else.

usage: llmops_vllm_group_guard.py --record /etc/vllm/INSTANCE.json --state FILE [--interval S] [--timeout S]
       [--failures N]
The record (written by the collection) gives the member's unit, role, URL and group. The head's guard reads the
instance's API key from the environment variable that the record names (the instance's EnvironmentFile), never
from its command line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The servers' own middleware, in the same venv: who may read metrics besides the host itself.
from llmops_vllm_dev_guard import READERS_FILE, ReadersFile, is_local, is_same_host

RANK_HEADER = "X-data-parallel-rank"
# The guard reaches the member's API server directly, never through a proxy of the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Streak:
    """Failed checks in a row of a member whose unit runs, counted once a check has passed since the unit started:
    a member that loads, or a group that forms, is left to its start (the head's own wait for its engines,
    VLLM_ENGINE_READY_TIMEOUT_S, and systemd bound it)."""

    def __init__(self, failures: int):
        self.failures = failures
        self.invocation = None
        self.passed = False
        self.failed = 0

    def ends(self, active: bool, invocation: str, failed: bool) -> bool:
        """Whether this check makes `failures` in a row; the count then waits for a check that passes again."""
        if not active or invocation != self.invocation:
            self.invocation, self.passed, self.failed = invocation, False, 0
            if not active:
                return False
        if not failed:
            self.passed, self.failed = True, 0
            return False
        if not self.passed:
            return False
        self.failed += 1
        if self.failed < self.failures:
            return False
        self.passed, self.failed = False, 0
        return True


class HeadWatch(Streak):
    """The head's decision: restart when a rank has failed `failures` checks in a row since the group served."""

    def __init__(self, rank_hosts: list[str], failures: int):
        super().__init__(failures)
        self.rank_hosts = rank_hosts

    def observe(self, active: bool, invocation: str, errors: dict[int, str | None] | None) -> str | None:
        """The reason to restart the head, or None. `errors` maps each rank to its failure, None where it answered."""
        failing = {rank: error for rank, error in (errors or {}).items() if error is not None}
        if not self.ends(active, invocation, bool(failing)):
            return None
        named = "; ".join(f"rank {rank} on {self.rank_hosts[rank]}: {error}" for rank, error in sorted(failing.items()))
        return f"{len(failing)} of {len(errors)} data parallel rank(s) failed {self.failures} checks in a row ({named})"


class WorkerWatch(Streak):
    """A worker's decision: restart when a head that answered has failed `failures` checks in a row."""

    def observe(self, active: bool, invocation: str, head_error: str | None) -> str | None:
        """The reason to restart the worker, or None. `head_error` is None where the head's /health answered 200."""
        if not self.ends(active, invocation, head_error is not None):
            return None
        return f"the head stopped answering ({head_error}): this worker restarts to join the head's next start"


class Ledger:
    """What the guard exports: whether its member runs, each rank's last check (the head's, once the group has
    served since the member started), and its restarts of the member by the host whose failure caused each, which
    the state file keeps across the guard's restarts. Every cause starts at 0, so that a first restart is an
    increase to Prometheus."""

    def __init__(self, path: str, role: str, causes: list[str]):
        self.path, self.role = path, role
        self.restarts = dict.fromkeys(causes, 0)
        try:
            with open(path, encoding="utf-8") as handle:
                kept = json.load(handle)["restarts"]
            self.restarts.update({host: int(count) for host, count in kept.items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # no restart yet, or a state file of another shape: counted from here
        self.active = False
        self.ranks: dict[int, tuple[str, bool]] = {}
        self.lock = threading.Lock()

    def checked(self, active: bool, ranks: dict[int, tuple[str, bool]] | None = None) -> None:
        with self.lock:
            self.active, self.ranks = active, dict(ranks or {})

    def restarted(self, hosts: list[str]) -> None:
        with self.lock:
            for host in hosts:
                self.restarts[host] = self.restarts.get(host, 0) + 1
            kept = json.dumps({"restarts": self.restarts})
        written = f"{self.path}.new"
        with open(written, "w", encoding="utf-8") as handle:
            handle.write(kept)
        os.replace(written, self.path)

    def text(self) -> str:
        role = f'role="{self.role}"'
        with self.lock:
            lines = [
                "# HELP llmops_vllm_group_member_active Whether the group member's unit runs.",
                "# TYPE llmops_vllm_group_member_active gauge",
                f"llmops_vllm_group_member_active{{{role}}} {int(self.active)}",
                "# HELP llmops_vllm_group_rank_computes Whether the rank answered the head guard's last one-token "
                "completion, once the group has served since the head started.",
                "# TYPE llmops_vllm_group_rank_computes gauge",
                *(
                    f'llmops_vllm_group_rank_computes{{rank="{rank}",rank_host="{host}"}} {int(computes)}'
                    for rank, (host, computes) in sorted(self.ranks.items())
                ),
                "# HELP llmops_vllm_group_restarts_total Restarts of the member by its guard, by the host whose "
                "failure caused them.",
                "# TYPE llmops_vllm_group_restarts_total counter",
                *(
                    f'llmops_vllm_group_restarts_total{{{role},failed_host="{host}"}} {count}'
                    for host, count in sorted(self.restarts.items())
                ),
            ]
        return "\n".join(lines) + "\n"


def metrics_server(ledger: Ledger, host: str, port: int, readers_file: str = READERS_FILE) -> ThreadingHTTPServer:
    """The guard's /metrics on host:port, served by a thread of its own."""
    readers = ReadersFile(readers_file)

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            client, server = self.client_address, self.connection.getsockname()
            if not (is_local(client) or is_same_host(client, server) or readers.allows(client[0])):
                status, body = 403, f"/metrics answers the host itself and the readers in {readers.path} alone\n"
            elif self.path.split("?", 1)[0] != "/metrics":
                status, body = 404, "the guard serves /metrics alone\n"
            else:
                status, body = 200, ledger.text()
            payload = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass  # the journal keeps the guard's decisions, not its scrapes

    server = ThreadingHTTPServer((host, port), Metrics)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def request(url: str, timeout: float, body: dict | None = None, headers: dict | None = None) -> str | None:
    """None where the server answered 200, else what it answered or why it did not."""
    data = None if body is None else json.dumps(body).encode()
    outgoing = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with OPENER.open(outgoing, timeout=timeout) as reply:
            reply.read()
            return None
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, ValueError) as error:  # refused, reset, timed out
        return f"no answer ({getattr(error, 'reason', None) or error})"


def rank_errors(url: str, served_name: str, api_key: str, ranks: int, timeout: float) -> dict[int, str | None]:
    body = {"model": served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return {
        rank: request(f"{url}/v1/completions", timeout, body, {**headers, RANK_HEADER: str(rank)})
        for rank in range(ranks)
    }


def unit_state(unit: str) -> tuple[bool, str]:
    """Whether the unit is active, and its invocation (a new one at each start)."""
    shown = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "InvocationID", unit],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    fields = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    return fields.get("ActiveState") == "active", fields.get("InvocationID", "")


def restart(unit: str, reason: str, count: bool) -> None:
    """Restart `unit` if it runs. A restart that does not `count` clears the unit's start limit first: a worker
    restarts because its head went, and the head's own start limit bounds those restarts."""
    print(f"restarting {unit}: {reason}", flush=True)
    if not count:
        subprocess.run(["systemctl", "reset-failed", unit], timeout=30, check=False)
    # --no-block: the guard is PartOf= the unit, and the restart ends the guard too.
    subprocess.run(["systemctl", "try-restart", "--no-block", unit], timeout=30, check=False)


def rank_hosts(group: dict) -> list[str]:
    """Who runs each data parallel rank: the ranks are split evenly over the hosts, head first; one replica over
    every host (tensor or pipeline parallel across them) is the whole group's."""
    hosts, ranks = group["hosts"], int(group.get("data_parallel_size") or 1)
    if ranks < len(hosts):
        return [", ".join(hosts)] * ranks
    return [host for host in hosts for _rank in range(ranks // len(hosts))]


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The guard of one member of a multi-host vLLM group.")
    parser.add_argument("--record", required=True, help="the member's instance record (its unit, URL and group)")
    parser.add_argument("--state", required=True, help="the file that keeps the guard's restarts of its member")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between checks")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a check waits for its answer")
    parser.add_argument("--failures", type=int, default=3, help="failed checks in a row before a restart")
    parsed = parser.parse_args(argv)
    if min(parsed.interval, parsed.timeout) <= 0 or parsed.failures < 1:
        parser.error("--interval and --timeout must be above 0, --failures at least 1")
    return parsed


def main(argv: list[str]) -> None:
    options = arguments(argv)
    with open(options.record, encoding="utf-8") as handle:
        record = json.load(handle)
    unit, url, group = record["unit"], record["url"].rstrip("/"), record["group"]
    head = group["role"] == "head"
    if head:
        hosts = rank_hosts(group)
        watch = HeadWatch(hosts, options.failures)
        ledger = Ledger(options.state, "head", sorted(set(hosts)))
        api_key = os.environ.get(record["secrets"]["api_key_variable"], "")

        def check():
            return rank_errors(url, record["served_name"], api_key, len(hosts), options.timeout)

        def failed_hosts(errors):
            return sorted({hosts[rank] for rank, error in errors.items() if error is not None})

        def ranks(errors):
            return {rank: (hosts[rank], error is None) for rank, error in errors.items()} if watch.passed else {}

        print(
            f"guarding the head {unit}: {len(hosts)} data parallel rank(s) on {', '.join(group['hosts'])}", flush=True
        )
    else:
        watch = WorkerWatch(options.failures)
        ledger = Ledger(options.state, "worker", [group["head"]["name"]])

        def check():
            return request(f"{url}/health", options.timeout)

        def failed_hosts(_error):
            return [group["head"]["name"]]

        def ranks(_error):
            return {}

        print(f"guarding the worker {unit}: its head at {url}", flush=True)
    if group.get("guard_port"):  # a record of an older release has none
        metrics_server(ledger, record["host"], int(group["guard_port"]))
    while True:
        started = time.monotonic()
        active, invocation = unit_state(unit)
        checked = check() if active else None
        reason = watch.observe(active, invocation, checked)
        ledger.checked(active, ranks(checked) if active else None)
        if reason:
            ledger.restarted(failed_hosts(checked))
            restart(unit, reason, count=head)
        time.sleep(max(0.0, options.interval - (time.monotonic() - started)))


if __name__ == "__main__":
    main(sys.argv[1:])
