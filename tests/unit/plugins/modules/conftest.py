"""Run a module's main() in the test process, its exit_json or fail_json turned into a returned result."""

import json

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class ModuleExit(Exception):
    pass


class ModuleFail(Exception):
    pass


@pytest.fixture
def run_module(monkeypatch):
    """`run_module(main, args)` returns what main() passed to exit_json; with `fails=True`, to fail_json."""

    def exit_json(self, **result):
        raise ModuleExit(result)

    def fail_json(self, **result):
        raise ModuleFail(result)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def run(main, args, fails=False):
        with patch_module_args(args), pytest.raises(ModuleFail if fails else ModuleExit) as raised:
            main()
        return raised.value.args[0]

    return run


def _write_instance(config_dir, name, port, load_timeout, key, drain_timeout=30, stop_timeout=45, host="0.0.0.0"):
    """The record and EnvironmentFile of an instance, as the vllm_server role writes them."""
    config_dir.mkdir(exist_ok=True)
    env_file = config_dir / f"{name}.env"
    env_file.write_text(f'HOME="/var/lib/vllm"\nVLLM_API_KEY="{key}"\n')
    record = {
        "instance": name, "unit": f"vllm-{name}.service", "model": name, "served_name": f"{name}-served",
        "host": host, "port": port, "url": f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}",
        "gpus": [], "model_path": f"/m/{name}", "python": "/opt/vllm/venv/bin/python", "vllm_version": "0.32.0",
        "layout": {"tensor_parallel_size": 1}, "load_timeout": load_timeout, "drain_timeout": drain_timeout,
        "stop_timeout": stop_timeout,
        "secrets": {"environment_file": str(env_file), "api_key_variable": "VLLM_API_KEY"},
    }  # fmt: skip
    (config_dir / f"{name}.json").write_text(json.dumps(record))
    return record


@pytest.fixture
def write_instance():
    """`write_instance(config_dir, name, port, load_timeout, key, ...)` writes an instance's record and key."""
    return _write_instance
