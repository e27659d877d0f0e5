import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.vllm.plugins.filter.vllm import FilterModule

FILTERS = FilterModule().filters()


def test_serve_args_and_exec_line_compose():
    args = FILTERS["vllm_serve_args"]({"model": "/m", "served_name": "tiny", "host": "0.0.0.0", "port": 8000})
    line = FILTERS["systemd_exec_line"](
        ["/opt/vllm/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", *args]
    )
    assert line.endswith("--port 8000 --middleware llmops_vllm_dev_guard.MetricsReaders --tensor-parallel-size 1")


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
