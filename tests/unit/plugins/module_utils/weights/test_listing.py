"""What weights there are: the hub's file list (on the JSON shape of its model API, since the hub is not
reachable from the test machines), names the hub accepts, allow patterns and HTTP directory listings."""

from __future__ import annotations

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import (
    MANIFEST_NAME,
    PARTIAL_DIR,
    RemoteFile,
    WeightsError,
    hub_files,
    listing_links,
    repo_problem,
    revision_problem,
    select_files,
)


def test_hub_files_take_sizes_and_lfs_hashes(minimax_model_info):
    files = hub_files(minimax_model_info)
    assert files[1] == RemoteFile("config.json", 2734, None)
    assert files[2] == RemoteFile("model-00001-of-00126.safetensors", 1836036096, "9" * 64)
    assert sum(file.size for file in files) == 1519 + 2734 + 1836036096 + 1833910344 + 9012


def test_hub_files_without_sizes_are_refused():
    with pytest.raises(WeightsError, match=r"no size for 'config\.json'"):
        hub_files({"siblings": [{"rfilename": "config.json"}]})


@pytest.mark.parametrize("path", ["/etc/passwd", "../../etc/passwd", "a/../../b", "..", MANIFEST_NAME, ""])
def test_files_outside_the_directory_are_refused(path):
    with pytest.raises(WeightsError, match="outside the weights directory"):
        hub_files({"siblings": [{"rfilename": path, "size": 1}]})


def test_files_in_the_partial_directory_are_refused():
    with pytest.raises(WeightsError, match="unfinished files"):
        hub_files({"siblings": [{"rfilename": f"{PARTIAL_DIR}/model.safetensors", "size": 1}]})


@pytest.mark.parametrize(
    "repo", ["MiniMaxAI/MiniMax-M2.5", "moonshotai/Kimi-K2.5", "gpt2", "nvidia/Kimi-K2.5-NVFP4", "a_b/c.d"]
)
def test_repository_names_the_hub_accepts(repo):
    assert repo_problem(repo) is None


@pytest.mark.parametrize(
    ("repo", "why"),
    [
        ("llmops/..", "'..'"),
        ("../etc", "'..'"),
        ("owner/a..b", "'..'"),
        ("a/b/c", "one slash"),
        ("owner/", "each part"),
        ("/name", "each part"),
        ("owner/-name", "each part"),
        ("owner/name.", "each part"),
        ("own er/name", "each part"),
        ("owner/x--y", "'--'"),
        ("", "owner/name"),
        (None, "owner/name"),
    ],
)
def test_repository_names_the_hub_refuses(repo, why):
    assert why in repo_problem(repo)


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/12", "0f3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a", "a_b"])
def test_revisions_the_hub_accepts(revision):
    assert revision_problem(revision) is None


@pytest.mark.parametrize(
    "revision", ["", "main branch", "a..b", "v1:2", "x~1", "x^", "a*", "a[b", "a\\b", "@", "@{u}", "x.", "/main",
                 "main/", "a//b", ".hidden", "refs/.x", "x.lock", "tab\tx", "x" * 256],
)  # fmt: skip
def test_revisions_the_hub_refuses(revision):
    assert revision_problem(revision)


def test_allow_patterns_follow_the_hub(minimax_model_info):
    files = hub_files(minimax_model_info)
    chosen = select_files(files, ["*.safetensors", "config.json", "docs/"])
    assert [file.path for file in chosen] == [
        "config.json",
        "model-00001-of-00126.safetensors",
        "model-00002-of-00126.safetensors",
        "docs/deploy_guide.md",
    ]
    assert select_files(files, []) == files


def test_listing_links_of_nginx_and_python_http_server():
    nginx = (
        "<html><head><title>Index of /tiny/</title></head><body><h1>Index of /tiny/</h1><hr><pre>"
        '<a href="../">../</a>\n<a href="sub%20dir/">sub dir/</a>   30-Nov-2026 05:00  -\n'
        '<a href="config.json">config.json</a>  30-Nov-2026 05:00  688\n'
        '<a href=".llmops-tiny-model.json">.llmops-tiny-model.json</a>\n</pre><hr></body></html>'
    )
    python = (
        '<ul>\n<li><a href="config.json">config.json</a></li>\n<li><a href="model.safetensors">model.safetensors</a>'
        '</li>\n<li><a href="?C=N;O=D">Name</a></li><li><a href="/elsewhere/">x</a></li>'
        '<li><a href="http://other/">y</a></li></ul>'
    )
    assert listing_links(nginx) == ["sub dir/", "config.json"]
    assert listing_links(python) == ["config.json", "model.safetensors"]
