import json

import pytest

from ansible_collections.llmops.vllm.plugins.modules import vllm_plan

TOKEN = "hf_unit_test_token_4f1c"
CONFIG_URL = "/MiniMaxAI/MiniMax-M2.5/resolve/main/config.json"


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(vllm_plan.main, args, fails)


@pytest.fixture
def hub(hub_server, config):
    """A gated hub on loopback holding MiniMax-M2.5's config.json."""
    return hub_server({CONFIG_URL: json.dumps(config("MiniMax-M2.5")).encode()}, token=TOKEN)


def test_fetches_config_json_alone_from_the_hub_with_the_token(run, hub, entry, seed_box):
    endpoint, requests = hub
    args = {"model": entry("minimax_m25"), "hub_repo": "MiniMaxAI/MiniMax-M2.5", "hub_token": TOKEN}
    result = run({**args, "hub_endpoint": endpoint, "gpus": seed_box})
    assert requests == [
        {"path": "/MiniMaxAI/MiniMax-M2.5/resolve/main/config.json", "authorization": f"Bearer {TOKEN}"}
    ]
    assert result["changed"] is False
    assert result["ok"] is True
    assert result["layout"] == {"tensor_parallel_size": 4}
    assert TOKEN not in json.dumps(result)


def test_a_gated_repository_without_token_says_so(run, hub, entry):
    endpoint = hub[0]
    result = run(
        {"model": entry("minimax_m25"), "hub_repo": "MiniMaxAI/MiniMax-M2.5", "hub_endpoint": endpoint},
        fails=True,
    )
    assert "HTTP 401" in result["msg"]
    assert "set hub_token" in result["msg"]


def test_rejected_layout_fails_with_the_rule_and_the_layouts_that_pass(run, hub, entry, seed_box):
    endpoint = hub[0]
    args = {"model": entry("minimax_m25"), "hub_repo": "MiniMaxAI/MiniMax-M2.5", "hub_token": TOKEN}
    result = run(
        {**args, "hub_endpoint": endpoint, "gpus": seed_box, "layout": {"tensor_parallel_size": 8}}, fails=True
    )
    assert result["msg"].startswith("Layout rule quantization_alignment failed for minimax_m25 TP8")
    assert result["failed_rule"] == "quantization_alignment"
    assert {"tensor_parallel_size": 8, "expert_parallel_size": 8} in [
        item["layout"] for item in result["passing_layouts"]
    ]


def test_local_checkpoint_gives_config_and_size(run, tmp_path, config, entry, seed_box):
    (tmp_path / "config.json").write_text(json.dumps(config("MiniMax-M2.5")))
    # Sparse files: the planner reads sizes, not contents.
    for shard in range(4):
        with open(tmp_path / f"model-{shard:05d}.safetensors", "wb") as stream:
            stream.truncate(60 * 2**30)
    result = run(
        {"model": entry("minimax_m25", checkpoint_size=None), "config_path": str(tmp_path), "gpus": seed_box},
    )
    assert result["memory"]["weights_bytes"] == 60 * 2**30
    assert result["serve_args"][:2] == ["--model", "MiniMaxAI/MiniMax-M2.5"]


def test_mla_over_pcie_is_an_ansible_warning(run, config, entry, seed_box):
    result = run({"model": entry("kimi_k25"), "config": config("Kimi-K2.5"), "gpus": seed_box})
    assert result["ok"] is True
    assert any(
        warning.startswith("MLA model with tensor parallel 8 over PCIe") for warning in result["layout_warnings"]
    )


def test_check_mode_plans_the_same(run, config, entry, seed_box):
    result = run(
        {"model": entry("kimi_k25"), "config": config("Kimi-K2.5"), "gpus": seed_box, "_ansible_check_mode": True}
    )
    assert result["changed"] is False
    assert result["ok"] is True


def test_cpu_host_without_config_proceeds(run, entry):
    result = run({"model": entry("tiny"), "model_path": "/var/lib/vllm/models/tiny"})
    assert result["ok"] is True
    assert result["serve_args"][:2] == ["--model", "/var/lib/vllm/models/tiny"]
    assert [check["status"] for check in result["checks"]] == ["skipped", "skipped"]


def test_missing_local_config_is_named(run, tmp_path, entry):
    result = run({"model": entry("tiny"), "config_path": str(tmp_path / "none")}, fails=True)
    assert f"Cannot read the config.json of tiny at {tmp_path / 'none'}" in result["msg"]


def test_bad_catalog_entry_is_refused(run, entry):
    result = run({"model": {**entry("tiny"), "checkpoint_size": "lots"}}, fails=True)
    assert "checkpoint_size must be a number of bytes or a size with a unit" in result["msg"]


