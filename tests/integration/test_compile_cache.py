"""The compile cache shared by identical hosts: the first host to serve an entry compiles it and publishes its cache
to the controller's store; the second unpacks it before its first start, where vLLM reads it; an archive made for
another host is refused, and nothing of it is unpacked. (That another entry of the same architecture finds
vLLM's answer about its model class, which the first entry's start left, test_router.py checks after its rollout.)

Both hosts run on this machine's CPU, so their keys are the same, as those of two identical GPU hosts are. vLLM's
CPU build saves its AOT-compiled model but fails to load it again, on a restart of the same host too ("Compiling
model again due to a load failure from PATH, reason: 'function' object has no attribute 'finalize_loading'"), so
here the second host proves that vLLM finds the unpacked artifact where it looks for it; that a GPU host given the
cache compiles nothing is measured on the H200 (benchmarks/results/h200-startup.md).
"""

import io
import json
import re
import shlex
import tarfile
from pathlib import Path

import pytest

from .conftest import OWN_CORE_DIR, main_started_at, remove_instances

CATALOG = str(Path(__file__).resolve().parent / "catalog")
INSTANCE = "tiny_compiled"
UNIT = f"vllm-{INSTANCE}.service"
INSTANCE_DROP_INS = f"/etc/systemd/system/{UNIT}.d"
SAVED = re.compile(r"saved AOT compiled function to (\S+)")
# vLLM reads the artifact at PATH: it loads it, or (the CPU build) fails to.
READ = re.compile(
    r"(?:Directly load AOT compilation from path|Compiling model again due to a load failure from) (\S+?),?\s"
)


@pytest.fixture(scope="module")
def store(fleet, tmp_path_factory):
    """The controller's store; the instance and its caches gone from both hosts afterwards.

    The second host binds its vLLM engines to a core of their own (conftest.own_core, a drop-in of every vllm-*
    unit), which vLLM's compile cache key holds, and so does the collection's: the first host's instance gets the
    same binding, so that the two hosts are identical for it.
    """
    first, second = fleet.hosts
    binding = second.sh(f"cat {OWN_CORE_DIR}/own-core.conf").stdout
    first.sh(f"mkdir -p {INSTANCE_DROP_INS} && cat > {INSTANCE_DROP_INS}/own-core.conf <<'EOF'\n{binding}EOF\n")
    yield tmp_path_factory.mktemp("compile-cache")
    for host in fleet.hosts:
        if host.sh(f"test -e {host.config_dir}/{INSTANCE}.json", check=False).returncode == 0:
            remove_instances(host, INSTANCE)
        host.sh(f"rm -rf /var/lib/vllm/.cache/vllm/*/{INSTANCE}")
    first.sh(f"rm -rf {INSTANCE_DROP_INS} && systemctl daemon-reload")


def deploy(fleet, host, store):
    settings = {
        "vllm_instances": [{"model": INSTANCE, "port": 8001}],
        "vllm_catalog_paths": [CATALOG],
        "vllm_server_compile_cache_store": str(store),
    }
    proc = fleet.playbook("playbooks/deploy.yml", "--limit", host.name, "-e", json.dumps(settings))
    assert proc.returncode == 0, f"deploy.yml failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return " ".join((proc.stdout + proc.stderr).split())


def journal(host) -> str:
    """The journal of the instance's last start (its earlier runs left out)."""
    invocation = host.sh(f"systemctl show -P InvocationID {UNIT}").stdout.strip()
    return host.sh(f"journalctl _SYSTEMD_INVOCATION_ID={shlex.quote(invocation)} -o cat --no-pager").stdout


def cache_files(host) -> list[str]:
    found = host.sh(f"find /var/lib/vllm/.cache/vllm -path '*/{INSTANCE}/*' -type f -printf '%P\\n'", check=False)
    return found.stdout.split()


def archives(store: Path) -> list[Path]:
    return sorted(store.glob("*.tar.gz"))


@pytest.fixture(scope="module")
def published(fleet, store):
    """The first host's instance deployed, its journal, and the instance stopped: the second host's start has the
    core that both bind."""
    first = fleet.hosts[0]
    deploy(fleet, first, store)
    lines = journal(first)
    stopped = first.module("llmops.vllm.vllm_service", instance=INSTANCE, config_dir=first.config_dir, state="stopped")
    assert not stopped.get("failed"), stopped
    return first, lines


