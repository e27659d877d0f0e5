"""GPU modules on the local host, which has no NVIDIA driver: facts say so, the wait fails clearly.

The GPU side of these modules runs on a real H200 in benchmarks/gpu_memory_wait.py; here the same modules
meet a real CPU-only host through Ansible, and a real systemd unit for the GPUs of a unit.
"""

import pytest

NO_DRIVER = "No NVIDIA driver on this host, so there is no GPU memory to wait for"
UNIT = "llmops-gpu-test.service"
UNIT_FILE = """[Unit]
Description=stands for a vLLM server pinned to GPUs
[Service]
Environment=CUDA_VISIBLE_DEVICES=0,1 "OTHER=two words"
EnvironmentFile=/etc/llmops-gpu-test.env
EnvironmentFile=-/etc/llmops-gpu-test-optional.env
ExecStart=/bin/sleep infinity
"""


@pytest.fixture(scope="module")
def pinned_unit(local_host):
    """A running unit whose EnvironmentFile moves it to GPUs 2 and 3, as systemd resolves it."""
    local_host.sh(
        f"cat > /run/systemd/system/{UNIT} <<'EOF'\n{UNIT_FILE}EOF\n"
        "printf 'CUDA_VISIBLE_DEVICES=\"2,3\"\\n' > /etc/llmops-gpu-test.env && "
        f"systemctl daemon-reload && systemctl start {UNIT}"
    )
    yield UNIT
    local_host.sh(
        f"systemctl stop {UNIT}; rm -f /run/systemd/system/{UNIT} /etc/llmops-gpu-test.env; systemctl daemon-reload"
    )


def host_state(local_host):
    """What these modules could change and must not: units (the test's, vLLM's), files under /etc, unit files."""
    return local_host.sh(
        "systemctl list-units --all --no-legend --plain 'llmops*' 'vllm*'; "
        "find /etc /run/systemd/system -xdev -newer /etc/hostname | sort",
        timeout=60,
    ).stdout


@pytest.mark.parametrize("check_mode", [False, True])
def test_facts_say_there_are_no_gpus_and_why(local_host, check_mode):
    before = host_state(local_host)
    # Ad hoc `-a '{}'` reads as raw parameters, which modules refuse: name the default.
    result = local_host.module("llmops.vllm.gpu_facts", check_mode=check_mode, backend="auto")
    assert not result.get("failed"), result
    assert result["changed"] is False
    facts = result["ansible_facts"]["vllm_gpus"]
    assert facts["present"] is False and facts["count"] == 0 and facts["gpus"] == []
    assert facts["backend"] is None
    assert facts["reason"].startswith("No NVIDIA driver: libnvidia-ml.so.1 cannot be loaded (libnvidia-ml.so.1: ")
    assert facts["reason"].endswith("; nvidia-smi is not on PATH")
    assert host_state(local_host) == before


def test_the_wait_fails_and_says_what_is_missing(local_host):
    before = host_state(local_host)
    result = local_host.module("llmops.vllm.gpu_memory_wait", gpus=["0", "1"], timeout=5)
    assert result["failed"] is True
    assert result["msg"].startswith(f"{NO_DRIVER} (gpus: 0,1): libnvidia-ml.so.1 cannot be loaded (")
    assert (
        "; nvidia-smi is not on PATH. On hosts that may have no GPU, run llmops.vllm.gpu_facts first" in result["msg"]
    )
    assert result.get("changed") is False
    assert host_state(local_host) == before


def test_the_gpus_of_a_unit_come_from_its_environment_files(local_host, pinned_unit):
    before = host_state(local_host)
    result = local_host.module("llmops.vllm.gpu_memory_wait", unit=pinned_unit, terminate_leftovers=True)
    assert result["failed"] is True
    assert result["msg"].startswith(f"{NO_DRIVER} (CUDA_VISIBLE_DEVICES=2,3 of {pinned_unit}): ")
    assert result["gpus_from"] == f"CUDA_VISIBLE_DEVICES=2,3 of {pinned_unit}"
    assert local_host.sh(f"systemctl is-active {pinned_unit}").stdout.strip() == "active"
    assert host_state(local_host) == before


def test_an_unknown_unit_is_refused(local_host):
    result = local_host.module("llmops.vllm.gpu_memory_wait", unit="llmops-no-such.service")
    assert result["failed"] is True
    assert result["msg"] == "The unit llmops-no-such.service does not exist on this host, so its GPUs are unknown."


def test_plays_skip_gpu_steps_with_when_present(local_host):
    proc = local_host.playbook("tests/integration/playbooks/gpu_steps_on_cpu_host.yml")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "skipping:" in proc.stdout
