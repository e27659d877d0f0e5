"""Every playbook that changes what runs where publishes the targets last, so that Prometheus follows each change."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

PLAYBOOKS = Path(__file__).resolve().parents[3] / "playbooks"
TARGETS = "llmops.vllm.vllm_targets"


def steps(play):
    """The roles and role imports of a play, in the order they run."""
    found = [role["role"] for role in play.get("roles") or []]
    return found + [task["ansible.builtin.import_role"]["name"] for task in play.get("tasks") or []]


@pytest.mark.parametrize("name", ["deploy", "swap", "stop", "tune"])
def test_the_targets_are_published_last(name):
    plays = yaml.safe_load((PLAYBOOKS / f"{name}.yml").read_text())
    assert steps(plays[-1])[-1] == TARGETS
    assert [step for play in plays for step in steps(play)].count(TARGETS) == 1


def test_a_rollout_publishes_each_batch():
    batches = next(play for play in yaml.safe_load((PLAYBOOKS / "rollout.yml").read_text()) if "serial" in play)
    assert steps(batches)[-1] == TARGETS


ROUTER_HOSTS = "{{ vllm_router_target_hosts | default('vllm_routers') }}"


def test_monitoring_runs_prometheus_then_publishes_every_host_and_router():
    prometheus, targets, routers = yaml.safe_load((PLAYBOOKS / "monitoring.yml").read_text())
    assert (prometheus["hosts"], steps(prometheus)) == ("vllm_monitoring", ["llmops.vllm.vllm_prometheus"])
    assert steps(targets) == [TARGETS]
    assert (routers["hosts"], steps(routers)) == (ROUTER_HOSTS, [TARGETS])


def test_router_yml_publishes_the_routers_last():
    plays = yaml.safe_load((PLAYBOOKS / "router.yml").read_text())
    assert (plays[-1]["hosts"], steps(plays[-1])) == (ROUTER_HOSTS, [TARGETS])
