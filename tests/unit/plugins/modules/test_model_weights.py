"""The model_weights module end to end: a mirror on a local path, the hub stand-in through the module's own
fetch and through huggingface_hub, an interrupted fetch that the next run resumes, and bad input that
fails naming the option and its value before anything is read or written (the HTTP details are in the
module_utils tests)."""

import hashlib
import os

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.weights import fetch as weights_fetch
from ansible_collections.llmops.vllm.plugins.module_utils.weights.listing import MANIFEST_NAME, PARTIAL_DIR
from ansible_collections.llmops.vllm.plugins.modules import model_weights

MODEL = bytes(range(256)) * 64
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def run(run_module, monkeypatch):
    """`run(args)` returns the module's result; with `fails=True`, the result it failed with."""
    monkeypatch.setattr(weights_fetch, "RETRY_DELAY", 0)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)

    def run_model_weights(module_args, fails=False):
        return run_module(model_weights.main, module_args, fails=fails)

    return run_model_weights


@pytest.fixture
def mirror(tmp_path):
    model = tmp_path / "mirror" / "llmops" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(MODEL)
    return str(tmp_path / "mirror")


@pytest.fixture
def hub(hub_standin):
    """Repository me/model on the hub stand-in: two shards and a config."""
    files = {"config.json": b'{"model_type": "llama"}', SHARD: os.urandom(3 << 20), "model-2.safetensors": MODEL}
    hub_standin.put("me/model", files)
    hub_standin.files = files
    return hub_standin


def args(tmp_path, mirror, **more):
    return {
        "path": str(tmp_path / "weights" / "tiny"),
        "source": {"kind": "hub", "repo": "llmops/tiny"},
        "mirror": mirror,
        "reserve": "0",
        **more,
    }


def hub_args(tmp_path, **more):
    return {
        "path": str(tmp_path / "weights" / "model"),
        "source": {"kind": "hub", "repo": "me/model"},
        "reserve": "0",
        **more,
    }


def tree(root):
    """Every path under `root` with its size and mtime: what a refused run must leave as it was."""
    found = {}
    for directory, _subdirectories, names in os.walk(root):
        for name in [*names, "."]:
            stat = os.stat(os.path.join(directory, name))
            found[os.path.join(directory, name)] = (stat.st_size if name != "." else 0, stat.st_mtime_ns)
    return found


def test_fetches_then_changes_nothing(tmp_path, mirror, run):
    first = run(args(tmp_path, mirror))
    assert first["changed"] is True
    assert first["fetched_bytes"] == first["needed_bytes"] == first["total_bytes"] == 23 + 16384
    assert first["fetch_client"]["name"] == "builtin" and first["workers"] >= 4
    assert (tmp_path / "weights" / "tiny" / "model.safetensors").read_bytes() == MODEL
    second = run(args(tmp_path, mirror))
    assert second["changed"] is False and second["fetched_bytes"] == 0 and second["needed_bytes"] == 0
    assert {file["action"] for file in second["files"]} == {"keep"}


@pytest.mark.parametrize("more", [{"state": "check"}, {"_ansible_check_mode": True}], ids=["state-check", "check-mode"])
def test_checks_write_nothing(tmp_path, mirror, more, run):
    result = run(args(tmp_path, mirror, **more))
    assert result["needed_bytes"] == 23 + 16384
    assert result["changed"] is ("_ansible_check_mode" in more)
    assert not (tmp_path / "weights").exists()


def test_no_room_fails_with_both_numbers_and_writes_nothing(tmp_path, mirror, run):
    result = run(args(tmp_path, mirror, reserve="1000T"), fails=True)
    assert f"needs {23 + 16384} bytes" in result["msg"]
    assert f"only {result['free_bytes']} bytes" in result["msg"]
    assert result["required_free_bytes"] > result["free_bytes"]
    assert not (tmp_path / "weights").exists()


def test_local_weights_are_checked_not_copied(tmp_path, mirror, run):
    local = {"kind": "local", "path": f"{mirror}/llmops/tiny"}
    result = run({"path": str(tmp_path / "unused"), "source": local})
    assert result["changed"] is False and result["path"] == local["path"] and result["total_bytes"] == 23 + 16384
    empty = {"kind": "local", "path": str(tmp_path)}
    assert "holds no config.json" in run({"path": str(tmp_path / "unused"), "source": empty}, fails=True)["msg"]


