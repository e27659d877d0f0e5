"""Integration tests: the collection's modules and playbooks against a real local host.

The host is one podman container booting systemd (scripts/local-host.sh), named by LLMOPS_TEST_HOST
(default llmops-vllm-it), so that several checkouts can test side by side. Tests that need a serving
model take the `deployed` fixture: playbooks/deploy.yml deploys `tiny` once per session.
The fleet tests (rollout, the router, stop and status, swap) take the `fleet` fixture: a second host, named
LLMOPS_TEST_HOST with `-2` added, serving `tiny` too, with its records in a directory of its own and its server
listening on its own network address, not on every address: a step that reads the default directory or waits
at 127.0.0.1 fails there. When the session has fleet tests, both hosts are deployed at once.
LLMOPS_TEST_KEEP_HOST=1 keeps the containers afterwards; the next session's deploy then changes nothing.

`--lane fleet` or `--lane host` runs one of two halves of the tests, whole modules each: the modules with fleet
tests, or the rest. scripts/integration.sh runs both at once, each with hosts of its own: a load of tiny keeps about
one core busy, so two lanes on two cores take about the time of the longer. The modules of a lane run in the order
of their names: the alert tests of test_observability.py, whose windows hold a restart of tiny, run before the router
tests' continuous load in the other lane, which on every core slowed such a restart past them.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL_HOST = ROOT / "scripts" / "local-host.sh"
HUB_STANDIN = ROOT / "tests" / "hub_standin.py"
STREAM_CLIENTS = Path(__file__).with_name("stream_clients.py")
API_KEY = "integration-api-key-9d2e"
ENDPOINT = "http://127.0.0.1:8000"
SMALL_FS = "/srv/small"
# The second host keeps its instance records apart from the first's.
SECOND_CONFIG_DIR = "/etc/vllm-fleet"
# The longest a module may take here: a start of tiny plus a stop, with room for a loaded CI runner.
MODULE_TIMEOUT = 900

LANES = ("fleet", "host")


def pytest_addoption(parser):
    parser.addoption("--lane", choices=LANES, help="run one lane of the integration tests (scripts/integration.sh)")


def pytest_collection_modifyitems(config, items):
    lane = config.getoption("lane")
    if not lane:
        return
    fleet_modules = {item.path.name for item in items if "fleet" in item.fixturenames}
    kept = [item for item in items if (item.path.name in fleet_modules) == (lane == "fleet")]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


@dataclass
class LocalHost:
    name: str
    inventory: Path
    api_key: str = API_KEY
    endpoint: str = ENDPOINT
    config_dir: str = "/etc/vllm"
    # The container's address on podman's network: other hosts, and this machine, reach it there.
    address: str = ""

    def sh(self, script: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a bash script as root on the host."""
        proc = subprocess.run(
            ["podman", "exec", self.name, "bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{script!r} failed with rc {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def copy_in(self, source: str, destination: str) -> None:
        """Copy a file of this machine onto the host."""
        subprocess.run(["podman", "cp", source, f"{self.name}:{destination}"], check=True, timeout=60)

    def spawn(self, script: str) -> None:
        """Start a bash script on the host in the background, as a transient systemd service."""
        self.sh(f"systemd-run --quiet --collect bash -c {shlex.quote(script)}", timeout=60)

    def module(self, module_name: str, /, *, check_mode: bool = False, python: str = "", **args) -> dict:
        """Run one module on the host through Ansible and return its result (with `failed` on failure).

        `python` runs it with another interpreter on the host (the vLLM venv's, for tiny_model).
        """
        command = ["ansible", self.name, "-i", str(self.inventory), "-m", module_name]
        if args:
            # Without options, no -a: Ansible takes `-a {}` for free-form text, which a module refuses.
            command += ["-a", json.dumps(args)]
        if check_mode:
            command.append("--check")
        if python:
            command += ["-e", f"ansible_python_interpreter={python}"]
        env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=MODULE_TIMEOUT, env=env, cwd=ROOT, check=False
        )
        try:
            report = json.loads(proc.stdout)
            return report["plays"][0]["tasks"][0]["hosts"][self.name]
        except (ValueError, KeyError, IndexError) as exc:
            raise AssertionError(f"no result from {shlex.join(command)}:\n{proc.stdout}\n{proc.stderr}") from exc

    def playbook(self, playbook: str, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
        """Run a playbook of the collection against this host only."""
        command = ["ansible-playbook", "-i", str(self.inventory), "--limit", self.name, playbook, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


@dataclass
class Fleet:
    """The two hosts of the fleet tests, in one inventory (group vllm_hosts)."""

    hosts: tuple[LocalHost, LocalHost]
    inventory: Path

    def inventory_with(self, path: Path, groups: dict | None = None, **host_vars: dict) -> Path:
        """A copy of the inventory at `path`, with more variables for some hosts and more groups."""
        inventory = json.loads(self.inventory.read_text())
        for name, extra in host_vars.items():
            inventory["vllm_hosts"]["hosts"][name].update(extra)
        inventory.update(groups or {})
        path.write_text(json.dumps(inventory))
        return path

    def playbook(self, playbook: str, *args: str, inventory: Path | None = None, timeout: float = 1500):
        """Run a playbook of the collection against the fleet (narrow it with --limit in `args`)."""
        command = ["ansible-playbook", "-i", str(inventory or self.inventory), playbook, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


def unfolded(proc: subprocess.CompletedProcess) -> str:
    """A playbook's stdout and stderr with each run of whitespace made one space: the yaml result format of
    ansible.cfg folds a long message or table row over several lines, at a width that depends on its length."""
    return " ".join((proc.stdout + proc.stderr).split())


def remove_instances(host: LocalHost, *instances: str) -> None:
    """Stop the instances and remove their records, environments, units and weights: the host as before them."""
    for instance in instances:
        if host.sh(f"test -e {host.config_dir}/{instance}.json", check=False).returncode:
            continue  # never deployed here
        stopped = host.module(
            "llmops.vllm.vllm_service", instance=instance, config_dir=host.config_dir, state="stopped"
        )
        assert not stopped.get("failed"), stopped
        host.sh(
            f"rm -rf {host.config_dir}/{instance}.json {host.config_dir}/{instance}.env "
            f"/etc/systemd/system/vllm-{instance}.service /etc/systemd/system/llmops-vllm-guard-{instance}.service "
            f"/var/lib/vllm/models/{instance}"
        )
    host.sh("systemctl daemon-reload")


def copy_stream_clients(host: LocalHost) -> None:
    """tests/integration/stream_clients.py to /tmp on the host, where it runs with the host's own Python."""
    host.sh(f"cat > /tmp/stream_clients.py <<'EOF'\n{STREAM_CLIENTS.read_text()}\nEOF")


def main_started_at(host: LocalHost, unit: str) -> int:
    """The epoch second at which the unit's main process last started, as systemd says."""
    shown = host.sh(f"systemctl show --timestamp=unix -P ExecMainStartTimestamp {shlex.quote(unit)}").stdout
    return int(shown.strip().lstrip("@"))


def engine_gauge(host: LocalHost, url: str, name: str) -> float:
    """vLLM's gauge `name` (summed over its labels) from the /metrics of the instance at `url`, read on `host`,
    which that endpoint answers."""
    script = (
        "import re, sys, urllib.request; text = urllib.request.urlopen(sys.argv[1] + '/metrics').read().decode();"
        " print(sum(float(v) for v in re.findall('^' + re.escape(sys.argv[2]) + r'{[^}]*} (\\S+)$', text, re.M)))"
    )
    return float(host.sh(f"python3 -c {shlex.quote(script)} {shlex.quote(url)} {shlex.quote(name)}").stdout)


# Until the stand-in answers at all (its 401 to a request without the token is an answer).
WAIT_FOR_HUB = """
import time, urllib.error, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen("{url}", timeout=5)
    except urllib.error.HTTPError:
        break
    except OSError:
        time.sleep(0.1)
"""


@contextmanager
def hub_standin(host: LocalHost, root: str, port: int, token: str):
    """The hub stand-in (tests/hub_standin.py) inside the host, serving the repositories under `root`
    (owner/name/) behind `token`, its CDN on port + 1; yields its endpoint, stops it and removes `root` after."""
    unit = f"llmops-hub-standin-{port}"
    subprocess.run(["podman", "cp", str(HUB_STANDIN), f"{host.name}:/srv/hub_standin.py"], check=True, timeout=60)
    host.sh(
        f"systemctl stop {unit} 2>/dev/null; systemd-run --quiet --unit={unit}"
        f" python3 /srv/hub_standin.py {root} --port {port} --cdn-port {port + 1} --token {token}"
    )
    endpoint = f"http://127.0.0.1:{port}"
    host.sh(f"python3 - <<'EOF'\n{WAIT_FOR_HUB.format(url=endpoint + '/api/models/x/revision/main')}\nEOF")
    try:
        yield endpoint
    finally:
        host.sh(f"systemctl stop {unit}; rm -rf {root}")


def host_environment(name: str, **extra: str) -> dict:
    return {
        **os.environ,
        "LLMOPS_LOCAL_NAME": name,
        "LLMOPS_LOCAL_PORT": "",
        # Half a core kept free: while tiny streams on every core, each podman exec (and so each module
        # call) otherwise waits minutes for one on a 2-core machine.
        "LLMOPS_LOCAL_CPUS": str(max(1.0, (os.cpu_count() or 1) - 0.5)),
        **extra,
    }


def container_address(name: str) -> str:
    address = subprocess.run(
        ["podman", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", name],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    assert address and not address.startswith("127."), f"{name} has no address on podman's network: {address!r}"
    return address


HOST_VARS = {
    "ansible_connection": "llmops.vllm.podman",
    "ansible_python_interpreter": "/usr/bin/python3",
    "ansible_become": False,
    "vllm_install_wheelhouse": "/opt/wheelhouse",
    "vllm_server_api_key": API_KEY,
}


# The open files that the server's unit asks for (the role's default), less where the container's systemd cannot
# grant as many: without CAP_SYS_RESOURCE its own hard limit, which the container got from the machine, caps them.
OPEN_FILES = 65536


def open_files_granted(name: str) -> int:
    """The LimitNOFILE= that the container's systemd grants a unit: its own hard limit, up to OPEN_FILES."""
    limits = subprocess.run(
        ["podman", "exec", name, "cat", "/proc/1/limits"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    hard = next(line.split()[4] for line in limits.splitlines() if line.startswith("Max open files"))
    return OPEN_FILES if hard == "unlimited" else min(OPEN_FILES, int(hard))


@pytest.fixture(scope="session")
def local_host(request, tmp_path_factory) -> LocalHost:
    name = os.environ.get("LLMOPS_TEST_HOST", "llmops-vllm-it")
    # A filesystem smaller than the tiny model, for the disk-space check of the weights.
    env = host_environment(name, LLMOPS_LOCAL_TMPFS=SMALL_FS + ":1m")
    subprocess.run([LOCAL_HOST, "up"], check=True, env=env)
    address = container_address(name)
    if request.config.getoption("lane") == "host":
        # Beside the fleet lane's hosts: its first takes the core that vLLM binds by default, its second the last.
        own_core(name)
    inventory = tmp_path_factory.mktemp("inventory") / "hosts.yml"
    # Routers reach the host's instances at its address (tests/integration/test_router.py).
    host_vars = {**HOST_VARS, "vllm_worker_address": address, "vllm_server_limit_nofile": open_files_granted(name)}
    inventory.write_text(json.dumps({"vllm_hosts": {"hosts": {name: host_vars}}}))
    yield LocalHost(name=name, inventory=inventory, address=address)
    if os.environ.get("LLMOPS_TEST_KEEP_HOST") != "1":
        subprocess.run([LOCAL_HOST, "down"], check=True, env=env)


# Two hosts on one machine share its cores, as two machines would not. vLLM's CPU build binds its engine's threads
# to every core but one it reserves (VLLM_CPU_OMP_THREADS_BIND=auto): each host's engine then took core 0, and a
# load that one host starts beside the other's serving engine took over 300 s instead of 40 (a rollout behind the
# router, under load). The second host's engines take the core that the first host's leave free.
# A drop-in of every unit whose name begins with "vllm-".
OWN_CORE_DIR = "/etc/systemd/system/vllm-.service.d"


def own_core(name: str) -> None:
    """Bind the vLLM engines of the container `name` (every unit vllm-*.service) to the machine's last core."""
    last = (os.cpu_count() or 1) - 1
    if last < 1:
        return
    drop_in = f"[Service]\nEnvironment=VLLM_CPU_OMP_THREADS_BIND={last}\n"
    script = f"mkdir -p {OWN_CORE_DIR} && printf '{drop_in}' > {OWN_CORE_DIR}/own-core.conf && systemctl daemon-reload"
    subprocess.run(["podman", "exec", name, "sh", "-c", script], check=True)


@pytest.fixture(scope="session")
def fleet_hosts(local_host: LocalHost, tmp_path_factory) -> Fleet:
    """The first host and a second one, not deployed yet; the second's records and server as the module says."""
    name = f"{local_host.name}-2"
    env = host_environment(name)
    subprocess.run([LOCAL_HOST, "up"], check=True, env=env)
    address = container_address(name)
    own_core(name)
    inventory = tmp_path_factory.mktemp("fleet") / "hosts.yml"
    second_vars = {
        **HOST_VARS,
        "vllm_config_dir": SECOND_CONFIG_DIR,
        "vllm_server_host": address,
        "vllm_worker_address": address,
        "vllm_server_limit_nofile": open_files_granted(name),
    }
    hosts = json.loads(local_host.inventory.read_text())["vllm_hosts"]["hosts"]
    inventory.write_text(json.dumps({"vllm_hosts": {"hosts": {**hosts, name: second_vars}}}))
    second = LocalHost(
        name=name, inventory=inventory, endpoint=f"http://{address}:8000", config_dir=SECOND_CONFIG_DIR, address=address
    )
    yield Fleet(hosts=(local_host, second), inventory=inventory)
    if os.environ.get("LLMOPS_TEST_KEEP_HOST") != "1":
        subprocess.run([LOCAL_HOST, "down"], check=True, env=env)


def deploy_tiny(inventory: Path, *limit: str) -> None:
    command = ["ansible-playbook", "-i", str(inventory), "playbooks/deploy.yml", "-e", "model=tiny", *limit]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=ROOT, check=False)
    assert proc.returncode == 0, f"deploy.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="session")
def deployed(request, local_host: LocalHost) -> LocalHost:
    """The host with `tiny` deployed by playbooks/deploy.yml and serving; with fleet tests ahead, both hosts at once."""
    if any("fleet" in item.fixturenames for item in request.session.items):
        deploy_tiny(request.getfixturevalue("fleet_hosts").inventory)
    else:
        deploy_tiny(local_host.inventory, "--limit", local_host.name)
    return local_host


@pytest.fixture(scope="session")
def fleet(deployed: LocalHost, fleet_hosts: Fleet) -> Fleet:
    """Both hosts serving `tiny` with the session's key, deployed at once by `deployed`."""
    return fleet_hosts
