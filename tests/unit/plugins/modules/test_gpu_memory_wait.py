import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from ansible.module_utils import basic

from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import Gpu, GpuProcess
from ansible_collections.llmops.vllm.plugins.modules import gpu_memory_wait

H200 = Gpu(0, "GPU-d0f1eba3-ac23-d843-fbe6-d95a497ee56c", "NVIDIA H200", 143771, 0, "Disabled", "00000000:00:06.0")
SECOND = Gpu(1, "GPU-5c1e0000-0000-0000-0000-000000000001", "NVIDIA H200", 143771, 0, "Disabled", "00000000:00:07.0")
FAST = {"interval": 0.01, "timeout": 0.3}


class ScriptedBackend:
    """A reader that answers a scripted sequence of memory samples (used MiB of GPU 0, 1), then the last."""

    name = "nvml"

    def __init__(self, samples, processes=(), gpus=(H200, SECOND)):
        self.samples = list(samples)
        self.process_list = list(processes)
        self.gpu_list = gpus
        self.polls = 0
        self.closed = False

    def gpus(self):
        used = self.samples[min(self.polls, len(self.samples) - 1)]
        self.polls += 1
        return [replace(gpu, memory_used_mib=mib) for gpu, mib in zip(self.gpu_list, used, strict=True)]

    def processes(self):
        return self.process_list

    def close(self):
        self.closed = True


@pytest.fixture
def run(run_module, monkeypatch):
    """Run the module against a scripted backend; the rest (processes, signals, the clock) is real."""

    def run(backend, args, fails=False):
        monkeypatch.setattr(gpu_memory_wait, "open_backend", lambda *_args: backend)
        return run_module(gpu_memory_wait.main, args, fails)

    return run


def test_waits_for_consecutive_clean_polls(run):
    # The first poll picks the GPUs; then held, free, held again, and free twice in a row.
    backend = ScriptedBackend([(0, 0), (9216, 0), (0, 0), (9216, 0), (0, 0), (0, 0)])
    result = run(backend, {"gpus": ["0"], **FAST})
    assert result["changed"] is False
    assert result["polls"] == 5
    assert result["used_mib"] == {"0": 0}
    assert result["gpus"] == [
        {"index": 0, "uuid": H200.uuid, "memory_used_mib": 0, "memory_total_mib": 143771, "limit_mib": 1024}
    ]
    assert result["backend"] == "nvml" and result["gpus_from"] == "gpus: 0"
    assert backend.closed


def test_only_the_chosen_gpus_count(run):
    result = run(ScriptedBackend([(0, 9216)]), {"gpus": [H200.uuid], "consecutive": 1, **FAST})
    assert result["polls"] == 1 and result["used_mib"] == {"0": 0}


def test_baseline_and_margin(run):
    args = {"baseline": {"0": 600, "1": 0}, "max_above_baseline_mib": 100, **FAST}
    result = run(ScriptedBackend([(0, 0), (800, 0), (700, 50)]), args)
    assert result["polls"] == 3 and result["used_mib"] == {"0": 700, "1": 50}
    assert [gpu["limit_mib"] for gpu in result["gpus"]] == [700, 100]


def test_timeout_names_each_process_on_each_gpu(run, idle_process):
    processes = [GpuProcess(SECOND.uuid, idle_process.pid, idle_process.args[0], 9000)]
    result = run(ScriptedBackend([(0, 9216)], processes), {"owner_unit": "vllm-a.service", **FAST}, fails=True)
    assert result["msg"].startswith("GPU memory still in use after ")
    name = Path(f"/proc/{idle_process.pid}/comm").read_text().strip()  # /proc's name for it, as the module gives it
    assert (
        f"GPU 1 ({SECOND.uuid}) uses 9216 MiB, more than 1024 MiB: PID {idle_process.pid} {name} (9000 MiB, "
        "in no systemd unit, not the unit's): " in result["msg"]
    )
    assert result["processes"][0]["pid"] == idle_process.pid and result["processes"][0]["belongs_to_unit"] is False
    assert result["used_mib"] == {"0": 0, "1": 9216}
    assert "terminated" not in result


