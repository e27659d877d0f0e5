"""The deployment that every other integration test builds on."""


def test_deployed_model_is_listed(deployed):
    result = deployed.module(
        "ansible.builtin.uri",
        url=f"{deployed.endpoint}/v1/models",
        headers={"Authorization": f"Bearer {deployed.api_key}"},
    )
    assert not result.get("failed"), result
    assert [model["id"] for model in result["json"]["data"]] == ["tiny"]
