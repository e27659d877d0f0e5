"""Integration tests: the collection's modules and playbooks against a real local host.

The host is one podman container booting systemd (scripts/local-host.sh), named by LLMOPS_TEST_HOST
(default llmops-vllm-it), so that several checkouts can test side by side. Tests that need a serving
model take the `deployed` fixture: playbooks/deploy.yml deploys `tiny` once per session.
LLMOPS_TEST_KEEP_HOST=1 keeps the container afterwards; the next session's deploy then changes nothing.
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
API_KEY = "integration-api-key-9d2e"
ENDPOINT = "http://127.0.0.1:8000"
SMALL_FS = "/srv/small"
# The longest a module may take here: a start of tiny plus a stop, with room for a loaded CI runner.
MODULE_TIMEOUT = 900


@dataclass
class LocalHost:
    name: str
    inventory: Path
    api_key: str = API_KEY
    endpoint: str = ENDPOINT

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
        command = ["ansible", self.name, "-i", str(self.inventory), "-m", module_name, "-a", json.dumps(args)]
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


def remove_instances(host: LocalHost, *instances: str) -> None:
    """Stop the instances and remove their records, environments, units and weights: the host as before them."""
    for instance in instances:
        stopped = host.module("llmops.vllm.vllm_service", instance=instance, state="stopped")
        assert not stopped.get("failed"), stopped
        host.sh(
            f"rm -rf /etc/vllm/{instance}.json /etc/vllm/{instance}.env /etc/systemd/system/vllm-{instance}.service "
            f"/var/lib/vllm/models/{instance}"
        )
    host.sh("systemctl daemon-reload")


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


@pytest.fixture(scope="session")
def local_host(tmp_path_factory) -> LocalHost:
    name = os.environ.get("LLMOPS_TEST_HOST", "llmops-vllm-it")
    env = {
        **os.environ,
        "LLMOPS_LOCAL_NAME": name,
        "LLMOPS_LOCAL_PORT": "",
        # A filesystem smaller than the tiny model, for the disk-space check of the weights.
        "LLMOPS_LOCAL_TMPFS": SMALL_FS + ":1m",
        # Half a core kept free: while tiny streams on every core, each podman exec (and so each module
        # call) otherwise waits minutes for one on a 2-core machine.
        "LLMOPS_LOCAL_CPUS": str(max(1.0, (os.cpu_count() or 1) - 0.5)),
    }
    subprocess.run([LOCAL_HOST, "up"], check=True, env=env)
    inventory = tmp_path_factory.mktemp("inventory") / "hosts.yml"
    host_vars = {
        "ansible_connection": "llmops.vllm.podman",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_become": False,
        "vllm_install_wheelhouse": "/opt/wheelhouse",
        "vllm_server_api_key": API_KEY,
    }
    inventory.write_text(json.dumps({"vllm_hosts": {"hosts": {name: host_vars}}}))
    yield LocalHost(name=name, inventory=inventory)
    if os.environ.get("LLMOPS_TEST_KEEP_HOST") != "1":
        subprocess.run([LOCAL_HOST, "down"], check=True, env=env)


@pytest.fixture(scope="session")
def deployed(local_host: LocalHost) -> LocalHost:
    """The host with `tiny` deployed by playbooks/deploy.yml and serving."""
    proc = local_host.playbook("playbooks/deploy.yml", "-e", "model=tiny")
    assert proc.returncode == 0, f"deploy.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return local_host
