import re

import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.service.serve_command import (
    ServeSpecError,
    build_serve_args,
    build_server_environment,
    layout_gpu_count,
)

BASE = {"model": "/var/lib/vllm/models/tiny", "served_name": "tiny", "host": "0.0.0.0", "port": 8000}
BASE_ARGS = [
    "--model",
    "/var/lib/vllm/models/tiny",
    "--served-model-name",
    "tiny",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    # In every server: /metrics for the host itself and its listed readers alone (docs/observability.md).
    "--middleware",
    "llmops_vllm_dev_guard.MetricsReaders",
    # In every server: 503 for a completion aborted before any of it was answered, inside the account below.
    "--middleware",
    "llmops_vllm_dev_guard.RetryableAborts",
    # In every server: a journal line for each request it did not finish, which a stop counts.
    "--middleware",
    "llmops_vllm_dev_guard.CutOffRequests",
]


def spec(**overrides):
    return {**BASE, **overrides}


def test_minimal_spec_gives_tp1():
    assert build_serve_args(spec()) == [*BASE_ARGS, "--tensor-parallel-size", "1"]


def test_full_spec_in_order():
    args = build_serve_args(
        spec(
            layout={"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "data_parallel_size": 1},
            max_model_len=32768,
            max_num_seqs=256,
            gpu_memory_utilization=0.92,
            shutdown_timeout=30,
            load_format="dummy",
            trust_remote_code=True,
            extra_args=["--tool-call-parser", "minimax_m2", "--enable-auto-tool-choice"],
        )
    )
    assert args == [
        *BASE_ARGS,
        "--tensor-parallel-size", "4",
        "--pipeline-parallel-size", "2",
        "--max-model-len", "32768",
        "--max-num-seqs", "256",
        "--gpu-memory-utilization", "0.92",
        "--shutdown-timeout", "30",
        "--load-format", "dummy",
        "--trust-remote-code",
        "--tool-call-parser", "minimax_m2", "--enable-auto-tool-choice",
    ]  # fmt: skip


def test_expert_parallel_over_tp_and_dp():
    args = build_serve_args(spec(layout={"data_parallel_size": 8, "expert_parallel_size": 8}))
    assert args[len(BASE_ARGS) :] == [
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "8",
        "--enable-expert-parallel",
    ]


def test_expert_parallel_size_one_adds_no_flag():
    args = build_serve_args(spec(layout={"tensor_parallel_size": 4, "expert_parallel_size": 1}))
    assert "--enable-expert-parallel" not in args


def test_expert_parallel_size_must_match_ranks():
    with pytest.raises(ServeSpecError, match=r"expert_parallel_size 8 .* = 4 ranks; set it to 4"):
        build_serve_args(spec(layout={"tensor_parallel_size": 4, "expert_parallel_size": 8}))


def test_zero_shutdown_timeout_is_kept():
    assert build_serve_args(spec(shutdown_timeout=0))[-2:] == ["--shutdown-timeout", "0"]


def test_digit_strings_from_extra_vars_are_accepted():
    args = build_serve_args(spec(port="8001", max_num_seqs="8", gpu_memory_utilization="0.5"))
    assert args[7] == "8001"
    assert args[-4:] == ["--max-num-seqs", "8", "--gpu-memory-utilization", "0.5"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"port": 0}, "port must be a whole number from 1 to 65535, got 0"),
        ({"port": 70000}, "port must be"),
        ({"port": True}, "port must be"),
        ({"served_name": ""}, "served_name must be a non-empty string"),
        ({"served_name": "my model"}, "must not contain whitespace"),
        ({"model": None}, "model must be a non-empty string"),
        ({"layout": {"tensor_parallel_size": 0}}, "layout.tensor_parallel_size must be a whole number of at least 1"),
        ({"layout": {"tensor_parallel_size": 2.5}}, "layout.tensor_parallel_size"),
        ({"layout": {"tp": 2}}, r"layout has unknown keys \['tp'\]"),
        ({"max_num_seqs": -1}, "max_num_seqs must be"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be above 0 and at most 1"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"shutdown_timeout": -5}, "shutdown_timeout must be a whole number of seconds"),
        ({"trust_remote_code": "yes"}, "trust_remote_code must be true or false"),
        ({"extra_args": "--enforce-eager"}, "extra_args must be a list of strings"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ServeSpecError, match=message):
        build_serve_args(spec(**overrides))


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["--port", "9000"], "port"),
        (["--max_num_seqs=8"], "max_num_seqs"),
        (["--tensor-parallel-size=8"], "layout.tensor_parallel_size"),
        (["--enable-expert-parallel"], "layout.expert_parallel_size"),
    ],
)
def test_managed_flags_are_refused_in_extra_args(extra, key):
    with pytest.raises(ServeSpecError, match=f"conflicts with the spec: set {key} instead"):
        build_serve_args(spec(extra_args=extra))


