import os
import subprocess
from dataclasses import replace

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.gpu.memory import (
    GpuSelectionError,
    Holder,
    describe,
    find_holders,
    fit_limits,
    memory_limits,
    memory_state,
    parse_visible_devices,
    same_program,
    select_gpus,
    unit_environment,
)
from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import Gpu, GpuProcess
from ansible_collections.llmops.vllm.plugins.module_utils.service.processes import Process

GPUS = [
    Gpu(0, "GPU-aaaa1111-0000", "NVIDIA H200", 143771, 0, "Disabled", "00000000:18:00.0"),
    Gpu(1, "GPU-aaaa2222-0000", "NVIDIA H200", 143771, 9216, "Disabled", "00000000:2A:00.0"),
    Gpu(2, "GPU-bbbb3333-0000", "NVIDIA H200", 143771, 3, "Disabled", "00000000:3A:00.0"),
]


def files(contents):
    def read(path):
        if path not in contents:
            raise FileNotFoundError(2, "No such file or directory", path)
        return contents[path]

    return read


def test_unit_environment_files_override_environment():
    environment = unit_environment(
        '"A=two words" CUDA_VISIBLE_DEVICES=0,1\n',
        "/etc/vllm/tiny.env (ignore_errors=no)\n/etc/vllm/missing.env (ignore_errors=yes)\n",
        files({"/etc/vllm/tiny.env": '# GPUs of this instance\nCUDA_VISIBLE_DEVICES="2,3"\n'}),
    )
    assert environment == {"A": "two words", "CUDA_VISIBLE_DEVICES": "2,3"}


def test_unit_environment_needs_its_required_files():
    with pytest.raises(GpuSelectionError, match=r"cannot read the unit's EnvironmentFile /etc/vllm/gone\.env"):
        unit_environment("", "/etc/vllm/gone.env (ignore_errors=no)\n", files({}))


@pytest.mark.parametrize(
    ("value", "wanted"),
    [
        (None, None),
        ("0,1", ["0", "1"]),
        (" 2 , 3 ", ["2", "3"]),
        ("GPU-aaaa1111", ["GPU-aaaa1111"]),
        ("", []),
        ("-1", []),
        ("1,-1,2", ["1"]),
    ],
)
def test_parse_visible_devices(value, wanted):
    assert parse_visible_devices(value) == wanted


def test_mig_devices_are_refused():
    with pytest.raises(GpuSelectionError, match="MIG device"):
        parse_visible_devices("MIG-4a2c-0000")


