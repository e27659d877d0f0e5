"""vllm_sandbox_info on this machine: real symbolic links and the real /proc/devices."""

import grp
import os
import pwd

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


def test_the_account_is_read_in_the_terms_the_role_asks_for_it(run, tmp_path):
    me = pwd.getpwuid(os.getuid())
    my_group = grp.getgrgid(me.pw_gid).gr_name
    home = tmp_path / "home"
    home.mkdir(mode=0o750)
    home.chmod(0o750)
    result = run({"account": {"user": me.pw_name, "group": my_group, "home": str(home)}, "_ansible_check_mode": True})
    user = {"name": me.pw_name, "group": my_group, "home": me.pw_dir, "shell": me.pw_shell, "comment": me.pw_gecos}
    assert result["account"] == {
        "group": my_group,
        "user": user,
        "home": {"owner": me.pw_name, "group": my_group, "mode": "0750"},
    }


def test_what_the_host_lacks_of_the_account_reads_as_null(run, tmp_path):
    (tmp_path / "file").write_text("")
    for home in (tmp_path / "missing", tmp_path / "file", tmp_path / "file" / "home"):
        account = {"user": "llmops-no-such-user", "group": "llmops-no-such-group", "home": str(home)}
        assert run({"account": account})["account"] == {"group": None, "user": None, "home": None}
    assert run({"paths": []})["account"] is None


def test_a_relative_home_is_refused(run):
    result = run({"account": {"user": "vllm", "group": "vllm", "home": "var/lib/vllm"}}, fails=True)
    assert result["msg"] == "account.home must be absolute, got 'var/lib/vllm'"