def test_api_key_never_reaches_the_command_line():
    with pytest.raises(ServeSpecError, match="--api-key in extra_args would put the API key on the command line"):
        build_serve_args(spec(extra_args=["--api-key=secret"]))


def test_flag_values_pass_through_untouched():
    args = build_serve_args(spec(extra_args=["--override-generation-config", '{"temperature": 0.6}']))
    assert args[-2:] == ["--override-generation-config", '{"temperature": 0.6}']


@pytest.mark.parametrize(
    ("layout", "gpus"),
    [
        ({}, 1),
        ({"tensor_parallel_size": 4}, 4),
        ({"tensor_parallel_size": 8, "expert_parallel_size": 8}, 8),
        ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 2}, 8),
    ],
)
def test_layout_gpu_count(layout, gpus):
    assert layout_gpu_count(layout) == gpus


# ---- the environment ------------------------------------------------------------------------------------

BASE_ENVIRONMENT = {
    "HOME": "/var/lib/vllm",
    "HF_HOME": "/var/lib/vllm/huggingface",
    "HF_HUB_OFFLINE": "1",
    "VLLM_ENGINE_READY_TIMEOUT_S": "300",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONPYCACHEPREFIX": "/var/lib/vllm/.cache/python-bytecode",
}


def test_environment_of_a_cpu_instance():
    settings = {"home": "/var/lib/vllm", "load_timeout": 300, "device": "cpu", "cpu_kvcache_space_gib": 1}
    assert build_server_environment(settings) == {**BASE_ENVIRONMENT, "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_environment_of_a_gpu_instance_with_its_gpus_secrets_and_overrides():
    settings = {
        "home": "/var/lib/vllm",
        "load_timeout": "300",
        "device": "cuda",
        "cuda_visible_devices": "4,5,6,7",
        "env": {"NCCL_P2P_DISABLE": 1, "HF_HUB_OFFLINE": "0"},
        "api_key": "k3y",
    }
    assert build_server_environment(settings) == {
        **BASE_ENVIRONMENT,
        "HF_HUB_OFFLINE": "0",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "NCCL_P2P_DISABLE": "1",
        "VLLM_API_KEY": "k3y",
    }


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"load_timeout": 300}, "home must be a non-empty string"),
        ({"home": "/h", "load_timeout": 0}, "load_timeout must be a whole number of seconds, 1 or more, got 0"),
        ({"home": "/h", "load_timeout": 10, "env": ["A=1"]}, "env must be a mapping of variable names"),
    ],
)
def test_environment_refuses_bad_settings(settings, message):
    with pytest.raises(ServeSpecError, match=re.escape(message)):
        build_server_environment(settings)


# ---- sleep mode and vLLM's development endpoints --------------------------------------------------------


