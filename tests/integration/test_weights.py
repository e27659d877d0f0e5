"""Weights on a real host: the disk check before anything changes, a fleet mirror over HTTP, resume, verify,
an interrupted fetch, and the hub through vLLM's huggingface_hub.

The mirror is nginx (autoindex, Range requests) inside the host, serving `tiny` that tiny_model wrote
into /srv/mirror/llmops/tiny: the same files a real mirror would hold. A catalog entry of the user's
names it as the hub repository llmops/tiny; vllm_mirror sends the fetch to nginx. The hub
itself is not reachable from these machines: the hub stand-in of the unit tests (tests/hub_standin.py)
serves the same files inside the host, and the module runs there under vLLM's venv, as the role runs it.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from .conftest import SMALL_FS, hub_standin

VENV_PYTHON = "/opt/vllm/venv/bin/python"
HUB_PORT = 8093

MIRROR_ROOT = "/srv/mirror"
MIRROR_URL = "http://127.0.0.1:8088"
REPO = "llmops/tiny"
PORT = 8001
ENTRY = f"""
description: tiny, fetched from the fleet's mirror as if it were a hub repository
source:
  kind: hub
  repo: {REPO}
  revision: main
served_name: tiny-mirror
max_model_len: 2048
max_num_seqs: 16
extra_args: [--enforce-eager]
"""
# The slow mirror sends at 512 KiB/s: the 5.5 MiB of tiny then take long enough for the role to print
# its progress.
SLOW_MIRROR_URL = "http://127.0.0.1:8089"
NGINX_SITE = f"""
server {{
    listen 127.0.0.1:8088;
    root {MIRROR_ROOT};
    autoindex on;
}}
server {{
    listen 127.0.0.1:8089;
    root {MIRROR_ROOT};
    autoindex on;
    limit_rate 512k;
}}
"""


def remove_tiny_mirror(host):
    """Leave the host as the `deployed` fixture made it: no tiny_mirror unit, weights, EnvironmentFile or record."""
    host.sh(
        "systemctl disable --now vllm-tiny_mirror.service 2>/dev/null;"
        " rm -rf /etc/systemd/system/vllm-tiny_mirror.service /etc/vllm/tiny_mirror.env /etc/vllm/tiny_mirror.json"
        " /var/lib/vllm/models/tiny_mirror;"
        " systemctl daemon-reload"
    )


@pytest.fixture(scope="module")
def mirror(deployed):
    """nginx on the host serving the tiny model under /srv/mirror/llmops/tiny; its files' SHA-256."""
    host = deployed
    host.sh(
        "command -v nginx >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light >/dev/null",
        timeout=300,
    )
    host.sh(f"cat > /etc/nginx/sites-enabled/mirror <<'EOF'\n{NGINX_SITE}\nEOF\nsystemctl restart nginx")
    generated = host.module(
        "llmops.vllm.tiny_model",
        path=f"{MIRROR_ROOT}/{REPO}",
        python="/opt/vllm/venv/bin/python",
    )
    assert not generated.get("failed"), generated
    listing = host.sh(
        f"python3 -c 'import urllib.request as u; print(u.urlopen(\"{MIRROR_URL}/{REPO}/\").read().decode())'"
    )
    assert "model.safetensors" in listing.stdout
    sums = host.sh(f"cd {MIRROR_ROOT}/{REPO} && sha256sum *").stdout
    remove_tiny_mirror(host)
    yield {name: digest for digest, name in (line.split() for line in sums.splitlines())}
    remove_tiny_mirror(host)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    directory = tmp_path_factory.mktemp("catalog")
    (directory / "tiny_mirror.yml").write_text(ENTRY)
    return directory


def deploy_args(catalog, *extra):
    return (
        "-e",
        "model=tiny_mirror",
        "-e",
        json.dumps(
            {
                "vllm_catalog_paths": [str(catalog)],
                "vllm_mirror": SLOW_MIRROR_URL,
                "vllm_weights_progress_interval": 1,
                "vllm_server_port": PORT,
            }
        ),
        *extra,
    )


def fetch_tiny(host, path, check_mode=False, python="", **where):
    """model_weights for llmops/tiny into `path`, from `where` (mirror=..., or hub_endpoint=...), else the mirror."""
    return host.module(
        "llmops.vllm.model_weights",
        check_mode=check_mode,
        python=python,
        path=path,
        source={"kind": "hub", "repo": REPO},
        reserve="0",
        **(where or {"mirror": MIRROR_URL}),
    )


def sha256s(host, path):
    """SHA-256 of the files under their names in `path` (hidden ones, the manifest and partial copies, left out)."""
    copied = host.sh(f"cd {path} && sha256sum *").stdout
    return {name: digest for digest, name in (line.split() for line in copied.splitlines())}


