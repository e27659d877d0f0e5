from pathlib import Path

import pytest
import yaml

from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import (
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
