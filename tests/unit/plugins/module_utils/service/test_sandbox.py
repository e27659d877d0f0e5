"""What the hardened vLLM unit would keep from the server: hidden paths, read-only caches, the allocator's
system call, and NVIDIA devices that no DeviceAllow= group opens (resolved as systemd resolves them)."""

from pathlib import Path

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.sandbox import (
    allowed_majors,
    character_devices,
    expandable_segments_variable,
    filter_allows,
    hiding_setting,
    limit_refusals,
    sandbox_refusals,
    uncovered_nvidia_device_refusals,
)

PROC_DEVICES = Path(__file__).resolve().parents[3] / "fixtures" / "proc-devices"
DEFAULT_ALLOW = ["char-nvidia-frontend", "char-nvidia", "char-nvidiactl", "char-nvidia-uvm", "char-nvidia-caps"]
DEFAULT_FILTER = ["@system-service", "~@privileged"]


def settings(**overrides):
    base = {
        "home": "/var/lib/vllm",
        "paths": {
            "the venv's interpreter (vllm_server_python)": ["/opt/vllm/venv/bin/python", "/usr/bin/python3.11"],
            "the weights (vllm_server_model_path)": ["/var/lib/vllm/models/tiny", ""],
        },
        "environment": {"HOME": "/var/lib/vllm", "HF_HOME": "/var/lib/vllm/huggingface", "HF_HUB_OFFLINE": "1"},
        "system_call_filter": DEFAULT_FILTER,
        "sleep_mode": False,
        "device": "cuda",
        "device_allow": DEFAULT_ALLOW,
        "proc_devices": (PROC_DEVICES / "h200-580.txt").read_text(),
    }
    return base | overrides


def test_the_role_defaults_leave_nothing_to_refuse_on_an_h200():
    assert sandbox_refusals(settings()) == []


@pytest.mark.parametrize(
    ("path", "hidden"),
    [
        ("/home/ml/venv/bin/python", ("ProtectHome=yes", "/home")),
        ("/root", ("ProtectHome=yes", "/root")),
        ("/run/user/1000/models", ("ProtectHome=yes", "/run/user")),
        ("/tmp/tinyllama", ("PrivateTmp=yes", "/tmp")),
        ("/var/tmp/x/../site", ("PrivateTmp=yes", "/var/tmp")),
        ("/homes/models", None),
        ("/opt/vllm/venv/bin/python", None),
        ("/var/lib/vllm/models", None),
    ],
)
def test_a_path_is_hidden_by_the_setting_whose_directory_holds_it(path, hidden):
    assert hiding_setting(path) == hidden


def test_a_venv_whose_interpreter_links_into_root_is_refused_naming_the_link_target_and_the_setting():
    refusals = sandbox_refusals(
        settings(
            paths={
                "the venv's interpreter (vllm_server_python)": [
                    "/opt/vllm/venv/bin/python",
                    "/root/.pyenv/versions/3.11.7/bin/python3.11",
                ]
            }
        )
    )
    assert refusals == [
        "the venv's interpreter (vllm_server_python) is /root/.pyenv/versions/3.11.7/bin/python3.11, under /root, "
        "which the unit's ProtectHome=yes hides from the server: move it (under /opt or /var/lib/vllm, say), or "
        "leave the sandbox off on this host (vllm_server_hardening: false)"
    ]


def test_weights_in_tmp_and_an_environment_path_under_home_are_each_refused():
    refusals = sandbox_refusals(
        settings(
            paths={"the weights (vllm_server_model_path)": ["/tmp/tinyllama", ""]},
            environment={"HOME": "/var/lib/vllm", "PYTHONPATH": "/home/ml/site"},
        )
    )
    assert len(refusals) == 2
    assert refusals[0].startswith(
        "the weights (vllm_server_model_path) is /tmp/tinyllama, under /tmp, which the unit's PrivateTmp=yes"
    )
    assert refusals[1].startswith(
        "the environment's PYTHONPATH is /home/ml/site, under /home, which the unit's ProtectHome=yes"
    )


def test_a_cache_outside_the_home_is_refused_as_read_only_and_one_in_shared_memory_is_not():
    refusals = sandbox_refusals(
        settings(
            environment={
                "HOME": "/var/lib/vllm",
                "VLLM_CACHE_ROOT": "/var/cache/vllm",
                "TRITON_CACHE_DIR": "/dev/shm/triton",
            }
        )
    )
    assert refusals == [
        "the environment's VLLM_CACHE_ROOT is /var/cache/vllm, which the unit's ProtectSystem=strict makes read-only "
        "(only /var/lib/vllm, the service's home, is writable): point it under /var/lib/vllm, or leave it out"
    ]


@pytest.mark.parametrize(
    ("environment", "variable"),
    [
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "PYTORCH_CUDA_ALLOC_CONF"),
        ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512, expandable_segments : true"}, "PYTORCH_ALLOC_CONF"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, None),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, None),
        ({}, None),
    ],
)
def test_expandable_segments_are_found_in_either_allocator_variable(environment, variable):
    assert expandable_segments_variable(environment) == variable