def test_weights_that_do_not_fit_fail_before_anything_is_written(deployed, mirror, catalog):
    total = sum(int(size) for size in deployed.sh(f"stat -c %s {MIRROR_ROOT}/{REPO}/*").stdout.split())
    free = int(deployed.sh(f"df --output=avail -B1 {SMALL_FS} | tail -1").stdout)
    started = time.monotonic()
    proc = deployed.playbook(
        "playbooks/deploy.yml",
        *deploy_args(catalog, "-e", f"vllm_weights_root={SMALL_FS}/models", "-e", "vllm_weights_reserve=0"),
    )
    elapsed = time.monotonic() - started
    print(f"deploy.yml failed on the disk check after {elapsed:.1f} s")
    assert proc.returncode != 0
    output = " ".join(proc.stdout.split())  # the callback may wrap the message
    message = re.search(r"not enough free space for the weights on .*?nothing was written\.", output)
    assert message, proc.stdout[-4000:]
    print(message.group(0))
    assert f"on {SMALL_FS}: the download needs {total} bytes" in message.group(0)
    assert f"but only {free} bytes" in message.group(0)
    # Nothing was written, nothing installed, no unit made.
    assert deployed.sh(f"ls -A {SMALL_FS}").stdout == ""
    assert "vllm_install :" not in proc.stdout and "vllm_server :" not in proc.stdout
    assert deployed.sh("test -e /etc/systemd/system/vllm-tiny_mirror.service", check=False).returncode == 1


def test_deploy_loads_weights_from_the_http_mirror(deployed, mirror, catalog):
    proc = deployed.playbook("playbooks/deploy.yml", *deploy_args(catalog))
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    try:
        output = " ".join(proc.stdout.split())  # the callback may wrap the message
        progress = re.findall(
            r"msg: ([\d.]+ % \(.*? of .*?\), \S+ \S+/s, [\w.]+(?: and \d+ more)?, ETA (?:\d+ s|unknown))", output
        )
        print("\n".join(progress))
        assert progress and float(progress[-1].split()[0]) < 100
        copied = deployed.sh("cd /var/lib/vllm/models/tiny_mirror && sha256sum *").stdout
        assert {name: digest for digest, name in (line.split() for line in copied.splitlines())} == mirror
        unit = deployed.sh("systemctl cat vllm-tiny_mirror.service").stdout
        assert "/var/lib/vllm/models/tiny_mirror" in unit and "dummy" not in unit
        assert "HF_HUB_OFFLINE" in deployed.sh("cat /etc/vllm/tiny_mirror.env").stdout

        headers = {"Authorization": f"Bearer {deployed.api_key}"}
        models = deployed.module("ansible.builtin.uri", url=f"http://127.0.0.1:{PORT}/v1/models", headers=headers)
        assert [model["id"] for model in models["json"]["data"]] == ["tiny-mirror"]
        completion = deployed.module(
            "ansible.builtin.uri",
            url=f"http://127.0.0.1:{PORT}/v1/completions",
            method="POST",
            headers=headers,
            body_format="json",
            body={"model": "tiny-mirror", "prompt": "The server loads", "max_tokens": 8, "ignore_eos": True},
        )
        assert not completion.get("failed"), completion
        assert completion["json"]["usage"]["completion_tokens"] == 8

        again = deployed.playbook("playbooks/deploy.yml", *deploy_args(catalog))
        assert again.returncode == 0 and re.search(r"changed=0\b", again.stdout), again.stdout[-3000:]
    finally:
        remove_tiny_mirror(deployed)


def test_interrupted_download_resumes_and_corruption_is_refetched(deployed, mirror):
    path = "/var/tmp/weights-resume"
    deployed.sh(f"rm -rf {path}")
    first = fetch_tiny(deployed, path)
    assert first["changed"] and first["fetched_bytes"] == first["total_bytes"] == first["needed_bytes"], first
    print(f"mirror download: {first['total_bytes']} bytes at {first['bytes_per_second']} B/s")
    size = next(file["size"] for file in first["files"] if file["path"] == "model.safetensors")

    # An interrupted download leaves the first MiB: check mode plans the rest and writes nothing.
    deployed.sh(f"truncate -s 1M {path}/model.safetensors")
    planned = fetch_tiny(deployed, path, check_mode=True)
    assert planned["changed"] and planned["needed_bytes"] == size - 2**20
    assert deployed.sh(f"stat -c %s {path}/model.safetensors").stdout.strip() == str(2**20)
    resumed = fetch_tiny(deployed, path)
    step = next(file for file in resumed["files"] if file["path"] == "model.safetensors")
    assert (step["action"], step["offset"]) == ("resume", 2**20)
    assert resumed["fetched_bytes"] == size - 2**20

    # Same size, other bytes: only the hash shows it.
    deployed.sh(f"printf 'XXXXXXXX' | dd of={path}/model.safetensors bs=1 seek=4096 conv=notrunc status=none")
    repaired = fetch_tiny(deployed, path)
    step = next(file for file in repaired["files"] if file["path"] == "model.safetensors")
    assert (step["action"], step["reason"]) == ("fetch", "corrupt: SHA-256 differs")
    assert repaired["fetched_bytes"] == size

    # Longer than the source: the size shows it.
    deployed.sh(f"printf 'tail' >> {path}/config.json")
    repaired = fetch_tiny(deployed, path)
    step = next(file for file in repaired["files"] if file["path"] == "config.json")
    assert step["action"] == "fetch" and step["reason"].startswith("corrupt:")

    copied = deployed.sh(f"cd {path} && sha256sum *").stdout
    assert {name: digest for digest, name in (line.split() for line in copied.splitlines())} == mirror
    settled = fetch_tiny(deployed, path)
    assert not settled["changed"] and settled["fetched_bytes"] == 0


