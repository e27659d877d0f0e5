from pathlib import Path

import pytest
import yaml

from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import (
    DERIVED_KEYS,
    ENTRY_DEFAULTS,
    CatalogError,
    catalog_files,
    check_entry,
    find_entry_file,
)

COLLECTION_CATALOG = Path(__file__).resolve().parents[5] / "models"
MINIMAL = {"source": {"kind": "generated"}, "served_name": "tiny"}


def test_minimal_entry_gets_defaults_and_its_name():
    entry = check_entry("tiny", dict(MINIMAL))
    assert entry["name"] == "tiny"
    assert entry["layout"] == {"tensor_parallel_size": 1}
    assert entry["load_timeout"] == ENTRY_DEFAULTS["load_timeout"]
    assert entry["extra_args"] == []


def test_env_values_become_strings():
    entry = check_entry("tiny", {**MINIMAL, "env": {"VLLM_CPU_KVCACHE_SPACE": 1}})
    assert entry["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sevred_name": "x"}, r"unknown keys \['sevred_name'\]"),
        ({"source": {"kind": "ftp"}}, "source must be a mapping whose kind is one of"),
        ({"source": {"kind": "hub"}}, "a hub source needs repo"),
        ({"source": {"kind": "hub", "repo": "no-owner"}}, "a hub source needs repo"),
        ({"source": {"kind": "hub", "repo": "a/b", "revision": ""}}, "source.revision must be a branch"),
        ({"source": {"kind": "hub", "repo": "a/b", "allow_patterns": "*.json"}}, "allow_patterns must be a list"),
        ({"source": {"kind": "hub", "repo": "a/b", "mirror": "http://x"}}, r"unknown keys \['mirror'\] for kind hub"),
        ({"source": {"kind": "local", "path": "models/x"}}, "a local source needs path, an absolute directory"),
        ({"source": {"kind": "generated", "seed": "1"}}, "source.seed must be a whole number"),
        ({"served_name": "a b"}, "served_name must not contain whitespace"),
        ({"served_name": ""}, "served_name must be a non-empty string"),
        ({"layout": {"tensor_parallel_size": 0}}, r"layout.tensor_parallel_size must be a whole number"),
        ({"layout": [4]}, "layout must be a mapping of parallel sizes"),
        ({"alternatives": {"ep8": {"tp": 8}}}, r"alternatives.ep8: layout has unknown keys \['tp'\]"),
        (
            {"alternatives": {"ep8": {"tensor_parallel_size": 4, "expert_parallel_size": 8}}},
            "alternatives.ep8: layout.expert_parallel_size 8 is not possible",
        ),
        ({"extra_args": ["--max-num-seqs", "8"]}, "--max-num-seqs in extra_args conflicts with the spec"),
        ({"max_num_seqs": 0}, "max_num_seqs must be a whole number of at least 1"),
        ({"load_timeout": 0}, "load_timeout must be a whole number of seconds"),
        ({"drain_timeout": -1}, "drain_timeout must be a whole number of seconds"),
        ({"extra_args": "--enforce-eager"}, "extra_args must be a list of strings"),
        ({"checkpoint_size": "230"}, r"checkpoint_size must be a number of bytes or a size with a unit .* got '230'"),
        ({"checkpoint_size": "0 GB"}, "checkpoint_size must be a number of bytes"),
        ({"checkpoint_size": True}, "checkpoint_size must be a number of bytes"),
        ({"quantization": "fp6"}, r"quantization must be one of \['none', 'fp8', "),
        ({"requires": ["blackwell"]}, "requires must be a mapping"),
        ({"requires": {"gpu": "B200"}}, r"requires has unknown keys \['gpu'\]"),
        ({"requires": {"min_compute_capability": "blackwell"}}, "min_compute_capability must be MAJOR.MINOR"),
    ],
)
def test_bad_entries_name_the_key(changes, message):
    with pytest.raises(CatalogError, match=message):
        check_entry("tiny", {**MINIMAL, **changes})


@pytest.mark.parametrize(
    ("size", "expected"),
    [("230 GB", 230 * 10**9), ("540GiB", 540 * 2**30), ("1.2 TB", 1_200_000_000_000), (4096, 4096)],
)
def test_checkpoint_size_becomes_bytes(size, expected):
    entry = check_entry("tiny", {**MINIMAL, "checkpoint_size": size})
    assert entry["checkpoint_bytes"] == expected


