"""The compile cache's key, its archive and the unpacking that refuses what a cache never holds."""

import io
import json
import os
import stat
import tarfile

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.compile_cache import (
    CompileCacheError,
    archive_name,
    cache_key,
    command_digest,
    contents,
    cpu_device,
    cuda_device,
    environment_digest,
    key_differences,
    read_key,
    unpack,
    write_archive,
)

RECORD = {"vllm_version": "0.26.0", "model": "minimax_m25"}
H200 = "0, NVIDIA H200, 580.159.04, 9.0\n1, NVIDIA H200, 580.159.04, 9.0\n"
ENVIRONMENT = {"HOME": "/var/lib/vllm", "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_API_KEY": "k"}
ARGV = ["/opt/vllm/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/x", "--port", "8000"]


def test_hosts_that_differ_only_in_their_address_share_a_key():
    here = command_digest([*ARGV, "--host", "10.0.0.1"])
    assert command_digest([*ARGV[:-1], "8001", "--host=10.0.0.2"]) == here
    assert command_digest([*ARGV, "--host", "10.0.0.1", "--max-model-len", "4096"]) != here


def test_the_environment_counts_by_vllm_s_own_variables_less_where_and_secrets():
    here = environment_digest(ENVIRONMENT)
    elsewhere = {**ENVIRONMENT, "VLLM_API_KEY": "other", "VLLM_CACHE_ROOT": "/srv/cache", "HOME": "/home/vllm"}
    assert environment_digest(elsewhere) == here
    assert environment_digest({**ENVIRONMENT, "VLLM_CPU_OMP_THREADS_BIND": "1"}) != here


def test_the_device_is_the_instance_s_gpus_model_driver_and_capability():
    assert cuda_device(H200, [1]) == {"kind": "cuda", "gpus": ["NVIDIA H200 / 580.159.04 / 9.0"]}
    assert cuda_device(H200, []) == cuda_device(H200, [0, 1])
    with pytest.raises(CompileCacheError, match=r"not the instance's \[3\]"):
        cuda_device(H200, [0, 3])
    assert cpu_device("processor : 0\nmodel name : AMD EPYC\n", "AVX-512 BF16") == {
        "kind": "cpu", "cpu": "AMD EPYC", "isa": "AVX-512 BF16"
    }  # fmt: skip


def test_the_archive_name_follows_the_whole_key():
    key = cache_key(RECORD, ARGV, ENVIRONMENT, cuda_device(H200, [0]))
    name = archive_name(key)
    assert name.startswith("minimax_m25-0.26.0-") and name.endswith(".tar.gz")
    other_driver = cache_key(RECORD, ARGV, ENVIRONMENT, cuda_device(H200.replace("580.159.04", "575.0"), [0]))
    assert archive_name(other_driver) != name
    assert archive_name({**key, "model": "Org/Model 7B"}).startswith("Org-Model-7B-0.26.0-")
    assert key_differences(key, other_driver) == [
        f"device {other_driver['device']!r} where this host has {key['device']!r}"
    ]
    assert key_differences(key, dict(key)) == []


def fill(path):
    (path / "torch_compile_cache" / "abc" / "rank_0_0").mkdir(parents=True)
    (path / "torch_compile_cache" / "abc" / "rank_0_0" / "model.bin").write_bytes(b"x" * 1000)
    (path / "deep_gemm").mkdir()
    (path / "deep_gemm" / "kernel.cubin").write_bytes(b"y" * 24)
    os.symlink("/etc/passwd", path / "deep_gemm" / "link")


def test_an_archive_carries_its_key_first_and_the_cache_without_links_or_owners(tmp_path):
    cache, archive = tmp_path / "cache", tmp_path / "c.tar.gz"
    cache.mkdir()
    fill(cache)
    key = cache_key(RECORD, ARGV, ENVIRONMENT, cuda_device(H200, [0]))
    write_archive(str(cache), key, str(archive))
    assert read_key(str(archive)) == key
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert members[0].name == "KEY.json"
    assert {member.name for member in members if member.isfile()} == {
        "KEY.json", "cache/torch_compile_cache/abc/rank_0_0/model.bin", "cache/deep_gemm/kernel.cubin"
    }  # fmt: skip
    assert all(member.uid == 0 and member.uname == "" for member in members)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".llmops-")] == []


def test_unpacking_fills_a_missing_directory_whole_and_owned(tmp_path):
    cache, archive = tmp_path / "made", tmp_path / "c.tar.gz"
    cache.mkdir()
    fill(cache)
    write_archive(str(cache), cache_key(RECORD, ARGV, ENVIRONMENT, cpu_device("", "AVX2")), str(archive))
    target = tmp_path / "home" / ".cache" / "vllm" / "0.26.0" / "minimax_m25"
    owner = (os.getuid(), os.getgid())
    assert unpack(str(archive), str(target), owner) == 2
    assert (target / "torch_compile_cache" / "abc" / "rank_0_0" / "model.bin").read_bytes() == b"x" * 1000
    assert contents(str(target)) == (2, 1024)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "home" / ".cache").stat().st_mode) == 0o700
    assert [path.name for path in target.parent.iterdir()] == ["minimax_m25"]


