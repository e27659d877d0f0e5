"""vllm_service_account on this machine, against its real users, groups and directories.

Only check mode may find a difference here: a real run that differed would change this machine's own account.
"""

import grp
import os
import pwd
import stat

import pytest

from ansible_collections.llmops.vllm.plugins.modules import vllm_service_account

ME = pwd.getpwuid(os.getuid())


@pytest.fixture
def run(run_module):
    return lambda args, fails=False: run_module(vllm_service_account.main, args, fails)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def me():
    """This machine's own user, its group and its home directory, each as they are: the account as wanted."""
    return {"user": ME.pw_name, "group": grp.getgrgid(ME.pw_gid).gr_name, "home": ME.pw_dir, "shell": ME.pw_shell,
            "comment": ME.pw_gecos, "mode": f"{mode(ME.pw_dir):04o}"}  # fmt: skip


def test_an_account_as_wanted_changes_nothing(run, me):
    result = run(me)
    assert result["changed"] is False and result["changes"] == []


def test_check_mode_names_a_home_mode_that_differs_and_leaves_it(run, me):
    other = "0751" if me["mode"] != "0751" else "0750"
    result = run(me | {"mode": other, "_ansible_check_mode": True, "_ansible_diff": True})
    assert result["changed"] is True and result["changes"] == ["home mode"]
    assert result["diff"]["before"]["home"]["mode"] == me["mode"]
    assert result["diff"]["after"]["home"]["mode"] == other
    assert f"{mode(ME.pw_dir):04o}" == me["mode"]


def test_check_mode_predicts_a_new_group_user_and_home_and_makes_none(run, tmp_path):
    home = tmp_path / "service-home"
    args = {"user": "llmops-test-no-such-user", "group": "llmops-test-no-such-group", "home": str(home)}
    result = run(args | {"_ansible_check_mode": True, "_ansible_diff": True})
    assert result["changed"] is True
    assert result["changes"] == ["group", "user", "home created", "home owner", "home mode"]
    assert result["diff"]["before"] == {"group": False, "user": None, "home": None}
    assert not home.exists()
    with pytest.raises(KeyError):
        pwd.getpwnam("llmops-test-no-such-user")
    with pytest.raises(KeyError):
        grp.getgrnam("llmops-test-no-such-group")


def test_a_home_that_is_a_file_fails_before_anything_changes(run, me, tmp_path):
    home = tmp_path / "home"
    home.write_text("not a directory")
    result = run(me | {"home": str(home)}, fails=True)
    assert result["msg"] == f"home {home} exists and is not a directory: move it away, or choose another home"


def test_a_mode_that_is_not_octal_and_a_relative_home_are_refused(run, me):
    assert run(me | {"mode": "rwx"}, fails=True)["msg"] == "mode must be an octal string such as '0750', got 'rwx'"
    assert run(me | {"home": "var/lib/vllm"}, fails=True)["msg"] == "home must be an absolute path, got 'var/lib/vllm'"
