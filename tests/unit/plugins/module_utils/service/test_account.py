"""The steps that bring the service's group, user and home to what is wanted, from plain data."""

from ansible_collections.llmops.vllm.plugins.module_utils.service.account import differences

WANTED = {"user": "vllm", "group": "vllm", "home": "/var/lib/vllm", "shell": "/usr/sbin/nologin",
          "comment": "vLLM inference server", "mode": 0o750}  # fmt: skip
USER = {"group": "vllm", "home": "/var/lib/vllm", "shell": "/usr/sbin/nologin", "comment": "vLLM inference server"}
HOME = {"owner": "vllm", "group": "vllm", "mode": 0o750}


def test_a_host_that_has_all_three_as_wanted_needs_nothing():
    assert differences(WANTED, {"name": "vllm"}, USER, HOME) == {}


def test_a_new_host_gets_a_system_group_a_system_user_without_a_home_from_useradd_and_a_home_of_its_own():
    assert differences(WANTED, None, None, None) == {
        "group": ["--system", "vllm"],
        "user": ("useradd", ["--system", "--gid", "vllm", "--home-dir", "/var/lib/vllm", "--no-create-home",
                             "--shell", "/usr/sbin/nologin", "--comment", "vLLM inference server", "vllm"]),
        "home": ["create", "owner", "mode"],
    }  # fmt: skip


def test_a_user_that_differs_is_changed_in_the_fields_that_differ_only():
    user = USER | {"shell": "/bin/bash", "group": "users"}
    assert differences(WANTED, {"name": "vllm"}, user, HOME) == {
        "user": ("usermod", ["-g", "vllm", "-s", "/usr/sbin/nologin", "vllm"])
    }


def test_a_home_with_another_owner_or_mode_is_given_the_wanted_ones():
    assert differences(WANTED, {"name": "vllm"}, USER, HOME | {"owner": "root"}) == {"home": ["owner"]}
    assert differences(WANTED, {"name": "vllm"}, USER, HOME | {"group": "root", "mode": 0o755}) == {
        "home": ["owner", "mode"]
    }