def test_the_first_host_compiles_into_the_entry_s_directory_and_publishes_it(published, store):
    host, lines = published
    release = host.sh(f"cat {host.config_dir}/{INSTANCE}.json").stdout
    cache_root = f"/var/lib/vllm/.cache/vllm/{json.loads(release)['vllm_version']}/{INSTANCE}"
    [saved] = SAVED.findall(lines)
    assert saved.startswith(f"{cache_root}/torch_compile_cache/") and not READ.search(lines), lines[-3000:]
    [archive] = archives(store)
    assert archive.name.startswith(f"{INSTANCE}-") and not list(store.glob(".*"))
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[0] == "KEY.json" and f"cache/{saved.removeprefix(cache_root + '/')}" in names, names
    # vLLM's answer about the model's class, which the entry's link to its release's directory leads to.
    assert any(re.fullmatch(r"cache/modelinfos/\S+LlamaForCausalLM\.json", name) for name in names), names


def test_an_identical_host_unpacks_it_where_vllm_reads_it(fleet, published, store):
    second = fleet.hosts[1]
    [archive] = archives(store)
    before = archive.read_bytes()
    output = deploy(fleet, second, store)
    unpacked = rf"Unpack it, when its key is this host's\] \**\s*changed: \[{re.escape(second.name)}\]"
    assert re.search(unpacked, output), output[-4000:]
    lines = journal(second)
    # vLLM read the artifact that the first host saved, at the same path under the second host's home.
    [saved] = SAVED.findall(published[1])
    assert READ.search(lines) and READ.search(lines).group(1) == saved, lines[-3000:]
    # The store keeps the one archive of that key: the second host had nothing new to publish.
    assert archives(store) == [archive] and archive.read_bytes() == before
    assert len(cache_files(second)) > 1
    # The answer about the model's class came with the archive, and the start read it: vLLM did not write it again.
    answers = second.sh(f"find /var/lib/vllm/.cache/vllm -path '*/{INSTANCE}/modelinfos/*LlamaForCausalLM.json'"
                        " -type f -printf '%T@\\n'").stdout.split()  # fmt: skip
    started_at = main_started_at(second, UNIT)
    assert len(answers) == 1 and float(answers[0]) <= started_at + 1, (answers, started_at)


def foreign_copy(archive: Path, destination: Path) -> None:
    """The archive with its key's device changed: what another kind of host would have published."""
    with tarfile.open(archive) as source, tarfile.open(destination, "w:gz") as copy:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None
            if member.name == "KEY.json":
                key = json.loads(data)
                data = json.dumps({**key, "device": {"kind": "cuda", "gpus": ["NVIDIA H200 / 580.159.04 / 9.0"]}})
                data = data.encode()
                member.size = len(data)
            copy.addfile(member, io.BytesIO(data) if data is not None else None)


def test_an_archive_made_for_another_host_is_refused_and_nothing_of_it_is_unpacked(fleet, published, store, tmp_path):
    """The archive's key names the device it was compiled for: an archive of another kind of host is refused, with
    how the keys differ, and the instance's cache stays empty, so that vLLM compiles for this host at its start, as
    the first host's start did."""
    second = fleet.hosts[1]
    stopped = second.module(
        "llmops.vllm.vllm_service", instance=INSTANCE, config_dir=second.config_dir, state="stopped"
    )
    assert not stopped.get("failed"), stopped
    second.sh(f"rm -rf /var/lib/vllm/.cache/vllm/*/{INSTANCE}")
    [archive] = archives(store)
    foreign = tmp_path / archive.name
    foreign_copy(archive, foreign)
    second.copy_in(str(foreign), "/tmp/foreign.tar.gz")
    result = second.module("llmops.vllm.vllm_compile_cache", instance=INSTANCE, config_dir=second.config_dir,
                           device="cpu", state="imported", archive="/tmp/foreign.tar.gz")  # fmt: skip
    assert not result.get("failed") and not result["changed"], result
    assert result["refused"].startswith("device"), result
    assert any("was made for another host: device" in warning for warning in result.get("warnings", [])), result
    assert cache_files(second) == []