def test_planning_facts_default_to_unknown():
    entry = check_entry("tiny", dict(MINIMAL))
    assert (entry["checkpoint_bytes"], entry["quantization"], entry["requires"]) == (None, None, {})


def test_each_kind_of_source_is_accepted():
    sources = [
        {"kind": "hub", "repo": "MiniMaxAI/MiniMax-M2.5", "revision": "0f3c2b1a", "allow_patterns": ["*.json"]},
        {"kind": "local", "path": "/data/models/minimax"},
        {"kind": "generated", "hidden_size": 512, "seed": 3},
    ]
    for source in sources:
        assert check_entry("tiny", {**MINIMAL, "source": source})["source"] == source


def test_missing_required_keys():
    with pytest.raises(CatalogError, match=r"missing required keys \['served_name'\]"):
        check_entry("tiny", {"source": {"kind": "generated"}})


def test_shipped_entries_are_valid():
    files = catalog_files([str(COLLECTION_CATALOG)])
    assert {"tiny", "minimax_m25", "kimi_k25", "kimi_k25_nvfp4"} <= set(files)
    for name, path in files.items():
        entry = check_entry(name, yaml.safe_load(Path(path).read_text()))
        assert entry["name"] == name


def test_user_directory_overrides_the_collection(tmp_path):
    (tmp_path / "tiny.yml").write_text("source: {kind: generated}\nserved_name: my-tiny\n")
    (tmp_path / "mine.yaml").write_text("source: {kind: generated}\nserved_name: mine\n")
    (tmp_path / "README.md").write_text("not an entry")
    files = catalog_files([str(tmp_path), str(COLLECTION_CATALOG)])
    assert files["tiny"] == str(tmp_path / "tiny.yml")
    assert files["mine"] == str(tmp_path / "mine.yaml")
    assert "README" not in files


def test_unknown_name_lists_every_known_name(tmp_path):
    (tmp_path / "mine.yml").write_text("source: {kind: generated}\nserved_name: mine\n")
    with pytest.raises(CatalogError) as error:
        find_entry_file("llama", [str(tmp_path), str(COLLECTION_CATALOG)])
    assert "unknown model 'llama'" in str(error.value)
    assert "kimi_k25, kimi_k25_nvfp4, mine, minimax_m25, tiny" in str(error.value)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(CatalogError, match=r"catalog directory .*nowhere.* does not exist"):
        catalog_files([str(tmp_path / "nowhere")])


# Multi-host entries: the layout counts over the whole group, `group` places it.
DATA_PARALLEL_GROUP = {
    **MINIMAL,
    "layout": {"tensor_parallel_size": 8, "data_parallel_size": 2, "expert_parallel_size": 16},
    "group": {"hosts": "h200_pair", "data_parallel_size_local": 1},
}
MODEL_PARALLEL_GROUP = {
    **MINIMAL,
    "layout": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
    "group": {"hosts": "h100_pair", "head": "gpu-a", "interconnect": "infiniband"},
}


def test_a_data_parallel_group_gets_vllms_rpc_port_and_one_api_server():
    group = check_entry("tiny", DATA_PARALLEL_GROUP)["group"]
    assert group == {
        "hosts": "h200_pair",
        "head": None,
        "data_parallel_size_local": 1,
        "load_balancing": "internal",
        "interconnect": None,
        "rpc_port": 29550,
        "master_port": None,
    }


def test_a_replica_over_hosts_gets_vllms_master_port():
    group = check_entry("tiny", MODEL_PARALLEL_GROUP)["group"]
    assert (group["master_port"], group["rpc_port"], group["data_parallel_size_local"]) == (29501, None, None)
    assert (group["head"], group["interconnect"]) == ("gpu-a", "infiniband")


def test_a_checked_group_entry_checks_again_the_same():
    # vllm_plan checks the entry that the lookup already checked.
    for raw in (DATA_PARALLEL_GROUP, MODEL_PARALLEL_GROUP):
        checked = check_entry("tiny", raw)
        again = check_entry("tiny", {key: value for key, value in checked.items() if key not in DERIVED_KEYS})
        assert again == checked


