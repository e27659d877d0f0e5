"""Run a module's main() in-process: exit_json and fail_json raise, so a test gets the result."""

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class ModuleExit(Exception):
    pass


class ModuleFail(Exception):
    pass


@pytest.fixture
def run_module(monkeypatch):
    """run_module(main, args, fails=False) -> the result that main() exited (or, with fails, failed) with."""

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
