"""Fixtures shared by the tests of module_utils and of modules: a real idle process, the GPU facts of the two
kinds of hosts the planner is tested against, the real model configs, and a real HTTP server on loopback."""

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "tests" / "unit" / "fixtures" / "configs"
NVIDIA_SMI = ROOT / "tests" / "unit" / "fixtures" / "nvidia-smi"


def gpu_facts(count, name, memory_total_mib, link, kind, compute_capability=None):
    """The vllm_gpus fact of llmops.vllm.gpu_facts for `count` identical GPUs, every pair on `link`."""
    gpus = [
        {
            "index": index,
            "uuid": f"GPU-{index:08d}",
            "name": name,
            "memory_total_mib": memory_total_mib,
            "memory_used_mib": 0,
            "mig_mode": "Disabled",
            "pci_bus_id": f"00000000:{index + 0x18:02X}:00.0",
        }
        for index in range(count)
    ]
    if compute_capability:
        for gpu in gpus:
            gpu["compute_capability"] = compute_capability
    pairs = [{"gpus": [a, b], "link": link, "kind": kind} for a in range(count) for b in range(a + 1, count)]
    matrix = [["X" if a == b else link for b in range(count)] for a in range(count)]
    return {
        "present": True,
        "count": count,
        "gpus": gpus,
        "topology": {"matrix": matrix, "pairs": pairs, "all_nvlink": kind == "nvlink"},
        "driver_version": "580.95.05",
        "cuda_version": "13.0",
        "backend": "nvml",
    }


# nvidia-smi's name and memory.total of the GPUs of 8-GPU HGX hosts: the H200's as captured on the GPU machines
# (fixtures/nvidia-smi/h200-2gpu/query-gpu.csv), the H100's as an H100 SXM of 80 GB reports them.
HGX_GPUS = {"H100": ("NVIDIA H100 80GB HBM3", 81559), "H200": ("NVIDIA H200", 143771)}


@pytest.fixture
def hgx_host():
    """`hgx_host(kind, name, address)`: an 8-GPU HGX host of `kind` (H100 or H200) as the group planner takes it, its
    GPU facts read by the collection's parsers from nvidia-smi output in the captured formats (--query-gpu rows as
    h200-2gpu/query-gpu.csv has them, the NVSwitch topology of hgx-8gpu-nvlink.txt)."""
    from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import (
        parse_query_gpu,
        parse_topology_matrix,
        topology,
    )

    matrix = parse_topology_matrix((NVIDIA_SMI / "hgx-8gpu-nvlink.txt").read_text())

    def make(kind, name, address):
        model, memory = HGX_GPUS[kind]
        query_gpu = "\n".join(
            f"{index}, GPU-{name}-{index:04d}, {model}, {memory}, 0, Disabled, 00000000:{0x18 + index:02X}:00.0"
            for index in range(8)
        )
        gpus = [gpu.as_dict() for gpu in parse_query_gpu(query_gpu)]
        facts = {"present": True, "count": len(gpus), "gpus": gpus, "topology": topology(matrix)}
        return {"name": name, "address": address, "gpus": facts}

    return make


@pytest.fixture
def seed_box():
    """The seed report's host: 8 RTX PRO 6000 Blackwell of 96 GB, PCIe only (compute capability 12.0)."""
    return gpu_facts(8, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "SYS", "pcie", "12.0")


@pytest.fixture
def h200s():
    """`h200s(count)`: that many H200 on NVLink (NV18 for each pair, as on the GPU machines); the facts carry no
    compute capability, so the name gives it (9.0)."""
    return lambda count: gpu_facts(count, "NVIDIA H200", 143771, "NV18", "nvlink")


@pytest.fixture
def h200_box(h200s):
    """8 H200 on NVLink."""
    return h200s(8)


@pytest.fixture
def config():
    def read(name):
        return json.loads((CONFIGS / f"{name}.config.json").read_text())

    return read


@pytest.fixture
def entry():
    # Imported here: the collection becomes importable only when the session starts (tests/unit/conftest.py).
    from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import check_entry

    def read(name, **changes):
        raw = yaml.safe_load((ROOT / "models" / f"{name}.yml").read_text())
        return check_entry(name, {**raw, **changes})

    return read


@pytest.fixture
def gpu_layout_model():
    """An entry of benchmarks/models and its config.json: the small copies of the seed models' shapes that
    benchmarks/gpu/layouts.py serves on the GPU machine, where vLLM's own verdicts were taken."""
    from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import check_entry

    models = ROOT / "benchmarks" / "models"

    def read(name):
        entry = check_entry(name, yaml.safe_load((models / f"{name}.yml").read_text()))
        return entry, json.loads((models / "configs" / f"{name}.json").read_text())

    return read


def _command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except FileNotFoundError:
        return b""


