from pathlib import Path

import pytest
from ansible.module_utils import basic

from ansible_collections.llmops.vllm.plugins.modules import gpu_facts

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"


@pytest.fixture
def run(run_module, monkeypatch):
    monkeypatch.setattr(gpu_facts, "pynvml", None)  # whether or not this interpreter has it
    return lambda args=None, fails=False: run_module(gpu_facts.main, args or {}, fails)


@pytest.fixture
def nvidia_smi(monkeypatch):
    """nvidia-smi on PATH, answering with the outputs captured on the two-GPU H200 machine."""
    answers = {
        "--query-gpu": (0, (FIXTURES / "h200-2gpu" / "query-gpu.csv").read_text(), ""),
        "topo": (0, (FIXTURES / "h200-2gpu" / "topo-m.txt").read_text(), ""),
        "-q": (0, (FIXTURES / "h200-2gpu" / "query.xml").read_text(), ""),
    }

    def run_command(self, command, **_kwargs):
        assert command[0] == "/usr/bin/nvidia-smi"
        return answers[command[1].split("=")[0]]

    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, **_kw: f"/usr/bin/{name}")
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    return answers


def test_facts_of_two_bridged_h200s(run, nvidia_smi):
    result = run()
    assert result["changed"] is False
    assert result["ansible_facts"]["vllm_gpus"] == {
        "present": True,
        "backend": "nvidia-smi",
        "count": 2,
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-a5d0b967-65ff-5e9c-2283-46985c5c9291",
                "name": "NVIDIA H200",
                "memory_total_mib": 143771,
                "memory_used_mib": 0,
                "mig_mode": "Disabled",
                "pci_bus_id": "00000000:00:06.0",
            },
            {
                "index": 1,
                "uuid": "GPU-2e2a7309-362b-b544-b123-a009c322962a",
                "name": "NVIDIA H200",
                "memory_total_mib": 143771,
                "memory_used_mib": 0,
                "mig_mode": "Disabled",
                "pci_bus_id": "00000000:00:07.0",
            },
        ],
        "topology": {
            "matrix": [["X", "NV18"], ["NV18", "X"]],
            "pairs": [{"gpus": [0, 1], "link": "NV18", "kind": "nvlink"}],
            "all_nvlink": True,
        },
    }


def test_facts_of_eight_nvlink_gpus(run, nvidia_smi):
    row = "{0}, GPU-{0:08d}-0000-0000-0000-000000000000, NVIDIA H200, 143771, 0, Disabled, 00000000:{0:02X}:00.0\n"
    nvidia_smi["--query-gpu"] = (0, "".join(row.format(index) for index in range(8)), "")
    nvidia_smi["topo"] = (0, (FIXTURES / "hgx-8gpu-nvlink.txt").read_text(), "")
    facts = run()["ansible_facts"]["vllm_gpus"]
    assert facts["count"] == 8 and facts["topology"]["all_nvlink"] is True
    assert len(facts["topology"]["pairs"]) == 28


def test_a_broken_query_fails_with_what_nvidia_smi_said(run, nvidia_smi):
    nvidia_smi["topo"] = (3, "", "Unable to determine the device handle for GPU0: Unknown Error\n")
    result = run(fails=True)
    assert result["msg"] == (
        "The NVIDIA driver answered, but reading the GPUs through nvidia-smi failed: /usr/bin/nvidia-smi topo -m "
        "failed with rc 3: Unable to determine the device handle for GPU0: Unknown Error"
    )


def test_no_driver_is_a_fact_not_a_failure(run):
    # This machine has no NVIDIA driver: the real lookup runs, in check mode too.
    result = run({"_ansible_check_mode": True})
    facts = result["ansible_facts"]["vllm_gpus"]
    assert result["changed"] is False
    assert facts["present"] is False and facts["count"] == 0 and facts["backend"] is None
    assert facts["reason"].startswith("No NVIDIA driver: libnvidia-ml.so.1 cannot be loaded (")
    assert facts["reason"].endswith("; nvidia-smi is not on PATH")
    assert facts["topology"] == {"matrix": [], "pairs": [], "all_nvlink": False}
