import inspect
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.vllm.plugins.filter.vllm import FilterModule

FILTERS = FilterModule().filters()
DOCS = Path(__file__).resolve().parents[4] / "plugins" / "filter"


def test_serve_args_and_exec_line_compose():
    args = FILTERS["vllm_serve_args"]({"model": "/m", "served_name": "tiny", "host": "0.0.0.0", "port": 8000})
    line = FILTERS["systemd_exec_line"](
        ["/opt/vllm/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", *args]
    )
    assert line.endswith(
        "--port 8000 --middleware llmops_vllm_dev_guard.MetricsReaders"
        " --middleware llmops_vllm_dev_guard.RetryableAborts"
        " --middleware llmops_vllm_dev_guard.CutOffRequests --tensor-parallel-size 1"
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("vllm_serve_args", {"model": "/m", "served_name": "t", "host": "h", "port": 0}, "port must be"),
        ("systemd_exec_line", [], "at least the program"),
        ("systemd_environment_file", {"BAD NAME": "x"}, "not a valid environment variable name"),
    ],
)
def test_errors_become_filter_errors(name, value, message):
    with pytest.raises(AnsibleFilterError, match=message):
        FILTERS[name](value)


def test_gpu_count():
    assert FILTERS["vllm_layout_gpu_count"]({"tensor_parallel_size": 4, "data_parallel_size": 2}) == 8


def test_instance_clashes_become_filter_errors():
    assert FILTERS["vllm_instances"]([{"model": "tiny"}], default_port=9000)[0]["port"] == 9000
    with pytest.raises(AnsibleFilterError, match="both use port 8000"):
        FILTERS["vllm_instances"]([{"model": "a"}, {"model": "b"}])
    new = {"name": "b", "port": 8000, "gpus": []}
    assert FILTERS["vllm_displaced"](new, [{"instance": "a", "port": 8000, "gpus": []}]) == [
        {"instance": "a", "port": 8000, "gpus": []}
    ]


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_every_filter_is_documented_as_its_function_takes_it(name):
    """ansible-doc -t filter shows each filter, and its options are the function's arguments."""
    documentation = yaml.safe_load((DOCS / f"{name}.yml").read_text())["DOCUMENTATION"]
    assert documentation["name"] == name
    function = getattr(FILTERS[name], "__wrapped__", FILTERS[name])
    arguments = list(inspect.signature(function).parameters)[1:]
    assert set(documentation["options"]) - {"_input"} == set(arguments), name


def test_the_refusals_of_the_swap_s_and_the_tune_s_books_become_filter_errors():
    with pytest.raises(AnsibleFilterError, match="an outcome is one of"):
        FILTERS["vllm_swap_outcome"]("prepared", "tiny")
    with pytest.raises(AnsibleFilterError, match="whole number of seconds above 0"):
        FILTERS["vllm_tune_guard_command"]("llmops-vllm-tune-guard-tiny", 0, "tiny")
    with pytest.raises(AnsibleFilterError, match="now must be a number of seconds"):
        FILTERS["vllm_tune_runs"]({"started": "a"}, {}, 0, "later")


def test_a_failed_loop_says_why_through_the_filter():
    loop = {"failed": True, "msg": "One or more items failed", "results": [{"failed": True, "msg": "tiny hung"}]}
    assert FILTERS["vllm_task_failure"](loop, "Stop the old instances") == "Stop the old instances: tiny hung"


def test_group_hosts_read_each_host_s_address_gpus_and_network_from_the_inventory():
    group_hosts = FilterModule().filters()["vllm_group_hosts"]
    hostvars = {
        "gpu-a": {"vllm_worker_address": "10.0.0.1", "ansible_host": "gpu-a.lan", "vllm_gpus": {"present": True},
                  "vllm_network_interface": "ens1f0", "vllm_nccl_ib_hca": "mlx5_0,mlx5_1"},
        "gpu-b": {"ansible_host": "10.0.0.2"},
        "gpu-c": {},
    }  # fmt: skip
    assert group_hosts(["gpu-a", "gpu-b", "gpu-c"], hostvars) == [
        {"name": "gpu-a", "address": "10.0.0.1", "gpus": {"present": True}, "interface": "ens1f0",
         "ib_hca": "mlx5_0,mlx5_1"},
        {"name": "gpu-b", "address": "10.0.0.2", "gpus": None},
        {"name": "gpu-c", "address": "gpu-c", "gpus": None},
    ]  # fmt: skip
    with pytest.raises(AnsibleFilterError, match="gpu-d not in the inventory"):
        group_hosts(["gpu-a", "gpu-d"], hostvars)