@pytest.mark.parametrize("hub_client", ["builtin", "auto"])
def test_the_hub_comes_from_hf_endpoint_by_either_client(tmp_path, hub, run, monkeypatch, hub_client):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    result = run(hub_args(tmp_path, hub_client=hub_client))
    assert result["fetch_client"]["name"] == ("builtin" if hub_client == "builtin" else "huggingface_hub")
    assert result["commit"] == hub.repos["me/model"].commit
    assert result["fetched_bytes"] == sum(len(data) for data in hub.files.values())
    for path, data in hub.files.items():
        assert (tmp_path / "weights" / "model" / path).read_bytes() == data
    assert run(hub_args(tmp_path, hub_client=hub_client))["changed"] is False


def test_an_interrupted_fetch_is_resumed_by_the_next_run(tmp_path, hub, run):
    hub.fail(SHARD, "cut", after=1 << 20)
    hub.fail(SHARD, "status", count=weights_fetch.RETRIES, status=503)
    failed = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, hub_client="builtin", workers=1), fails=True)
    assert "run again to resume" in failed["msg"] and SHARD in failed["missing"]
    dest = tmp_path / "weights" / "model"
    assert not (dest / SHARD).exists() and (dest / PARTIAL_DIR / SHARD).exists()
    planned = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, state="check"))
    assert next(file for file in planned["files"] if file["path"] == SHARD)["action"] == "fetch"  # the library: whole

    resumed = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, hub_client="builtin"))
    step = next(file for file in resumed["files"] if file["path"] == SHARD)
    assert (step["action"], step["offset"]) == ("resume", 1 << 20)
    assert resumed["fetched_bytes"] == resumed["needed_bytes"]
    assert hashlib.sha256((dest / SHARD).read_bytes()).hexdigest() == hashlib.sha256(hub.files[SHARD]).hexdigest()
    assert not (dest / PARTIAL_DIR).exists()


def test_the_library_path_in_check_mode_writes_nothing(tmp_path, hub, run):
    result = run(hub_args(tmp_path, hub_endpoint=hub.endpoint, _ansible_check_mode=True))
    assert result["changed"] is True and result["fetch_client"]["name"] == "huggingface_hub"
    assert not (tmp_path / "weights").exists()


# ---- bad input: refused before anything is read or written, naming the option and the value ------------


def bad(tmp_path, mirror_root, **changes):
    module_args = args(tmp_path, mirror_root)
    source = {**module_args["source"], **changes.pop("source", {})}
    return {**module_args, "source": source, **changes}