def test_one_host_entries_hold_no_group():
    assert "group" not in check_entry("tiny", dict(MINIMAL))


def with_group(base, layout=None, **group):
    return {**base, "layout": layout or base["layout"], "group": {**base["group"], **group}}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**MINIMAL, "group": "h200_pair"}, "group must be a mapping with hosts"),
        ({**MINIMAL, "group": {"head": "gpu-a"}}, "group.hosts must name an inventory group"),
        (with_group(MODEL_PARALLEL_GROUP, hosts="gpu-pair"), r"group.hosts must name an inventory group .* 'gpu-pair'"),
        (with_group(MODEL_PARALLEL_GROUP, heads="gpu-a"), r"group has unknown keys \['heads'\]"),
        (with_group(MODEL_PARALLEL_GROUP, head="gpu a"), "group.head must be the inventory name of one host"),
        (with_group(MODEL_PARALLEL_GROUP, load_balancing="router"), "group.load_balancing must be one of"),
        (with_group(MODEL_PARALLEL_GROUP, interconnect="roce"), r"group.interconnect must be one of \['ethernet', "),
        (with_group(MODEL_PARALLEL_GROUP, master_port=70000), "group.master_port must be a port from 1 to 65535"),
        (
            with_group(MODEL_PARALLEL_GROUP, data_parallel_size_local=1),
            r"group.data_parallel_size_local places data parallel ranks, and the layout has none",
        ),
        (with_group(MODEL_PARALLEL_GROUP, rpc_port=13345), "group.rpc_port is dialled by data parallel hosts"),
        (
            with_group(MODEL_PARALLEL_GROUP, load_balancing="hybrid"),
            r"group.load_balancing hybrid balances data parallel ranks, and the layout has one replica",
        ),
        (
            with_group(DATA_PARALLEL_GROUP, data_parallel_size_local=None),
            "group.data_parallel_size_local .the data parallel ranks on each host. must be a whole number of at least "
            "1 with data_parallel_size 2, got None",
        ),
        (
            with_group(
                DATA_PARALLEL_GROUP,
                {"tensor_parallel_size": 2, "data_parallel_size": 4, "expert_parallel_size": 8},
                data_parallel_size_local=3,
            ),
            "group.data_parallel_size_local 3 does not divide data_parallel_size 4",
        ),
        (
            with_group(DATA_PARALLEL_GROUP, data_parallel_size_local=2),
            r"group.data_parallel_size_local 2 puts all 2 data parallel ranks on one host: that is a one-host entry",
        ),
        (with_group(DATA_PARALLEL_GROUP, master_port=29501), "group.master_port is the rendezvous of one replica"),
        (with_group(DATA_PARALLEL_GROUP, rpc_port="port"), "group.rpc_port must be a port from 1 to 65535"),
        (
            with_group(
                DATA_PARALLEL_GROUP, {"tensor_parallel_size": 8, "data_parallel_size": 2, "expert_parallel_size": 8}
            ),
            "layout.expert_parallel_size 8 is not possible: vLLM spreads experts over tensor_parallel_size x "
            "data_parallel_size = 16 ranks",
        ),
        (
            {**DATA_PARALLEL_GROUP, "alternatives": {"tp4": {"tensor_parallel_size": 4}}},
            r"a multi-host entry has one layout; alternatives \['tp4'\] need entries of their own",
        ),
        (
            {**DATA_PARALLEL_GROUP, "extra_args": ["--data-parallel-rpc-port=13345"]},
            "--data-parallel-rpc-port in extra_args: the group writes it for each host",
        ),
        ({**DATA_PARALLEL_GROUP, "extra_args": ["--headless"]}, "--headless in extra_args: the group writes it"),
        ({**DATA_PARALLEL_GROUP, "env": {"VLLM_HOST_IP": "10.0.0.1"}}, "env sets VLLM_HOST_IP, which each host"),
        ({**DATA_PARALLEL_GROUP, "env": {"NCCL_IB_HCA": "mlx5"}}, "env sets NCCL_IB_HCA, which each host"),
    ],
)
def test_bad_group_entries_name_the_key(raw, message):
    with pytest.raises(CatalogError, match=f"catalog entry 'tiny': {message}"):
        check_entry("tiny", raw)
