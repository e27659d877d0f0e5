"""deploy.yml's planning step, run for real on the controller: a user's catalog directory, config.json
fetched from a hub (on loopback), the seed host's GPU facts, and a layout that must fail before any change.

It needs no local host: the play targets localhost, in check mode, and stops at the plan.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "unit" / "fixtures" / "configs" / "MiniMax-M2.5.config.json"


def pcie_box(count=8, memory_total_mib=97887):
    gpus = [
        {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
         "memory_total_mib": memory_total_mib, "memory_used_mib": 0, "mig_mode": "Disabled",
         "pci_bus_id": f"00000000:{index + 0x18:02X}:00.0", "compute_capability": "12.0"}
        for index in range(count)
    ]  # fmt: skip
    pairs = [{"gpus": [a, b], "link": "SYS", "kind": "pcie"} for a in range(count) for b in range(a + 1, count)]
    topology = {"matrix": [], "pairs": pairs, "all_nvlink": False}
    return {"present": True, "count": count, "gpus": gpus, "topology": topology,
            "driver_version": "580.95.05", "cuda_version": "13.0", "backend": "nvml"}  # fmt: skip


def deploy(tmp_path, *extra):
    inventory = tmp_path / "hosts.yml"
    host = {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"vllm_hosts": {"hosts": {"localhost": host}}}))
    command = ["ansible-playbook", "-i", str(inventory), "--check", "playbooks/deploy.yml", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)


def test_user_entry_with_a_layout_that_cannot_load_fails_at_the_plan(tmp_path, hub_server):
    endpoint, requests = hub_server({"/me/MiniMax-M2.5-copy/resolve/v1/config.json": CONFIG.read_bytes()})
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "my_minimax.yml").write_text(
        "source: {kind: hub, repo: me/MiniMax-M2.5-copy, revision: v1}\n"
        "served_name: my-minimax\ncheckpoint_size: 230 GB\nlayout: {tensor_parallel_size: 8}\n"
        "alternatives:\n  ep8: {tensor_parallel_size: 8, expert_parallel_size: 8}\n"
    )
    facts = tmp_path / "gpus.json"
    # GPUs this controller does not have: the device files that a real GPU host must have are not asked for.
    facts.write_text(json.dumps({"vllm_gpus": pcie_box(), "vllm_preflight_nvidia_devices": []}))
    proc = deploy(
        tmp_path, "-e", "model=my_minimax", "-e", f"vllm_catalog_paths={catalog}",
        "-e", f"vllm_hub_endpoint={endpoint}", "-e", f"@{facts}",
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert [request["path"] for request in requests] == ["/me/MiniMax-M2.5-copy/resolve/v1/config.json"]
    assert "Layout rule quantization_alignment failed for my_minimax TP8" in output
    assert "ep8 {'tensor_parallel_size': 8, 'expert_parallel_size': 8}" in output
    # Nothing after the plan ran: no role task was reached.
    assert "vllm_install" not in output
    assert "Deploy the planned layout" not in output


TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
               "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
               "max_position_embeddings": 4096, "vocab_size": 512}  # fmt: skip


def test_one_hub_token_reaches_the_plan_and_the_download(tmp_path, hub_server):
    """The planner read the hub with vllm_server_hf_token, the download with vllm_weights_hub_token: a gated
    repository needed both. vllm_hub_token reaches both: the plan's config.json and the weights' file list."""
    token = "hf_gated_repo_token_81c3"
    config = json.dumps(TINY_CONFIG).encode()
    info = json.dumps({"sha": "c" * 40, "siblings": [{"rfilename": "config.json", "size": len(config)}]}).encode()
    endpoint, requests = hub_server(
        {"/me/gated-tiny/resolve/v1/config.json": config, "/api/models/me/gated-tiny/revision/v1?blobs=true": info},
        token=token,
    )
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "gated_tiny.yml").write_text(
        "source: {kind: hub, repo: me/gated-tiny, revision: v1}\nserved_name: gated-tiny\n"
    )
    proc = deploy(
        tmp_path, "--tags", "preflight", "-e", "model=gated_tiny", "-e", f"vllm_catalog_paths={catalog}",
        "-e", f"vllm_hub_endpoint={endpoint}", "-e", f"vllm_hub_token={token}",
        "-e", f"vllm_weights_root={tmp_path / 'models'}",
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert [(request["path"], request["authorization"]) for request in requests] == [
        ("/me/gated-tiny/resolve/v1/config.json", f"Bearer {token}"),
        ("/api/models/me/gated-tiny/revision/v1?blobs=true", f"Bearer {token}"),
    ]
    assert token not in output
