import pytest
from ansible.errors import AnsibleLookupError
from ansible.plugins.loader import lookup_loader


@pytest.fixture
def catalog():
    return lookup_loader.get("llmops.vllm.model_catalog")


def test_collection_entry(catalog):
    [entry] = catalog.run(["tiny"], variables={})
    assert entry["name"] == "tiny"
    assert entry["served_name"] == "tiny"
    assert entry["source"] == {"kind": "generated"}


def test_user_entry_comes_first(catalog, tmp_path):
    (tmp_path / "tiny.yml").write_text("source: {kind: generated}\nserved_name: tiny-override\nmax_num_seqs: 8\n")
    [entry] = catalog.run(["tiny"], variables={}, paths=[str(tmp_path)])
    assert entry["served_name"] == "tiny-override"
    assert entry["max_num_seqs"] == 8


def test_first_paths_come_before_the_user_s_given_as_one_string(catalog, tmp_path):
    """A tune's candidates (first_paths) before the user's catalog, which -e may give as one path string."""
    first, user = tmp_path / "candidates", tmp_path / "user"
    for directory, served in ((first, "candidate"), (user, "user")):
        directory.mkdir()
        (directory / "tiny.yml").write_text(f"source: {{kind: generated}}\nserved_name: {served}\n")
    [entry] = catalog.run(["tiny"], variables={}, paths=str(user), first_paths=[str(first)])
    assert entry["served_name"] == "candidate"
    [entry] = catalog.run(["tiny"], variables={}, paths=str(user), first_paths=[])
    assert entry["served_name"] == "user"


def test_unknown_model_lists_known_ones(catalog):
    with pytest.raises(
        AnsibleLookupError, match=r"unknown model 'nope'.*knows: kimi_k25, kimi_k25_nvfp4, minimax_m25, tiny"
    ):
        catalog.run(["nope"], variables={})


def test_shipped_entries_carry_their_planning_facts(catalog):
    minimax, kimi, nvfp4 = catalog.run(["minimax_m25", "kimi_k25", "kimi_k25_nvfp4"], variables={})
    assert (minimax["checkpoint_bytes"], minimax["quantization"]) == (230 * 10**9, "fp8")
    assert (kimi["checkpoint_bytes"], kimi["quantization"], kimi["load_timeout"]) == (595 * 10**9, "int4", 1800)
    assert nvfp4["requires"] == {"min_compute_capability": "10.0"}
    assert nvfp4["source"]["repo"] == "nvidia/Kimi-K2.5-NVFP4"


def test_broken_yaml_is_reported(catalog, tmp_path):
    (tmp_path / "broken.yml").write_text("source: [unclosed\n")
    with pytest.raises(AnsibleLookupError, match="cannot read catalog entry 'broken'"):
        catalog.run(["broken"], variables={}, paths=[str(tmp_path)])
