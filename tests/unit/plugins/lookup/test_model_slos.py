import pytest
from ansible.errors import AnsibleLookupError
from ansible.plugins.loader import lookup_loader


@pytest.fixture
def slos():
    return lookup_loader.get("llmops.vllm.model_slos")


def test_the_collection_catalog_sets_no_slo(slos):
    assert slos.run([], variables={}) == [{}]


def test_entries_of_the_user_set_slos_and_override_the_collection(slos, tmp_path):
    (tmp_path / "tiny.yml").write_text("source: {kind: generated}\nserved_name: tiny\nslo: {p99_ttft_ms: 500}\n")
    (tmp_path / "chat.yml").write_text(
        "source: {kind: hub, repo: org/chat}\nserved_name: chat\nslo: {p50_itl_ms: 20, p99_e2el_ms: 30000}\n"
    )
    (tmp_path / "batch.yml").write_text("source: {kind: hub, repo: org/batch}\nserved_name: batch\n")
    assert slos.run([], variables={}, paths=[str(tmp_path)]) == [
        {"chat": {"p50_itl_ms": 20, "p99_e2el_ms": 30000}, "tiny": {"p99_ttft_ms": 500}}
    ]


def test_a_bad_entry_fails_with_its_name(slos, tmp_path):
    (tmp_path / "tiny.yml").write_text("source: {kind: generated}\nserved_name: tiny\nslo: {ttft: 500}\n")
    with pytest.raises(AnsibleLookupError, match="catalog entry 'tiny': slo has an unknown key 'ttft'"):
        slos.run([], variables={}, paths=[str(tmp_path)])


def test_terms_are_refused(slos):
    with pytest.raises(AnsibleLookupError, match="model_slos takes no terms"):
        slos.run(["tiny"], variables={})