def test_a_directory_with_the_units_link_alone_holds_no_cache_and_is_filled(tmp_path):
    """The unit links the entry's modelinfos to its release's before each start: an entry whose start made nothing
    else has no cache of its own, and the fleet's archive replaces the directory, link and all."""
    cache, archive = tmp_path / "made", tmp_path / "c.tar.gz"
    cache.mkdir()
    fill(cache)
    write_archive(str(cache), cache_key(RECORD, ARGV, ENVIRONMENT, cpu_device("", "AVX2")), str(archive))
    release = tmp_path / "home" / ".cache" / "vllm" / "0.26.0"
    (release / "modelinfos").mkdir(parents=True)
    (release / "modelinfos" / "llama.json").write_text("{}")
    target = release / "minimax_m25"
    target.mkdir()
    (target / "modelinfos").symlink_to("../modelinfos")
    (target / "dangling").symlink_to("../nowhere")
    assert contents(str(target)) == (0, 0)
    assert unpack(str(archive), str(target), (os.getuid(), os.getgid())) == 2
    assert sorted(path.name for path in target.iterdir()) == ["deep_gemm", "torch_compile_cache"]
    assert (release / "modelinfos" / "llama.json").read_text() == "{}"


def test_the_answers_about_model_classes_that_the_units_link_leads_to_travel_as_the_entrys_own(tmp_path):
    """The host that packs an entry has resolved its model's class once, into its release's directory; the host that
    unpacks the archive finds the answer in the entry's cache and does not import the class first."""
    release = tmp_path / "packer" / "0.26.0"
    cache = release / "minimax_m25"
    cache.mkdir(parents=True)
    fill(cache)
    (release / "modelinfos").mkdir()
    answer = '{"module_hash": "abc", "model_info": {"architecture": "MiniMaxM2ForCausalLM"}}'
    (release / "modelinfos" / "minimax_m2-MiniMaxM2ForCausalLM.json").write_text(answer)
    (cache / "modelinfos").symlink_to("../modelinfos")
    archive = tmp_path / "c.tar.gz"
    write_archive(str(cache), cache_key(RECORD, ARGV, ENVIRONMENT, cpu_device("", "AVX2")), str(archive))
    with tarfile.open(archive) as tar:
        assert "cache/modelinfos/minimax_m2-MiniMaxM2ForCausalLM.json" in tar.getnames()
    target = tmp_path / "importer" / "0.26.0" / "minimax_m25"
    assert unpack(str(archive), str(target), (os.getuid(), os.getgid())) == 3
    unpacked = target / "modelinfos" / "minimax_m2-MiniMaxM2ForCausalLM.json"
    assert not (target / "modelinfos").is_symlink()
    assert unpacked.read_text() == answer


def evil_archive(path, name, kind=tarfile.REGTYPE):
    with tarfile.open(path, "w:gz") as tar:
        text = json.dumps({"format": 1}).encode()
        key = tarfile.TarInfo("KEY.json")
        key.size = len(text)
        tar.addfile(key, io.BytesIO(text))
        member = tarfile.TarInfo(name)
        member.type = kind
        member.linkname = "/etc/shadow" if kind == tarfile.SYMTYPE else ""
        tar.addfile(member, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("cache/../../escape", tarfile.REGTYPE), ("/etc/cron.d/x", tarfile.REGTYPE), ("other/x", tarfile.REGTYPE),
     ("cache/link", tarfile.SYMTYPE)],
)  # fmt: skip
def test_unpacking_refuses_what_a_cache_never_holds_and_leaves_nothing(tmp_path, name, kind):
    archive, target = tmp_path / "evil.tar.gz", tmp_path / "home" / "cache"
    evil_archive(archive, name, kind)
    with pytest.raises(CompileCacheError, match="which a compile cache archive never does"):
        unpack(str(archive), str(target), (os.getuid(), os.getgid()))
    assert not target.exists() and list(target.parent.iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_a_file_that_is_not_a_cache_archive_is_named(tmp_path):
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))
    with pytest.raises(CompileCacheError, match=r"does not begin with KEY\.json"):
        read_key(str(plain))
    (tmp_path / "junk").write_bytes(b"not a tar")
    with pytest.raises(CompileCacheError, match=r"cannot read .*junk as a compile cache archive"):
        read_key(str(tmp_path / "junk"))
