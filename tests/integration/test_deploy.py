"""The deployment that every other integration test builds on."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tiny_main_pid(host) -> str:
    return host.sh("systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()


def test_deployed_model_is_listed(deployed):
    result = deployed.module(
        "ansible.builtin.uri",
        url=f"{deployed.endpoint}/v1/models",
        headers={"Authorization": f"Bearer {deployed.api_key}"},
    )
    assert not result.get("failed"), result
    assert [model["id"] for model in result["json"]["data"]] == ["tiny"]


def test_one_role_of_deploy_yml_runs_alone_with_its_tag(deployed):
    """`--tags vllm_server` rewrites the unit alone: the install role's record of the build is still there."""
    proc = deployed.playbook("playbooks/deploy.yml", "-e", "model=tiny", "--tags", "vllm_server")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "Create the venv" not in proc.stdout
    assert "changed=0" in proc.stdout.split("PLAY RECAP")[1]


def test_a_second_deploy_leaves_the_unit_s_boot_state_and_the_account_to_what_the_host_says(deployed):
    """The start reads the unit's state at boot, the preflight the service's account: where the host has them as
    asked, systemd_service, group, user and file do not run."""
    assert deployed.sh("systemctl is-enabled vllm-tiny.service").stdout.strip() == "enabled"
    assert deployed.sh("id -un vllm && id -gn vllm && stat -c '%U %G %a' /var/lib/vllm").stdout.split() == [
        "vllm", "vllm", "vllm", "vllm", "750"
    ]  # fmt: skip
    proc = deployed.playbook("playbooks/deploy.yml", "-e", "model=tiny")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for task in ("Enable at boot vllm-tiny.service", "Create the service's group", "Create the service's user",
                 "Create the service's home"):  # fmt: skip
        output = proc.stdout.split(task, 1)[1].split("TASK [", 1)[0]
        assert f"skipping: [{deployed.name}]" in output, (task, output)
    assert "changed=0" in proc.stdout.split("PLAY RECAP")[1]


def test_an_account_changed_by_hand_is_put_back_by_the_next_deploy(deployed):
    """A user or home that differs from what the role asks makes the account's tasks run, and only they change."""
    deployed.sh("usermod -s /bin/sh vllm && chmod 0755 /var/lib/vllm")
    proc = deployed.playbook("playbooks/deploy.yml", "-e", "model=tiny")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for task in ("Create the service's user", "Create the service's home"):
        output = proc.stdout.split(task, 1)[1].split("TASK [", 1)[0]
        assert f"changed: [{deployed.name}]" in output, (task, output)
    assert "changed=2" in proc.stdout.split("PLAY RECAP")[1]
    assert deployed.sh("getent passwd vllm | cut -d: -f7; stat -c %a /var/lib/vllm").stdout.split() == [
        "/usr/sbin/nologin", "750"
    ]  # fmt: skip


def test_the_server_holds_the_open_files_its_unit_asks_for(deployed):
    """LimitNOFILE= as the inventory sets it (what the container's systemd can grant), in the server's own limits."""
    asked = json.loads(deployed.inventory.read_text())["vllm_hosts"]["hosts"][deployed.name]["vllm_server_limit_nofile"]
    main_pid = tiny_main_pid(deployed)
    limits = deployed.sh(f"grep '^Max open files' /proc/{main_pid}/limits").stdout.split()
    assert limits[3:5] == [str(asked), str(asked)], limits


def test_a_deploy_that_renews_the_venv_s_packaging_restarts_its_instances(deployed):
    """A newer collection's guard in the venv: the running server must start again to run it, once."""
    guard = deployed.sh("ls /opt/vllm/venv/lib/python3*/site-packages/llmops_vllm_dev_guard.py").stdout.strip()
    shipped = (ROOT / "roles" / "vllm_install" / "files" / "llmops_vllm_dev_guard.py").read_text()
    main_pid = tiny_main_pid(deployed)
    deployed.sh(f"echo '# the guard of an older release of the collection' >> {guard}")
    proc = deployed.playbook("playbooks/deploy.yml", "-e", "model=tiny")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert deployed.sh(f"cat {guard}").stdout == shipped
    restarted = tiny_main_pid(deployed)
    assert restarted not in ("0", main_pid), (main_pid, restarted)
    again = deployed.playbook("playbooks/deploy.yml", "-e", "model=tiny")
    assert again.returncode == 0 and "changed=0" in again.stdout.split("PLAY RECAP")[1], again.stdout[-3000:]
    assert tiny_main_pid(deployed) == restarted