def test_an_interrupted_fetch_says_what_is_missing_and_the_next_run_resumes_it(deployed, mirror):
    """nginx dies while the slow mirror sends tiny: nothing half-fetched is under its name, the manifest says
    what is missing and what is there, and the next run fetches only the rest."""
    host, path = deployed, "/var/tmp/weights-interrupt"
    progress_file = "/var/tmp/weights-interrupt.progress.json"
    host.sh(f"rm -rf {path} {progress_file}")
    result = {}
    fetch = threading.Thread(
        target=lambda: result.update(fetch_tiny(host, path, mirror=SLOW_MIRROR_URL, progress_file=progress_file))
    )
    fetch.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = host.sh(f"cat {progress_file} 2>/dev/null || echo '{{}}'").stdout
            if json.loads(done or "{}").get("done_bytes", 0) > 2**20:
                break
            time.sleep(0.5)
        host.sh("systemctl kill --signal=SIGKILL nginx")  # a stop would let nginx finish its responses first
        fetch.join(timeout=300)
    finally:
        host.sh("systemctl reset-failed nginx; systemctl start nginx")
    assert result.get("failed"), result
    assert "model.safetensors" in result["missing"] and "run again to resume" in result["msg"]
    manifest = json.loads(host.sh(f"cat {path}/.llmops-weights.json").stdout)
    assert manifest["complete"] is False
    have = manifest["missing"]["model.safetensors"]["have"]
    held = sum(end - start for start, end in have)
    assert held > 2**20
    assert host.sh(f"test -e {path}/model.safetensors", check=False).returncode == 1
    for name, digest in sha256s(host, path).items():  # what is under its name is whole and the mirror's
        assert mirror[name] == digest and manifest["files"][name]["sha256"] == digest

    resumed = fetch_tiny(host, path)
    step = next(file for file in resumed["files"] if file["path"] == "model.safetensors")
    assert (step["action"], step["offset"]) == ("resume", held)
    assert resumed["fetched_bytes"] == resumed["needed_bytes"]
    assert sha256s(host, path) == mirror
    assert json.loads(host.sh(f"cat {path}/.llmops-weights.json").stdout)["complete"] is True
    assert host.sh(f"test -e {path}/.llmops-partial", check=False).returncode == 1


@pytest.fixture(scope="module")
def hub(deployed, mirror):
    """The hub stand-in inside the host, serving tiny as llmops/tiny; its endpoint."""
    deployed.sh(f"rm -rf /srv/hub && mkdir -p /srv/hub/llmops && cp -r {MIRROR_ROOT}/{REPO} /srv/hub/{REPO}")
    with hub_standin(deployed, "/srv/hub", HUB_PORT, "hf_integration") as endpoint:
        yield endpoint


@pytest.mark.parametrize(
    ("python", "client"), [(VENV_PYTHON, "huggingface_hub"), ("", "builtin")], ids=["venv", "host"]
)
def test_the_hub_is_fetched_by_huggingface_hub_where_the_python_has_it(deployed, mirror, hub, python, client):
    host, path = deployed, f"/var/tmp/weights-hub-{client}"
    host.sh(f"rm -rf {path}")
    result = fetch_tiny(host, path, python=python, hub_endpoint=hub, hub_token="hf_integration")
    assert not result.get("failed"), result
    print(f"{client}: {result['fetch_client']['reason']}")
    assert result["fetch_client"]["name"] == client
    if client == "huggingface_hub":
        assert result["fetch_client"]["python"] == VENV_PYTHON
    else:
        assert "cannot import huggingface_hub" in result["fetch_client"]["reason"]
    assert result["fetched_bytes"] == result["total_bytes"] and result["commit"]
    assert sha256s(host, path) == mirror
    manifest = json.loads(host.sh(f"cat {path}/.llmops-weights.json").stdout)
    assert manifest["complete"] is True and manifest["commit"] == result["commit"]
    again = fetch_tiny(host, path, python=python, hub_endpoint=hub, hub_token="hf_integration")
    assert again["changed"] is False and again["fetched_bytes"] == 0
    host.sh(f"rm -rf {path}")