def test_config_sources_exclude_each_other(run, config, entry):
    result = run(
        {"model": entry("tiny"), "config": config("MiniMax-M2.5"), "hub_repo": "MiniMaxAI/MiniMax-M2.5"}, fails=True
    )
    assert "mutually exclusive" in result["msg"]


def test_a_pull_request_revision_is_one_path_segment(run, hub_server, config, entry):
    path = "/MiniMaxAI/MiniMax-M2.5/resolve/refs%2Fpr%2F1/config.json"
    endpoint, requests = hub_server({path: json.dumps(config("MiniMax-M2.5")).encode()})
    args = {"model": entry("minimax_m25"), "hub_repo": "MiniMaxAI/MiniMax-M2.5", "hub_revision": "refs/pr/1"}
    result = run({**args, "hub_endpoint": endpoint})
    assert [request["path"] for request in requests] == [path]
    assert result["checks"][0] == {
        "rule": "max_model_len",
        "status": "pass",
        "detail": "196608 of the model's 196608 positions",
    }


def test_with_a_mirror_the_config_comes_from_the_mirror_not_the_hub(run, hub_server, config, entry, seed_box):
    # The weights will come from MIRROR/owner/name: so does the config, and the hub is never asked.
    mirror, requests = hub_server(
        {"/models/MiniMaxAI/MiniMax-M2.5/config.json": json.dumps(config("MiniMax-M2.5")).encode()}
    )
    args = {"model": entry("minimax_m25"), "hub_repo": "MiniMaxAI/MiniMax-M2.5", "gpus": seed_box}
    result = run({**args, "mirror": f"{mirror}/models/", "hub_endpoint": "http://127.0.0.1:9"})
    assert [request["path"] for request in requests] == ["/models/MiniMaxAI/MiniMax-M2.5/config.json"]
    assert result["layout"] == {"tensor_parallel_size": 4}


def test_a_mounted_mirror_is_read_as_files(run, tmp_path, config, entry):
    (tmp_path / "MiniMaxAI" / "MiniMax-M2.5").mkdir(parents=True)
    (tmp_path / "MiniMaxAI" / "MiniMax-M2.5" / "config.json").write_text(json.dumps(config("MiniMax-M2.5")))
    args = {"model": entry("minimax_m25"), "hub_repo": "MiniMaxAI/MiniMax-M2.5", "mirror": str(tmp_path)}
    assert run(args)["checks"][0]["rule"] == "max_model_len"
    missing = run({**args, "hub_repo": "MiniMaxAI/Absent"}, fails=True)
    assert missing["msg"].startswith("Cannot read config.json of MiniMaxAI/Absent at main: cannot read config.json:")


def group_entry(entry, **group):
    return entry(
        "tiny", layout={"data_parallel_size": 2}, group={"hosts": "pair", "data_parallel_size_local": 1, **group}
    )


CPU_HOSTS = [
    {"name": "host-a", "address": "10.0.0.1", "gpus": {"present": False, "count": 0, "gpus": []}},
    {"name": "host-b", "address": "10.0.0.2", "gpus": {"present": False, "count": 0, "gpus": []}},
]


def test_a_multi_host_entry_returns_this_host_s_part_of_the_group(run, entry):
    result = run({"model": group_entry(entry), "group_hosts": CPU_HOSTS, "group_host": "host-b"})
    assert result["ok"] and result["layout"]["data_parallel_size"] == 2
    assert result["group"] == {
        "mode": "data_parallel",
        "hosts": ["host-a", "host-b"],
        "head": {"name": "host-a", "address": "10.0.0.1"},
        "role": "worker",
        "node_rank": 1,
        "data_parallel_ranks": [1],
        "serves_api": False,
        "environment": {"VLLM_HOST_IP": "10.0.0.2"},
        "args": ["--data-parallel-size-local", "1", "--data-parallel-start-rank", "1",
                 "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "29550", "--headless"],
    }  # fmt: skip
    assert result["summary"].endswith("host-b is the worker, data parallel rank(s) 1")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "it is a multi-host entry: give group_hosts, the name, address and GPU facts of every host of pair"),
        ({"group_hosts": CPU_HOSTS, "group_host": "host-c"}, "group_host 'host-c' is not one of the hosts of pair"),
        ({"group_hosts": CPU_HOSTS, "group_host": "host-a", "layout": "auto"}, "planned on its own layout"),
        ({"group_hosts": CPU_HOSTS[:1], "group_host": "host-a"}, "has one host (host-a): serve it with a one-host"),
    ],
)
def test_a_multi_host_entry_without_its_group_is_refused(run, entry, changes, message):
    assert message in run({"model": group_entry(entry), **changes}, fails=True)["msg"]