@pytest.fixture
def hub_repo(hub_standin, tmp_path):
    """`hub_repo(files)`: repository me/model holding `files` ({path: bytes}) on the hub stand-in, behind the
    token hf_secret. Returns (standin, files, dest), dest a weights directory to fetch into."""

    def make(files):
        hub_standin.put("me/model", files)
        hub_standin.token = "hf_secret"
        return SimpleNamespace(standin=hub_standin, files=files, dest=str(tmp_path / "weights"))

    return make


@pytest.fixture
def idle_process():
    """A real process that sleeps, standing for one that holds a GPU: /proc describes it like any other.

    Popen returns once the child has called exec, but its /proc/PID/cmdline may still be empty for a moment:
    the fixture yields once /proc shows the whole command line, which is what the tests read.
    """
    from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import wait_for

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpu-holder"])
    shown = wait_for(lambda: (_command_line(child.pid).endswith(b"gpu-holder\0"), None), timeout=10, interval=0.005)
    assert shown.ok, f"/proc/{child.pid}/cmdline did not show the child's command line within 10 s"
    yield child
    child.kill()
    child.wait()


class _Server(http.server.BaseHTTPRequestHandler):
    """Answers GETs from its server's `routes`: path -> (status, body), or a function of the request headers
    that returns them; POSTs from the routes `POST path`. Logs the paths asked (`POST path` for a POST)."""

    def do_GET(self):
        self._answer(self.path)

    def do_POST(self):
        self._answer(f"POST {self.path}")

    def _answer(self, key):
        self.server.asked.append(key)
        route = self.server.routes.get(key, (404, "Not Found"))
        status, body = route(self.headers) if callable(route) else route
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """`serve(routes)` starts a server on 127.0.0.1 and an ephemeral port; returns (url, paths asked)."""
    servers = []

    def start(routes):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
        httpd.routes, httpd.asked = routes, []
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", httpd.asked

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


# A stand-in for vLLM and torch in a venv, for the tests of the import check's own program (CHECK in
# module_utils/install/native_ops.py). Its vllm._custom_ops loads a real shared library as vllm/<library> and does
# what the test asks of vLLM's; real vLLM runs the same check in the molecule and integration tests.
FAKE_TORCH = """
import types
ops = types.SimpleNamespace(_C=types.SimpleNamespace())
cpu = types.SimpleNamespace(_is_avx2_supported=lambda: True, _is_avx512_supported=lambda: False,
                            _is_avx512_bf16_supported=lambda: False, _is_amx_tile_supported=lambda: False)
empty = lambda *shape: [0.0]
ones = lambda *shape: [1.0]
allclose = lambda a, b: a == b
"""
FAKE_CUSTOM_OPS = """
import ctypes, logging, os, signal, torch
ctypes.CDLL({library!r})
if {warning!r}:
    logging.getLogger("vllm.platforms.cpu").warning({warning!r})
if {signal!r}:
    os.kill(os.getpid(), {signal!r})
if {registers!r}:
    def rms_norm(out, x, weight, epsilon):
        out[0] = {result!r}
    torch.ops._C.rms_norm = rms_norm
"""


@pytest.fixture
def fake_vllm_venv(tmp_path):
    """`fake_vllm_venv(**how)`: a venv directory whose bin/python imports the stand-in. `how`: the vLLM
    `version`, the `device` it chooses, the `library` it loads, whether it `registers` rms_norm and its
    `result`, a `warning` it logs, a `signal` it dies of."""
    import _ctypes

    def make(version="0.32.0+cpu", device="cpu", library="_C_AVX2.abi3.so", registers=True, result=1.0,
             warning="", signal=0):  # fmt: skip
        site = tmp_path / "site"
        (site / "vllm" / "platforms").mkdir(parents=True)
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
        (site / "vllm" / "__init__.py").write_text(f"__version__ = {version!r}\n")
        (site / "vllm" / "platforms" / "__init__.py").write_text(
            f"import types\ncurrent_platform = types.SimpleNamespace(device_type={device!r})\n"
        )
        (site / "vllm" / library).write_bytes(Path(_ctypes.__file__).read_bytes())
        (site / "vllm" / "_custom_ops.py").write_text(
            FAKE_CUSTOM_OPS.format(
                library=str(site / "vllm" / library), warning=warning, signal=signal, registers=registers, result=result
            )
        )
        (site / "amx_plugin.py").write_text("def ask():\n    return False\n")
        (site / "amx_plugin-1.0.dist-info").mkdir()
        (site / "amx_plugin-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: amx-plugin\n")
        (site / "amx_plugin-1.0.dist-info" / "entry_points.txt").write_text(
            "[vllm.general_plugins]\nllmops_amx_permission = amx_plugin:ask\n"
        )
        python = tmp_path / "venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        return str(tmp_path / "venv")

    return make
