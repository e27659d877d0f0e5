# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The group planner on the real config.json of MiniMax-M2.5 and Kimi-K2.5, over two and four 8-GPU HGX hosts."""

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.plan.group_planner import (
    Placement,
    group_serve_args,
    plan_group,
)
from ansible_collections.llmops.vllm.plugins.module_utils.plan.model_shape import PlanInputError

CONFIGS = {"minimax_m25": "MiniMax-M2.5", "kimi_k25": "Kimi-K2.5"}


@pytest.fixture
def hosts(hgx_host):
    """`hosts(kind, count)`: hosts h200-1, h200-2, ... (or h100-...) at 10.0.0.1, 10.0.0.2, ..."""
    return lambda kind, count: [hgx_host(kind, f"{kind.lower()}-{n}", f"10.0.0.{n}") for n in range(1, count + 1)]


@pytest.fixture
def group_plan(entry, config):
    """`group_plan(model, layout, group, hosts)`: plan_group of the shipped entry with that layout and group."""

    def run(model, layout, group, planned_hosts):
        checked = entry(model, layout=layout, alternatives={}, group={"hosts": "gpu_group", **group})
        return plan_group(checked, config(CONFIGS[model]), planned_hosts)

    return run


def by_rule(checks):
    return {check["rule"]: check for check in checks}


def test_minimax_tp8_dp2_ep16_over_two_h100_hosts_puts_one_rank_on_each(group_plan, hosts):
    result = group_plan(
        "minimax_m25",
        {"tensor_parallel_size": 8, "data_parallel_size": 2, "expert_parallel_size": 16},
        {"data_parallel_size_local": 1},
        hosts("H100", 2),
    )
    assert result["ok"] is True, result["reason"]
    assert (result["mode"], result["description"]) == ("data_parallel", "TP8 DP2 EP16 over 2 host(s) of gpu_group")
    placed = [(host["name"], host["role"], host["node_rank"], host["data_parallel_ranks"]) for host in result["hosts"]]
    assert placed == [("h100-1", "head", 0, [0]), ("h100-2", "worker", 1, [1])]
    head, worker = result["hosts"]
    assert (head["serves_api"], worker["serves_api"]) == (True, False)
    assert head["group_args"] == [
        "--data-parallel-size-local", "1",
        "--data-parallel-address", "10.0.0.1",
        "--data-parallel-rpc-port", "29550",
        "--api-server-count", "1",
    ]  # fmt: skip
    assert worker["group_args"] == [
        "--data-parallel-size-local", "1",
        "--data-parallel-start-rank", "1",
        "--data-parallel-address", "10.0.0.1",
        "--data-parallel-rpc-port", "29550",
        "--headless",
    ]  # fmt: skip
    assert worker["environment"] == {"VLLM_HOST_IP": "10.0.0.2"}
    # The experts are split 16 ways, attention and embeddings 8 ways; each rank keeps its own KV cache.
    memory = head["memory"]
    assert 230e9 / 16 < memory["weights_bytes"] < 230e9 / 8
    assert memory["max_concurrency_at_max_model_len"] % 2 == 0
    assert worker["memory"] == memory
    assert by_rule(result["checks"])["expert_parallel"]["detail"] == "16 of the 256 experts per rank"