BAD_INPUT = {
    "repo that climbs out of the mirror": (
        {"source": {"repo": "llmops/.."}},
        "source.repo='llmops/..': it must not contain",
    ),
    "repo above the mirror": (
        {"source": {"repo": "../etc"}},
        "source.repo='../etc': it must not contain '--' or '..'",
    ),
    "repo with three parts": ({"source": {"repo": "a/b/c"}}, "source.repo='a/b/c': it must be owner/name"),
    "relative destination": ({"path": "weights/tiny"}, "path='weights/tiny': it must be an absolute path"),
    "relative local source": (
        {"source": {"kind": "local", "path": "models/tiny", "repo": None}},
        "source.path='models/tiny': it must be an absolute path",
    ),
    "number as a pattern": ({"source": {"allow_patterns": ["*.json", 7]}}, "source.allow_patterns[1]=7: it is int"),
    "mapping as a pattern": (
        {"source": {"allow_patterns": [{"a": 1}]}},
        "source.allow_patterns[0]={'a': 1}: it is dict",
    ),
    "empty pattern": ({"source": {"allow_patterns": [""]}}, "source.allow_patterns[0]='': it is str; each pattern"),
    "revision with a space": (
        {"source": {"revision": "main branch"}},
        "source.revision='main branch': it contains ' '",
    ),
    "revision with ..": ({"source": {"revision": "v1..v2"}}, "source.revision='v1..v2': it contains '..'"),
    "empty revision": ({"source": {"revision": ""}}, "source.revision='': it must be a branch, tag or commit hash"),
    "revision ending in .lock": ({"source": {"revision": "x.lock"}}, "source.revision='x.lock': no part of it may"),
    "negative margin": ({"margin": -0.1}, "margin=-0.1: it must be a fraction of 0 or more"),
    "margin that is not a number": ({"margin": float("nan")}, "margin=nan: it must be a fraction of 0 or more"),
    "negative reserve": ({"reserve": "-1G"}, "reserve='-1G': it must be a size of 0 or more"),
    "reserve without a size": ({"reserve": "lots"}, "reserve='lots': it must be a size"),
    "zero timeout": ({"timeout": 0}, "timeout=0: it must be more than 0 seconds"),
    "negative timeout": ({"timeout": -5}, "timeout=-5: it must be more than 0 seconds"),
    "zero workers": ({"workers": 0}, "workers=0: it must be from 1 to 256"),
    "negative workers": ({"workers": -3}, "workers=-3: it must be from 1 to 256"),
    "mirror of another scheme": (
        {"mirror": "ftp://mirror.lab/models"},
        "mirror='ftp://mirror.lab/models': it must be an http",
    ),
    "relative mirror path": (
        {"mirror": "shared/models"},
        "mirror='shared/models': it must be an http(s) URL or an absolute",
    ),
    "hub endpoint without a scheme": (
        {"mirror": None, "hub_endpoint": "huggingface.co"},
        "hub_endpoint='huggingface.co': it must",
    ),
    "relative progress file": (
        {"progress_file": "progress.json"},
        "progress_file='progress.json': it must be an absolute",
    ),
}


@pytest.mark.parametrize(("changes", "message"), list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_bad_input_fails_naming_the_option_and_changes_nothing(tmp_path, mirror, run, changes, message):
    before = tree(tmp_path)
    result = run(bad(tmp_path, mirror, **changes), fails=True)
    assert message in result["msg"], result["msg"]
    assert tree(tmp_path) == before


def test_a_destination_under_a_regular_file_is_refused(tmp_path, mirror, run):
    (tmp_path / "file").write_text("not a directory")
    before = tree(tmp_path)
    for path, message in [
        (
            tmp_path / "file" / "weights" / "tiny",
            f"{tmp_path / 'file'} is a file, not a directory, so nothing can be made",
        ),
        (tmp_path / "file", "it is a file, not a directory"),
    ]:
        result = run(bad(tmp_path, mirror, path=str(path)), fails=True)
        assert f"path='{path}': {message}" in result["msg"]
    assert tree(tmp_path) == before


def test_every_bad_option_is_named_at_once(tmp_path, mirror, run):
    result = run(bad(tmp_path, mirror, path="weights", timeout=0, source={"repo": "a/.."}), fails=True)
    assert [problem.split("=")[0] for problem in result["problems"]] == ["path", "source.repo", "timeout"]


def test_a_bad_hf_endpoint_is_named(tmp_path, run, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "hub.lab:8080")
    before = tree(tmp_path)
    result = run(hub_args(tmp_path), fails=True)
    assert "HF_ENDPOINT (the environment's hub)='hub.lab:8080': it must be an http:// or https:// URL" in result["msg"]
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hub_client": "wget"}, "value of hub_client must be one of: auto, huggingface_hub, builtin, got: wget"),
        ({"workers": "many"}, "argument 'workers' is of type"),
        ({"source": {"kind": "s3"}}, "value of kind must be one of: hub, local, got: s3 found in source"),
    ],
    ids=["client", "workers-type", "source-kind"],
)
def test_the_argument_spec_refuses_types_and_choices(tmp_path, mirror, run, changes, message):
    before = tree(tmp_path)
    assert message in run(bad(tmp_path, mirror, **changes), fails=True)["msg"]
    assert tree(tmp_path) == before


def test_a_mirror_path_that_does_not_exist_is_named(tmp_path, mirror, run):
    missing = run(args(tmp_path, str(tmp_path / "nowhere")), fails=True)
    assert "does not exist on this host" in missing["msg"]
    assert not (tmp_path / "weights").exists()
    assert not (tmp_path / "weights" / "tiny" / MANIFEST_NAME).exists()