def test_sleep_mode_opens_the_development_endpoints_behind_the_guard():
    args = build_serve_args({**BASE, "sleep_mode": True})
    guard = ["--middleware", "llmops_vllm_dev_guard.LoopbackOnlyDevEndpoints"]
    assert args == [*BASE_ARGS, "--tensor-parallel-size", "1", *guard, "--enable-sleep-mode"]
    environment = build_server_environment({"home": "/var/lib/vllm", "load_timeout": 300, "sleep_mode": True})
    assert environment == {**BASE_ENVIRONMENT, "VLLM_SERVER_DEV_MODE": "1"}


def test_under_sleep_mode_the_plan_s_kv_cache_is_given_to_vllm():
    """vLLM sizes the KV cache past the GPU under sleep mode (its issue 40256): the plan's figure goes instead."""
    planned = {**BASE, "sleep_mode": True, "kv_cache_memory_bytes": 12562473369}
    assert build_serve_args(planned)[-2:] == ["--kv-cache-memory-bytes", "12562473369"]
    # Without sleep mode vLLM's own sizing holds; a size of the user's own in extra_args wins.
    assert "--kv-cache-memory-bytes" not in build_serve_args({**planned, "sleep_mode": False})
    own = build_serve_args({**planned, "extra_args": ["--kv-cache-memory-bytes=8000000000"]})
    assert [arg for arg in own if arg.startswith("--kv-cache")] == ["--kv-cache-memory-bytes=8000000000"]
    assert "--kv-cache-memory-bytes" not in build_serve_args({**planned, "kv_cache_memory_bytes": 0})
    with pytest.raises(ServeSpecError, match="kv_cache_memory_bytes must be a whole number of at least 1"):
        build_serve_args({**planned, "kv_cache_memory_bytes": -5})


def test_development_endpoints_alone_come_with_the_guard_and_without_sleep_mode():
    args = build_serve_args({**BASE, "dev_endpoints": True})
    assert args[len(BASE_ARGS) + 2 :] == ["--middleware", "llmops_vllm_dev_guard.LoopbackOnlyDevEndpoints"]
    assert "llmops_vllm_dev_guard.LoopbackOnlyDevEndpoints" not in build_serve_args(BASE)
    assert "VLLM_SERVER_DEV_MODE" not in build_server_environment({"home": "/h", "load_timeout": 10})


def test_development_mode_without_the_guard_is_refused():
    settings = {"home": "/h", "load_timeout": 10, "env": {"VLLM_SERVER_DEV_MODE": "1"}}
    with pytest.raises(ServeSpecError, match="env sets VLLM_SERVER_DEV_MODE, which opens vLLM's development endpoints"):
        build_server_environment(settings)
    with pytest.raises(
        ServeSpecError, match="--enable-sleep-mode in extra_args conflicts with the spec: set sleep_mode"
    ):
        build_serve_args({**BASE, "extra_args": ["--enable-sleep-mode"]})
    with pytest.raises(ServeSpecError, match="sleep_mode must be true or false, got 'yes'"):
        build_serve_args({**BASE, "sleep_mode": "yes"})


def test_each_release_and_entry_compiles_into_a_directory_of_its_own_under_the_home():
    settings = {"home": "/var/lib/vllm", "load_timeout": 300, "vllm_version": "0.26.0", "model": "Org/Model 7B"}
    environment = build_server_environment(settings)
    assert environment["VLLM_CACHE_ROOT"] == "/var/lib/vllm/.cache/vllm/0.26.0/Org--Model--7B"
    assert environment["TRITON_CACHE_DIR"] == "/var/lib/vllm/.cache/vllm/0.26.0/Org--Model--7B/triton"
    assert build_server_environment({**settings, "model": "tiny"})["VLLM_CACHE_ROOT"].endswith("/0.26.0/tiny")
    # The entry's own setting wins, as every variable of its env does.
    moved = build_server_environment({**settings, "env": {"VLLM_CACHE_ROOT": "/var/lib/vllm/cc"}})
    assert moved["VLLM_CACHE_ROOT"] == "/var/lib/vllm/cc"