def test_minimax_over_four_h200_hosts_with_an_api_server_on_each(group_plan, hosts):
    result = group_plan(
        "minimax_m25",
        {"tensor_parallel_size": 4, "data_parallel_size": 8, "expert_parallel_size": 32},
        {"data_parallel_size_local": 2, "load_balancing": "hybrid", "rpc_port": 13345},
        hosts("H200", 4),
    )
    assert result["ok"] is True, result["reason"]
    assert [host["data_parallel_ranks"] for host in result["hosts"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(host["serves_api"] for host in result["hosts"])
    assert [host["group_args"] for host in result["hosts"]] == [
        [
            "--data-parallel-size-local", "2",
            "--data-parallel-start-rank", str(start),
            "--data-parallel-address", "10.0.0.1",
            "--data-parallel-rpc-port", "13345",
            "--data-parallel-hybrid-lb",
            "--api-server-count", "1",
        ]
        for start in (0, 2, 4, 6)
    ]  # fmt: skip
    assert [host["gpus"] for host in result["hosts"]] == [8, 8, 8, 8]


def test_kimi_tp8_pp2_over_two_h100_hosts_keeps_tensor_parallel_within_each(group_plan, hosts):
    # 595 GB is 74 GB a GPU at TP 8, more than an 80 GB H100 leaves: one host cannot hold Kimi-K2.5.
    result = group_plan(
        "kimi_k25",
        {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
        {"interconnect": "infiniband"},
        hosts("H100", 2),
    )
    assert result["ok"] is True, result["reason"]
    assert result["mode"] == "model_parallel"
    head, worker = result["hosts"]
    assert head["group_args"] == [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29501",
        "--api-server-count",
        "1",
    ]
    assert worker["group_args"] == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501", "--headless"
    ]  # fmt: skip
    assert (head["data_parallel_ranks"], worker["serves_api"]) == ([], False)
    assert by_rule(result["checks"])["tensor_parallel_across_hosts"] == {
        "rule": "tensor_parallel_across_hosts",
        "status": "pass",
        "detail": "each tensor parallel group of 8 stays within a host (8 GPUs each)",
    }
    # Each pipeline stage holds half the layers: a sixteenth of the checkpoint on each GPU.
    assert head["memory"]["weights_bytes"] == pytest.approx(595e9 / 16, rel=1e-6)
    assert by_rule(head["checks"])["memory"]["status"] == "pass"


@pytest.mark.parametrize(
    ("model", "kind", "count", "layout", "group", "experts_per_rank"),
    [
        (
            "kimi_k25",
            "H100",
            4,
            {"tensor_parallel_size": 8, "data_parallel_size": 4, "expert_parallel_size": 32},
            {"data_parallel_size_local": 1},
            "12 of the 384 experts per rank",
        ),
        (
            "kimi_k25",
            "H200",
            2,
            {"tensor_parallel_size": 8, "data_parallel_size": 2, "expert_parallel_size": 16},
            {"data_parallel_size_local": 1},
            "24 of the 384 experts per rank",
        ),
        (
            "minimax_m25",
            "H200",
            2,
            {"tensor_parallel_size": 4, "data_parallel_size": 4, "expert_parallel_size": 16},
            {"data_parallel_size_local": 2},
            "16 of the 256 experts per rank",
        ),
    ],
)
def test_expert_parallel_layouts_that_pass(group_plan, hosts, model, kind, count, layout, group, experts_per_rank):
    result = group_plan(model, layout, group, hosts(kind, count))
    assert result["ok"] is True, result["reason"]
    assert result["failed_rules"] == []
    assert by_rule(result["checks"])["expert_parallel"]["detail"] == experts_per_rank


@pytest.mark.parametrize(
    ("model", "kind", "count", "layout", "group", "rules", "message"),
    [
        (
            "kimi_k25",
            "H100",
            2,
            {"tensor_parallel_size": 16},
            {"interconnect": "infiniband"},
            ["tensor_parallel_across_hosts"],
            "tensor parallel groups of 16 do not fit the 8 GPUs that each host gives, so they cross hosts and every "
            "layer's all-reduce goes over the network (infiniband), far slower than NVLink within a host; keep tensor "
            "parallelism within a host and spread over hosts with pipeline stages (tensor_parallel_size 8, "
            "pipeline_parallel_size 2)",
        ),
        (
            "minimax_m25",
            "H200",
            2,
            {"tensor_parallel_size": 16},
            {},
            ["quantization_alignment", "tensor_parallel_across_hosts"],
            "1536 / TP 16 = 96 is not a multiple of the FP8 weight block 128x128",
        ),
        (
            "kimi_k25",
            "H200",
            4,
            {"tensor_parallel_size": 16, "pipeline_parallel_size": 2},
            {},
            ["tensor_parallel_across_hosts"],
            "over the network (group.interconnect not stated)",
        ),
        (
            "minimax_m25",
            "H100",
            2,
            {"tensor_parallel_size": 8, "data_parallel_size": 4, "expert_parallel_size": 32},
            {"data_parallel_size_local": 2},
            ["gpu_count"],
            "h100-1: 2 data parallel rank(s) of TP8 need 16 GPUs; this host has 8; h100-2: 2 data parallel rank(s)",
        ),
        (
            "kimi_k25",
            "H100",
            2,
            {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
            {},
            ["memory"],
            "h100-1: weights 69.3 GiB + runtime 3.0 GiB per GPU exceed the 71.7 GiB that gpu_memory_utilization 0.9 "
            "leaves of 79.6 GiB",
        ),
        (
            "minimax_m25",
            "H200",
            2,
            {"tensor_parallel_size": 2, "data_parallel_size": 6, "expert_parallel_size": 12},
            {"data_parallel_size_local": 3},
            ["expert_parallel"],
            "256 experts are not divisible by the expert parallel size 12 (TP x DP)",
        ),
        (
            "minimax_m25",
            "H200",
            4,
            {"tensor_parallel_size": 4, "data_parallel_size": 4, "expert_parallel_size": 16},
            {"data_parallel_size_local": 2},
            ["host_count"],
            "data_parallel_size 4 at data_parallel_size_local 2 per host needs 2 hosts; inventory group gpu_group "
            "has 4",
        ),
        (
            "kimi_k25",
            "H200",
            1,
            {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
            {},
            ["hosts", "gpu_count"],
            "inventory group gpu_group has one host (h200-1): serve it with a one-host entry (a layout without group)",
        ),
    ],
)
def test_layouts_that_are_refused_name_every_rule(group_plan, hosts, model, kind, count, layout, group, rules, message):
    result = group_plan(model, layout, group, hosts(kind, count))
    assert result["ok"] is False
    assert result["failed_rules"] == rules
    assert message in result["reason"]


def test_an_inventory_group_without_hosts_is_refused(group_plan):
    result = group_plan("kimi_k25", {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, {}, [])
    assert (result["failed_rules"], result["hosts"]) == (["hosts"], [])
    assert result["reason"].endswith("inventory group gpu_group has no hosts")


def test_a_replica_that_does_not_split_evenly_over_the_hosts(group_plan, hosts):
    result = group_plan("kimi_k25", {"tensor_parallel_size": 8}, {}, hosts("H200", 4)[:3])
    assert result["failed_rules"] == ["host_count"]
    assert result["reason"].endswith("TP8 takes 8 GPUs, which do not split evenly over 3 hosts")
    # Each host's share is unknown, so its GPU rules are not checked.
    assert [host["checks"][0]["status"] for host in result["hosts"]] == ["skipped"] * 3


def test_tensor_parallel_may_cross_hosts_that_share_an_nvlink_domain(group_plan, hosts):
    result = group_plan("kimi_k25", {"tensor_parallel_size": 16}, {"interconnect": "nvlink"}, hosts("H100", 2))
    assert result["ok"] is True, result["reason"]
    crossing = by_rule(result["checks"])["tensor_parallel_across_hosts"]
    assert crossing["detail"] == "tensor parallel groups of 16 cross hosts over NVLink (group.interconnect nvlink)"


def test_hosts_with_other_gpus_are_refused(group_plan, hosts, hgx_host):
    mixed = [hgx_host("H200", "h200-1", "10.0.0.1"), hgx_host("H100", "h100-1", "10.0.0.2")]
    layout = {"tensor_parallel_size": 8, "data_parallel_size": 2, "expert_parallel_size": 16}
    result = group_plan("minimax_m25", layout, {"data_parallel_size_local": 1}, mixed)
    assert result["failed_rules"] == ["same_gpus"]
    assert result["reason"].endswith(
        "the hosts of a group need the same GPUs, as every rank takes the same share: "
        "h200-1: 8 x NVIDIA H200 (143771 MiB); h100-1: 8 x NVIDIA H100 80GB HBM3 (81559 MiB)"
    )


def test_a_host_with_fewer_gpus_is_refused_for_them_and_for_its_ranks(group_plan, hosts):
    pair = hosts("H200", 2)
    pair[1]["gpus"]["gpus"] = pair[1]["gpus"]["gpus"][:4]
    layout = {"tensor_parallel_size": 8, "data_parallel_size": 2, "expert_parallel_size": 16}
    result = group_plan("minimax_m25", layout, {"data_parallel_size_local": 1}, pair)
    assert result["failed_rules"] == ["same_gpus", "gpu_count"]
    assert "h200-1: 8 x NVIDIA H200 (143771 MiB); h200-2: 4 x NVIDIA H200 (143771 MiB)" in result["reason"]
    assert "h200-2: 1 data parallel rank(s) of TP8 need 8 GPUs; this host has 4" in result["reason"]


def test_a_host_without_gpus_beside_hosts_with_them_is_refused(group_plan, hosts):
    pair = hosts("H200", 2)
    pair[1]["gpus"] = {"present": False, "count": 0, "gpus": []}
    result = group_plan("kimi_k25", {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, {}, pair)
    assert result["failed_rules"] == ["gpus"]
    assert result["reason"].endswith(
        "h200-2: no GPUs in its facts (vllm_gpus.present false), unlike other hosts of the group"
    )


def test_a_group_of_cpu_hosts_is_planned_without_the_gpu_rules(group_plan, hosts):
    """vLLM's CPU build serves data parallel ranks over hosts too: the GPU rules are skipped, as on one CPU host."""
    pair = hosts("H200", 2)
    for host in pair:
        host["gpus"] = {"present": False, "count": 0, "gpus": []}
    result = group_plan("minimax_m25", {"data_parallel_size": 2}, {"data_parallel_size_local": 1}, pair)
    assert result["ok"] and result["failed_rules"] == []
    assert [check["status"] for host in result["hosts"] for check in host["checks"]] == ["skipped", "skipped"]
    assert result["hosts"][1]["group_args"][-1] == "--headless"


def test_every_address_problem_is_named_and_nothing_is_dialled(group_plan, hosts):
    four = hosts("H200", 4)
    four[0]["address"] = None
    four[1]["address"] = "h200-2.lan"
    four[2]["address"] = four[3]["address"] = "127.0.1.1"
    result = group_plan("kimi_k25", {"tensor_parallel_size": 8, "pipeline_parallel_size": 4}, {}, four)
    assert result["failed_rules"] == ["addresses"]
    assert result["reason"].endswith(
        "h200-1 has no address; h200-2's address 'h200-2.lan' is not an IP address, which VLLM_HOST_IP must be; "
        "h200-3's address 127.0.1.1 is not one that the other hosts can reach; h200-4's address 127.0.1.1 is not one "
        "that the other hosts can reach; h200-3, h200-4 share address 127.0.1.1 (each host needs an address of its "
        "own that the others reach)"
    )
    assert {(host["group_args"], host["environment"]) for host in result["hosts"]} == {(None, None)}


def test_the_head_named_in_the_group_is_node_rank_0(group_plan, hosts):
    result = group_plan(
        "kimi_k25", {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, {"head": "h100-2"}, hosts("H100", 2)
    )
    assert [(host["name"], host["role"], host["node_rank"]) for host in result["hosts"]] == [
        ("h100-2", "head", 0),
        ("h100-1", "worker", 1),
    ]
    assert result["hosts"][1]["group_args"] == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.2", "--master-port", "29501", "--headless"
    ]  # fmt: skip


def test_a_head_outside_the_group_is_refused(group_plan, hosts):
    result = group_plan(
        "kimi_k25", {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, {"head": "h100-9"}, hosts("H100", 2)
    )
    assert result["failed_rules"] == ["head"]
    assert result["reason"].endswith("group.head h100-9 is not a host of inventory group gpu_group (h100-1, h100-2)")


def test_the_network_devices_of_a_host_go_to_its_environment(group_plan, hosts):
    pair = hosts("H100", 2)
    pair[1].update(interface="ib0", ib_hca="mlx5_0,mlx5_1")
    result = group_plan("kimi_k25", {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, {}, pair)
    assert [host["environment"] for host in result["hosts"]] == [
        {"VLLM_HOST_IP": "10.0.0.1"},
        {
            "VLLM_HOST_IP": "10.0.0.2",
            "GLOO_SOCKET_IFNAME": "ib0",
            "NCCL_SOCKET_IFNAME": "ib0",
            "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        },
    ]


@pytest.mark.parametrize(
    ("layout", "group", "placement", "expected"),
    [
        (
            {"data_parallel_size": 4},
            {"data_parallel_size_local": 2, "load_balancing": "internal", "rpc_port": 29550},
            Placement(node_rank=0, data_parallel_ranks=(0, 1), headless=False),
            ["--data-parallel-size-local", "2", "--data-parallel-address", "192.168.8.1", "--data-parallel-rpc-port",
             "29550", "--api-server-count", "1"],
        ),
        (
            {"data_parallel_size": 4},
            {"data_parallel_size_local": 2, "load_balancing": "internal", "rpc_port": 29550},
            Placement(node_rank=1, data_parallel_ranks=(2, 3), headless=True),
            ["--data-parallel-size-local", "2", "--data-parallel-start-rank", "2", "--data-parallel-address",
             "192.168.8.1", "--data-parallel-rpc-port", "29550", "--headless"],
        ),
        (
            {"data_parallel_size": 4},
            {"data_parallel_size_local": 2, "load_balancing": "hybrid", "rpc_port": 29550},
            Placement(node_rank=0, data_parallel_ranks=(0, 1), headless=False),
            ["--data-parallel-size-local", "2", "--data-parallel-start-rank", "0", "--data-parallel-address",
             "192.168.8.1", "--data-parallel-rpc-port", "29550", "--data-parallel-hybrid-lb",
             "--api-server-count", "1"],
        ),
        (
            {"tensor_parallel_size": 8, "pipeline_parallel_size": 4},
            {"load_balancing": "internal", "master_port": 29501},
            Placement(node_rank=3, data_parallel_ranks=(), headless=True),
            ["--nnodes", "4", "--node-rank", "3", "--master-addr", "192.168.8.1", "--master-port", "29501",
             "--headless"],
        ),
    ],
)  # fmt: skip
def test_group_serve_args_are_the_flags_of_vllms_multi_node_serving(layout, group, placement, expected):
    assert group_serve_args(layout, group, placement, 4, "192.168.8.1") == expected


def test_a_one_host_entry_is_not_planned_as_a_group(entry, config, hosts):
    with pytest.raises(PlanInputError, match="kimi_k25 has no group: it is planned on one host"):
        plan_group(entry("kimi_k25"), config("Kimi-K2.5"), hosts("H200", 2))


@pytest.mark.parametrize(
    ("listed", "message"),
    [
        ("h200-1,h200-2", "hosts must be a list of hosts"),
        ([{"address": "10.0.0.1"}], "every host needs its inventory name"),
        ([{"name": "h200-1"}, {"name": "h200-1"}], r"hosts \['h200-1'\] are listed more than once"),
        ([{"name": "h200-1", "gpus": {"present": True, "gpus": "eight"}}], "GPU facts: gpus must be a list"),
    ],
)
def test_malformed_hosts_are_named(entry, config, listed, message):
    pair = entry("kimi_k25", layout={"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, group={"hosts": "pair"})
    with pytest.raises(PlanInputError, match=message):
        plan_group(pair, config("Kimi-K2.5"), listed)
