# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps that bring a service's system group, user and home to what is wanted, from plain data.

The vllm_server role runs its server as a non-root system user with a home of its own (its caches). One module
call reads the three and acts on a difference (llmops.vllm.vllm_service_account), where ansible.builtin.group,
user and file took a call each. Pure: the module reads the host into the dicts below and runs what comes back.
"""

from __future__ import annotations

# The user's fields that usermod changes, with the flag that sets each: a difference in one is one flag.
USER_FIELDS = (("group", "-g"), ("home", "-d"), ("shell", "-s"), ("comment", "-c"))


def group_command(wanted, group):
    """groupadd's arguments (after the binary) when the group is missing, else None. group: None or {'name'}."""
    if group is not None:
        return None
    return ["--system", wanted["group"]]


def user_command(wanted, user):
    """useradd's or usermod's arguments as (binary name, arguments), or None when the user is as wanted.

    wanted: {user, group, home, shell, comment}; user: None when missing, else {group (its primary group's name),
    home, shell, comment}. A new user is a system user without a home made by useradd: the home is the module's.
    """
    if user is None:
        return "useradd", [
            "--system", "--gid", wanted["group"], "--home-dir", wanted["home"], "--no-create-home",
            "--shell", wanted["shell"], "--comment", wanted["comment"], wanted["user"],
        ]  # fmt: skip
    flags = []
    for field, flag in USER_FIELDS:
        if user[field] != wanted[field]:
            flags += [flag, wanted[field]]
    return ("usermod", [*flags, wanted["user"]]) if flags else None


def home_steps(wanted, home):
    """What the home needs: a subset of ['create', 'owner', 'mode'] in that order.

    home: None when missing, else {owner, group (names), mode (int)}. A created home gets its owner and mode too.
    """
    if home is None:
        return ["create", "owner", "mode"]
    steps = []
    if (home["owner"], home["group"]) != (wanted["user"], wanted["group"]):
        steps.append("owner")
    if home["mode"] != wanted["mode"]:
        steps.append("mode")
    return steps


def differences(wanted, group, user, home):
    """{'group': [...], 'user': (binary, [...]), 'home': [...]}, only the parts that differ; empty: nothing to do."""
    found = {
        "group": group_command(wanted, group),
        "user": user_command(wanted, user),
        "home": home_steps(wanted, home),
    }
    return {part: steps for part, steps in found.items() if steps}