def test_expandable_segments_are_refused_where_the_filter_refuses_pidfd_getfd_and_allowed_where_it_names_it():
    environment = {"HOME": "/var/lib/vllm", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    (refusal,) = sandbox_refusals(settings(environment=environment))
    assert "pidfd_getfd, which the unit's system-call filter refuses" in refusal
    assert "add pidfd_getfd to vllm_server_system_call_filter" in refusal
    relaxed = [*DEFAULT_FILTER, "pidfd_getfd"]
    assert sandbox_refusals(settings(environment=environment, system_call_filter=relaxed)) == []
    assert sandbox_refusals(settings(environment=environment, system_call_filter=[])) == []


def test_expandable_segments_with_sleep_mode_are_refused_whatever_the_filter():
    environment = {"HOME": "/var/lib/vllm", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    (refusal,) = sandbox_refusals(
        settings(environment=environment, sleep_mode=True, system_call_filter=[*DEFAULT_FILTER, "pidfd_getfd"])
    )
    assert "'Expandable segments are not compatible with memory pool'" in refusal


@pytest.mark.parametrize(
    ("lines", "allowed"),
    [
        (DEFAULT_FILTER, False),
        ([*DEFAULT_FILTER, "pidfd_getfd pidfd_open"], True),
        (["@system-service", "~@privileged pidfd_getfd"], False),
        ([], True),
    ],
)
def test_the_filter_allows_a_call_only_when_an_allow_line_names_it(lines, allowed):
    assert filter_allows(lines, "pidfd_getfd") is allowed


def test_proc_devices_are_read_by_major_character_devices_only():
    devices = character_devices((PROC_DEVICES / "h200-580.txt").read_text())
    assert devices[195] == ["nvidia", "nvidiactl"]
    assert devices[238] == ["nvidia-uvm"]
    assert 259 not in devices  # blkext is a block device


@pytest.mark.parametrize("fixture", ["h200-580.txt", "driver-535.txt"])
def test_the_default_groups_open_the_gpus_the_control_device_and_uvm_on_old_and_new_drivers(fixture):
    text = (PROC_DEVICES / fixture).read_text()
    devices = character_devices(text)
    uvm = next(major for major, names in devices.items() if "nvidia-uvm" in names)
    assert {195, uvm} <= allowed_majors([f"{group} rw" for group in DEFAULT_ALLOW], devices)
    assert uncovered_nvidia_device_refusals(text, DEFAULT_ALLOW) == []


def test_the_groups_before_the_fix_open_nothing_of_major_195_on_a_535_driver():
    text = (PROC_DEVICES / "driver-535.txt").read_text()
    (refusal,) = uncovered_nvidia_device_refusals(
        text, ["char-nvidia", "char-nvidiactl", "char-nvidia-uvm", "char-nvidia-caps"]
    )
    assert refusal.startswith(
        "major 195 (nvidia-frontend in /proc/devices), the GPUs (/dev/nvidia0 ...) and /dev/nvidiactl"
    )
    assert refusal.endswith("Add char-nvidia-frontend")


@pytest.mark.parametrize(
    ("device_allow", "opened"),
    [
        (["char-*"], {195, 238, 239, 240, 241, 242}),
        (["char-195"], {195}),
        (["char-nvidia-caps*"], {241, 242}),
        (["/dev/nvidia0 rw", "block-loop rw"], set()),
    ],
)
def test_groups_resolve_as_systemd_resolves_them(device_allow, opened):
    devices = character_devices((PROC_DEVICES / "h200-580.txt").read_text())
    assert allowed_majors(device_allow, devices) & {195, 238, 239, 240, 241, 242} == opened


def test_a_host_without_the_nvidia_driver_or_with_the_cpu_build_needs_no_device():
    without_driver = "Character devices:\n  1 mem\n136 pts\n\nBlock devices:\n  7 loop\n"
    assert uncovered_nvidia_device_refusals(without_driver, []) == []
    assert sandbox_refusals(settings(device="cpu", device_allow=[])) == []
    assert sandbox_refusals(settings(device_allow=[])) != []


# /proc/self/limits of a unit that asked LimitNOFILE=65536 of a systemd whose own hard limit is 20000.
CAPPED = """Limit                     Soft Limit           Hard Limit           Units
Max open files            20000                20000                files
Max locked memory         8388608              8388608              bytes
"""
GRANTED = CAPPED.replace("20000                20000", "65536                65536").replace(
    "8388608              8388608", "unlimited            unlimited"
)


def test_limits_that_systemd_grants_are_not_refused():
    assert limit_refusals(GRANTED, 65536, "infinity") == []
    assert limit_refusals(CAPPED, 16384, "8M") == []
    assert limit_refusals(CAPPED) == []


def test_open_files_capped_by_systemd_s_own_limit_are_refused_with_what_it_grants():
    assert limit_refusals(CAPPED, 65536) == [
        "vllm_server_limit_nofile asks LimitNOFILE=65536, and systemd grants this host's units 20000, 20000 (soft,"
        " hard) open files: raise systemd's own limit (its hard limit, from the kernel or the container it runs in,"
        " caps what it grants) or lower vllm_server_limit_nofile"
    ]


def test_locked_memory_is_compared_in_bytes_with_systemd_s_suffixes():
    assert limit_refusals(CAPPED, memlock="9M")[0].startswith(
        "vllm_server_limit_memlock asks LimitMEMLOCK=9M, and systemd grants this host's units 8388608, 8388608"
    )
    assert "LimitMEMLOCK=infinity" in limit_refusals(CAPPED, memlock="infinity")[0]
    assert limit_refusals(CAPPED, memlock="lots") == [
        "vllm_server_limit_memlock must be bytes (with K, M, G, ... of 1024) or infinity, got 'lots'"
    ]
