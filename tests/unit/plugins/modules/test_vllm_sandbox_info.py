"""vllm_sandbox_info on this machine: real symbolic links and the real /proc/devices."""

import pytest

from ansible_collections.llmops.vllm.plugins.modules import vllm_sandbox_info


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(vllm_sandbox_info.main, args, fails)


def test_each_path_is_followed_through_its_links_in_order_and_a_missing_one_is_no_failure(run, tmp_path):
    target = tmp_path / "python3.11"
    target.write_text("")
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "python").symlink_to(target)
    (tmp_path / "weights").symlink_to(tmp_path / "elsewhere")
    paths = [str(tmp_path / "venv" / "python"), str(tmp_path / "weights" / "tiny"), str(tmp_path / "home")]
    result = run({"paths": paths, "_ansible_check_mode": True})
    assert result["changed"] is False
    assert result["resolved"] == [str(target), str(tmp_path / "elsewhere" / "tiny"), str(tmp_path / "home")]
    assert result["proc_devices"] == ""


def test_proc_devices_is_read_when_asked_for(run):
    result = run({"paths": [], "proc_devices": True})
    assert "Character devices:" in result["proc_devices"]


def test_a_relative_path_is_refused(run):
    assert run({"paths": ["opt/vllm"]}, fails=True)["msg"] == "paths must be absolute, got ['opt/vllm']"
