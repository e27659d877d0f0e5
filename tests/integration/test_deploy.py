"""The deployment that every other integration test builds on."""

import json


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


def test_the_server_holds_the_open_files_its_unit_asks_for(deployed):
    """LimitNOFILE= as the inventory sets it (what the container's systemd can grant), in the server's own limits."""
    asked = json.loads(deployed.inventory.read_text())["vllm_hosts"]["hosts"][deployed.name]["vllm_server_limit_nofile"]
    main_pid = deployed.sh("systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
    limits = deployed.sh(f"grep '^Max open files' /proc/{main_pid}/limits").stdout.split()
    assert limits[3:5] == [str(asked), str(asked)], limits
