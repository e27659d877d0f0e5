"""The deployment that every other integration test builds on."""


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