@pytest.mark.parametrize(
    ("wanted", "indices"),
    [
        (None, [0, 1, 2]),
        (["all"], [0, 1, 2]),
        (["2", "0"], [2, 0]),
        (["1", "GPU-aaaa2222-0000"], [1]),
        (["gpu-bbbb"], [2]),
        ([], []),
    ],
)
def test_select_gpus(wanted, indices):
    assert [gpu.index for gpu in select_gpus(GPUS, wanted)] == indices


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (["7"], "GPU '7' is not on this host; the GPUs here are 0 (GPU-aaaa1111-0000), 1 (GPU-aaaa2222-0000), 2"),
        (["GPU-aaaa"], "GPU 'GPU-aaaa' matches several GPUs"),
    ],
)
def test_select_gpus_says_what_is_there(wanted, message):
    with pytest.raises(GpuSelectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        select_gpus(GPUS, wanted)


def test_limits_from_a_threshold_or_a_baseline():
    assert memory_limits(GPUS[:2], 1024, None, 256) == {0: 1024, 1: 1024}
    baseline = {"0": 3, "GPU-aaaa2222-0000": "512"}
    assert memory_limits(GPUS[:2], 1024, baseline, 256) == {0: 259, 1: 768}


@pytest.mark.parametrize(
    ("baseline", "message"),
    [
        ({"0": 3}, r"baseline has no value for GPU 1 \(GPU-aaaa2222-0000\); its keys are \['0'\]"),
        ({"0": 3, "1": "lots"}, "baseline value for GPU 1 is 'lots', not a number of MiB"),
    ],
)
def test_bad_baselines(baseline, message):
    with pytest.raises(GpuSelectionError, match=message):
        memory_limits(GPUS[:2], 1024, baseline, 256)


def test_memory_state():
    done, observed = memory_state(GPUS, {0: 1024, 2: 1024})
    assert done is True
    assert observed == [
        {"index": 0, "uuid": "GPU-aaaa1111-0000", "memory_used_mib": 0, "memory_total_mib": 143771, "limit_mib": 1024},
        {"index": 2, "uuid": "GPU-bbbb3333-0000", "memory_used_mib": 3, "memory_total_mib": 143771, "limit_mib": 1024},
    ]
    assert memory_state(GPUS, {0: 1024, 1: 1024})[0] is False


def test_a_gpu_that_disappears_is_an_error():
    with pytest.raises(GpuSelectionError, match=r"GPUs \[0, 5\] were asked for"):
        memory_state(GPUS, {0: 1024, 5: 1024})


def test_holders_are_described_from_proc(idle_process):
    gone = subprocess.Popen(["true"])
    gone.wait()
    processes = [
        GpuProcess("GPU-aaaa2222-0000", idle_process.pid, idle_process.args[0], 9216),
        GpuProcess("GPU-aaaa2222-0000", gone.pid, "VLLM::Worker", None),
        GpuProcess("GPU-cccc-not-waited-for", os.getpid(), "python3", 100),
    ]
    holders = find_holders(processes, GPUS[:2], owner_unit="vllm-tiny.service")
    assert [holder.driver.pid for holder in holders] == [idle_process.pid, gone.pid]
    first, second = (holder.as_dict() for holder in holders)
    assert first["gpu"] == 1 and first["used_mib"] == 9216
    assert first["cmdline"].endswith("import time; time.sleep(60) gpu-holder")
    assert first["belongs_to_unit"] is False and first["vllm"] is False
    # A process that /proc does not show keeps the driver's name.
    assert second == {
        "gpu": 1,
        "gpu_uuid": "GPU-aaaa2222-0000",
        "pid": gone.pid,
        "name": "VLLM::Worker",
        "cmdline": "",
        "used_mib": None,
        "unit": None,
        "belongs_to_unit": False,
        "vllm": False,
    }

    message = describe(memory_state(GPUS, {0: 1024, 1: 1024})[1], holders)
    assert message.startswith(f"GPU 1 (GPU-aaaa2222-0000) uses 9216 MiB, more than 1024 MiB: PID {idle_process.pid} ")
    assert "(9216 MiB, " in message and "not the unit's" in message and "time.sleep(60) gpu-holder;" in message
    assert f"PID {gone.pid} VLLM::Worker (? MiB, in no systemd unit, not the unit's)." in message


def test_a_pid_that_is_another_program_here_is_not_described_as_the_holder(idle_process):
    # As inside a container, where the driver's PID (the host's) can be another local process.
    driver = GpuProcess("GPU-aaaa2222-0000", idle_process.pid, "/usr/bin/other-program", 9216)
    (holder,) = find_holders([driver], GPUS, owner_unit=None)
    assert holder.process is None and holder.leftover is False
    assert holder.as_dict()["name"] == "/usr/bin/other-program" and holder.as_dict()["cmdline"] == ""


@pytest.mark.parametrize(
    ("driver_name", "same"),
    [
        ("", True),
        ("/opt/vllm/venv/bin/python3", True),
        ("python3", True),
        ("VLLM::Worker_TP", True),
        ("/opt/vllm/venv/bin/python3 -m vllm", True),
        ("/usr/bin/sleep", False),
    ],
)
def test_same_program(driver_name, same):
    process = replace(worker(None, name="VLLM::Worker_TP"), cmdline="/opt/vllm/venv/bin/python3 -m vllm serve")
    assert same_program(driver_name, process) is same


def test_a_gpu_held_by_no_listed_process_says_so():
    message = describe(memory_state(GPUS, {1: 1024})[1], [])
    assert message == (
        "GPU 1 (GPU-aaaa2222-0000) uses 9216 MiB, more than 1024 MiB: "
        "the driver lists no process on it (one in another container or PID namespace?)."
    )


def worker(unit, name="VLLM::Worker_TP0"):
    return Process(pid=4312, ppid=1, session=4312, uid=998, start_ticks=1, name=name, cmdline=name, unit=unit)


@pytest.mark.parametrize(
    ("process", "owner_unit", "leftover"),
    [
        (worker(None), None, True),
        (worker(None), "vllm-tiny.service", True),
        (worker("vllm-tiny.service"), "vllm-tiny.service", True),
        (worker("vllm-other.service"), "vllm-tiny.service", False),
        (worker("vllm-other.service"), None, False),
        (worker(None, name="python3"), None, False),
        (None, None, False),
    ],
)
def test_only_vllm_processes_of_the_owner_or_of_no_unit_are_leftovers(process, owner_unit, leftover):
    holder = Holder(GPUS[0], GpuProcess(GPUS[0].uuid, 4312, "VLLM::Worker_TP0", 1000), process, owner_unit)
    assert holder.leftover is leftover


def test_the_idle_process_is_described_by_proc_as_soon_as_the_fixture_yields(idle_process):
    """The fixture waits for what the tests need: after Popen returns, the child's /proc/PID/cmdline is often
    still empty for a moment (seen here 2 to 3 times in 5)."""
    with open(f"/proc/{idle_process.pid}/cmdline", "rb") as cmdline:
        assert cmdline.read().endswith(b"gpu-holder\0")


def test_room_for_a_server_s_share_beside_what_a_gpu_holds():
    # 0.9 of 143,771 MiB must be free, and CUDA never gives out its own 512 MiB.
    assert fit_limits(GPUS[:2], 0.9) == {0: 13865, 1: 13865}
    assert fit_limits(GPUS[:1], 1.0) == {0: 0}