@pytest.fixture
def leftover():
    """A real process that looks like a vLLM worker and ignores SIGTERM, as a stuck one does."""
    # vLLM's workers rename themselves (setproctitle); PR_SET_NAME (15) does it for /proc/PID/comm.
    code = (
        "import ctypes, signal, time; ctypes.CDLL(None).prctl(15, b'VLLM::Worker_TP', 0, 0, 0); "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    yield child
    child.kill()
    child.wait()


class HeldWhileAlive(ScriptedBackend):
    """GPU 0 is used while a real process lives, as the driver frees memory when its holder exits."""

    def __init__(self, process):
        super().__init__([(0, 0)], [GpuProcess(H200.uuid, process.pid, process.args[0], 9216)])
        self.process = process

    def gpus(self):
        self.polls += 1
        return [replace(H200, memory_used_mib=9216 if self.process.poll() is None else 0), SECOND]


def test_terminate_leftovers_ends_a_stuck_vllm_process(run, leftover):
    args = {"gpus": ["0"], "terminate_leftovers": True, "grace": 0.2, **FAST}
    result = run(HeldWhileAlive(leftover), args)
    assert result["changed"] is True
    assert result["terminated"]["killed"] == [leftover.pid]  # SIGTERM was ignored
    assert result["used_mib"] == {"0": 0}
    assert leftover.poll() is not None


def test_check_mode_terminates_nothing(run, leftover):
    args = {"gpus": ["0"], "terminate_leftovers": True, "_ansible_check_mode": True, **FAST}
    result = run(HeldWhileAlive(leftover), args)
    assert result["changed"] is True and result["would_terminate"] == [leftover.pid]
    assert result["msg"] == f"Check mode: would end the leftover vLLM processes [{leftover.pid}] and wait again."
    assert leftover.poll() is None


def test_leftovers_are_only_vllm_processes(run, idle_process):
    backend = ScriptedBackend([(9216, 0)], [GpuProcess(H200.uuid, idle_process.pid, idle_process.args[0], 9216)])
    result = run(backend, {"gpus": ["0"], "terminate_leftovers": True, **FAST}, fails=True)
    assert result["changed"] is False and "terminated" not in result
    assert f"PID {idle_process.pid}" in result["msg"]
    assert idle_process.poll() is None


def systemctl_show(values):
    def run_command(self, command, **_kwargs):
        assert command[:3] == ["/usr/bin/systemctl", "show", "-P"]
        return 0, values[command[3]], ""

    return run_command


def test_gpus_of_a_unit(run, monkeypatch, tmp_path):
    env_file = tmp_path / "tiny.env"
    env_file.write_text('CUDA_VISIBLE_DEVICES="1"\n')
    values = {"LoadState": "loaded\n", "Environment": "CUDA_VISIBLE_DEVICES=0,1\n"}
    values["EnvironmentFiles"] = f"{env_file} (ignore_errors=no)\n"
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, **_kw: f"/usr/bin/{name}")
    monkeypatch.setattr(basic.AnsibleModule, "run_command", systemctl_show(values))
    result = run(ScriptedBackend([(9216, 0)]), {"unit": "vllm-tiny.service", **FAST})
    assert result["gpus_from"] == "CUDA_VISIBLE_DEVICES=1 of vllm-tiny.service"
    assert result["used_mib"] == {"1": 0}


def test_a_unit_that_does_not_exist(run, monkeypatch):
    values = {"LoadState": "not-found\n", "Environment": "", "EnvironmentFiles": ""}
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, **_kw: f"/usr/bin/{name}")
    monkeypatch.setattr(basic.AnsibleModule, "run_command", systemctl_show(values))
    result = run(ScriptedBackend([(0, 0)]), {"unit": "vllm-nope.service"}, fails=True)
    assert result["msg"] == "The unit vllm-nope.service does not exist on this host, so its GPUs are unknown."


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"gpus": ["0"], "unit": "vllm-a.service"}, "parameters are mutually exclusive: gpus|unit"),
        ({"max_used_mib": 10, "baseline": {"0": 1}}, "parameters are mutually exclusive: max_used_mib|baseline"),
        ({"timeout": 0}, "timeout must be more than 0 seconds, got 0"),
        ({"consecutive": 0}, "consecutive must be 1 or more, got 0"),
        ({"gpus": ["4"]}, "GPU '4' is not on this host; the GPUs here are 0 (GPU-d0f1eba3"),
        ({"baseline": {"0": 1}}, "baseline has no value for GPU 1"),
        ({"backend": "dcgm"}, "value of backend must be one of: auto, nvml, nvidia-smi, got: dcgm"),
    ],
)
def test_bad_input_is_refused_before_waiting(run, args, message):
    backend = ScriptedBackend([(0, 0)])
    result = run(backend, args, fails=True)
    assert message in result["msg"]
    assert backend.polls <= 1


def test_no_driver_is_a_clear_failure(run_module, monkeypatch):
    # This machine has no NVIDIA driver: the real lookup runs.
    monkeypatch.setattr(gpu_memory_wait, "pynvml", None)
    result = run_module(gpu_memory_wait.main, {"gpus": ["0", "1"]}, fails=True)
    assert result["msg"].startswith(
        "No NVIDIA driver on this host, so there is no GPU memory to wait for (gpus: 0,1): "
        "libnvidia-ml.so.1 cannot be loaded ("
    )
    assert (
        "; nvidia-smi is not on PATH. On hosts that may have no GPU, run llmops.vllm.gpu_facts first" in result["msg"]
    )
