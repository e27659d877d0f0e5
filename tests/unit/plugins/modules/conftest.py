"""Run a module's main() in the test process, its exit_json or fail_json turned into a returned result."""

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
