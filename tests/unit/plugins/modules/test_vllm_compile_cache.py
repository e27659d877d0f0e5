"""vllm_compile_cache on this machine: an instance's real record, unit file and cache directory, the CPU's key."""

import io
import json
import os
import tarfile

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.compile_cache import write_archive
from ansible_collections.llmops.vllm.plugins.modules import vllm_compile_cache


@pytest.fixture
def instance(tmp_path, write_instance, monkeypatch):
    """tiny's record, environment and unit file, its cache directory under a home in tmp_path."""
    config_dir, unit_dir = tmp_path / "etc", tmp_path / "units"
    record = write_instance(config_dir, "tiny", 8000, 300, "k")
    cache = tmp_path / "home" / ".cache" / "vllm" / "0.32.0" / "tiny"
    with open(record["secrets"]["environment_file"], "a", encoding="utf-8") as environment:
        environment.write(f'VLLM_CACHE_ROOT="{cache}"\n')
    unit_dir.mkdir()
    (unit_dir / "vllm-tiny.service").write_text(
        "[Service]\nExecStart=/opt/vllm/venv/bin/python -m vllm.entrypoints.openai.api_server --port 8000\n"
    )
    (tmp_path / "home").mkdir()
    monkeypatch.setattr(vllm_compile_cache, "UNIT_DIRS", (str(unit_dir),))
    return {"instance": "tiny", "config_dir": str(config_dir), "device": "cpu"}, cache


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(vllm_compile_cache.main, args, fails)


def filled(cache):
    (cache / "torch_compile_cache").mkdir(parents=True)
    (cache / "torch_compile_cache" / "graph.py").write_text("compiled\n")
    return cache


def test_info_gives_the_key_of_this_cpu_and_an_empty_cache(run, instance):
    args, cache = instance
    result = run(args)
    assert result["changed"] is False and result["path"] == str(cache)
    assert (result["populated"], result["files"]) == (False, 0)
    assert result["key"]["vllm"] == "0.32.0" and result["key"]["model"] == "tiny"
    assert result["key"]["device"]["kind"] == "cpu" and result["key"]["device"]["isa"]
    assert result["name"].startswith("tiny-0.32.0-")


def test_a_cache_packed_on_one_host_is_unpacked_on_an_identical_one(run, instance, tmp_path):
    args, cache = instance
    archive = tmp_path / "tiny.tar.gz"
    assert run({**args, "state": "archived", "archive": str(archive)})["changed"] is False  # nothing to pack yet
    assert not archive.exists()
    filled(cache)
    packed = run({**args, "state": "archived", "archive": str(archive)})
    assert packed["changed"] is True and archive.exists()
    os.rename(cache, tmp_path / "elsewhere")  # the identical host's cache: empty
    checked = run({**args, "state": "imported", "archive": str(archive), "_ansible_check_mode": True})
    assert checked["changed"] is True and not cache.exists()
    imported = run({**args, "state": "imported", "archive": str(archive)})
    assert imported["changed"] is True and imported["refused"] == ""
    assert (imported["populated"], imported["files"]) == (True, 1)
    assert (cache / "torch_compile_cache" / "graph.py").read_text() == "compiled\n"
    again = run({**args, "state": "imported", "archive": str(archive)})
    assert again["changed"] is False and "holds this host's own compile cache: kept" in again["msg"]


def test_an_archive_of_another_key_is_refused_and_changes_nothing(run, instance, tmp_path, monkeypatch):
    args, cache = instance
    warnings = []
    monkeypatch.setattr(vllm_compile_cache.AnsibleModule, "warn", lambda _module, warning: warnings.append(warning))
    key = run(args)["key"]
    source = filled(tmp_path / "source")
    archive = tmp_path / "foreign.tar.gz"
    foreign = {**key, "device": {"kind": "cuda", "gpus": ["NVIDIA H200 / 580.159.04 / 9.0"]}}
    write_archive(str(source), foreign, str(archive))
    result = run({**args, "state": "imported", "archive": str(archive)})
    assert result["changed"] is False and result["refused"].startswith("device {'gpus': ['NVIDIA H200")
    assert "'kind': 'cuda'} where this host has {'kind': 'cpu'" in result["refused"]
    assert len(warnings) == 1 and "was made for another host: device" in warnings[0]
    assert not cache.exists() and result["populated"] is False


def test_an_archive_with_a_path_outside_the_cache_fails_and_unpacks_nothing(run, instance, tmp_path):
    args, cache = instance
    key = run(args)["key"]
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        text = json.dumps(key).encode()
        member = tarfile.TarInfo("KEY.json")
        member.size = len(text)
        tar.addfile(member, io.BytesIO(text))
        tar.addfile(tarfile.TarInfo("cache/../../../escape"), io.BytesIO(b""))
    result = run({**args, "state": "imported", "archive": str(archive)}, fails=True)
    assert "never does" in result["msg"] and not cache.exists()
    assert not (cache.parent / "escape").exists() and not any(cache.parent.glob(".tiny.importing-*"))


def test_bad_input_is_named(run, instance, tmp_path):
    args, _cache = instance
    assert "archive" in run({**args, "state": "imported"}, fails=True)["msg"]
    missing = run({**args, "state": "imported", "archive": str(tmp_path / "none.tar.gz")}, fails=True)
    assert missing["msg"] == f"archive {tmp_path / 'none.tar.gz'} is not a file on the host"
    gone = run({**args, "instance": "other"}, fails=True)
    assert "other" in gone["msg"]


def test_an_instance_deployed_before_the_cache_had_its_directory_is_told_to_deploy_again(run, instance):
    args, _cache = instance
    environment = os.path.join(args["config_dir"], "tiny.env")
    with open(environment, encoding="utf-8") as handle:
        kept = [line for line in handle if not line.startswith("VLLM_CACHE_ROOT")]
    with open(environment, "w", encoding="utf-8") as handle:
        handle.writelines(kept)
    assert "sets no VLLM_CACHE_ROOT" in run(args, fails=True)["msg"]


def test_a_drop_in_that_sets_a_vllm_variable_changes_the_key(run, instance, tmp_path):
    args, _cache = instance
    before = run(args)
    drop_in = tmp_path / "units" / "vllm-.service.d"
    drop_in.mkdir()
    (drop_in / "own-core.conf").write_text("[Service]\nEnvironment=VLLM_CPU_OMP_THREADS_BIND=1\n")
    after = run(args)
    assert after["key"]["environment"] != before["key"]["environment"] and after["name"] != before["name"]
    assert {**after["key"], "environment": None} == {**before["key"], "environment": None}
