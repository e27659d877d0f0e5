#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_service_account
short_description: The vLLM server's system group, user and home, in one call
version_added: 0.6.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Makes sure that the system group O(group) exists, that the system user O(user) exists with that primary group,
    O(home), O(shell) and O(comment), and that O(home) is a directory owned by O(user) and O(group) with O(mode).
  - Reads the three first and acts only on a difference, so a host that has them changes nothing; the C(vllm_server)
    role calls it once where C(ansible.builtin.group), C(ansible.builtin.user) and C(ansible.builtin.file) took a
    call each.
  - A missing group is made with C(groupadd --system), a missing user with C(useradd --system --no-create-home);
    a user whose group, home, shell or comment differs is changed with C(usermod). An existing user or group is
    never removed, and the system flag only applies to new ones.
  - A path at O(home) that is not a directory fails the module before anything is changed.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It reads the group, the user and the home and says what it would change.
  diff_mode:
    support: full
    details: The group, the user's fields and the home's owner and mode, before and after.
  idempotent:
    support: full
options:
  user:
    description: The service user's name.
    type: str
    required: true
  group:
    description: The service user's primary group.
    type: str
    required: true
  home:
    description: The user's home directory, made by this module (not by C(useradd)).
    type: path
    required: true
  mode:
    description: The home's mode, as an octal string.
    type: str
    default: "0750"
  shell:
    description: The user's login shell.
    type: path
    default: /usr/sbin/nologin
  comment:
    description: The user's GECOS comment.
    type: str
    default: vLLM inference server
seealso:
  - module: llmops.vllm.vllm_instance
"""

EXAMPLES = r"""
- name: Create the service's group, user and home
  llmops.vllm.vllm_service_account:
    user: vllm
    group: vllm
    home: /var/lib/vllm
"""

RETURN = r"""
changes:
  description:
    - What was done, or would be in check mode, in order; empty when the group, user and home were as wanted.
    - Each is one of V(group), V(user), V(home created), V(home owner), V(home mode).
  returned: always
  type: list
  elements: str
  sample: [group, user, home created, home owner, home mode]
"""

import grp
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.service.account import differences


def _name(lookup, identifier, attribute):
    """The name of a user or group id, or the id as text when the host has no such name."""
    try:
        return getattr(lookup(identifier), attribute)
    except KeyError:
        return str(identifier)


def read_group(name):
    try:
        return {"name": grp.getgrnam(name).gr_name}
    except KeyError:
        return None


def read_user(name):
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    group = _name(grp.getgrgid, entry.pw_gid, "gr_name")
    return {"group": group, "home": entry.pw_dir, "shell": entry.pw_shell, "comment": entry.pw_gecos}


def read_home(path):
    """None when missing, else its owner, group and mode; a path that is not a directory raises ValueError."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(found.st_mode):
        raise ValueError(f"home {path} exists and is not a directory: move it away, or choose another home")
    return {
        "owner": _name(pwd.getpwuid, found.st_uid, "pw_name"),
        "group": _name(grp.getgrgid, found.st_gid, "gr_name"),
        "mode": stat.S_IMODE(found.st_mode),
    }


def run(module, binary, arguments):
    command = [module.get_bin_path(binary, required=True), *arguments]
    rc, stdout, stderr = module.run_command(command)
    if rc != 0:
        module.fail_json(
            msg=f"{binary} failed (rc {rc}): {stderr.strip()}", cmd=command, rc=rc, stdout=stdout, stderr=stderr
        )


def apply(module, wanted, found):
    """Runs the differences found, in order: the group before the user that needs it, the user before its home."""
    if "group" in found:
        run(module, "groupadd", found["group"])
    if "user" in found:
        run(module, *found["user"])
    home = found.get("home", [])
    if "create" in home:
        os.makedirs(wanted["home"], mode=0o700, exist_ok=True)
    if "owner" in home:
        os.chown(wanted["home"], pwd.getpwnam(wanted["user"]).pw_uid, grp.getgrnam(wanted["group"]).gr_gid)
    if "mode" in home:
        os.chmod(wanted["home"], wanted["mode"])


def changes(found):
    listed = [part for part in ("group", "user") if part in found]
    return listed + [{"create": "home created"}.get(step, f"home {step}") for step in found.get("home", [])]


def main():
    module = AnsibleModule(
        argument_spec={
            "user": {"type": "str", "required": True},
            "group": {"type": "str", "required": True},
            "home": {"type": "path", "required": True},
            "mode": {"type": "str", "default": "0750"},
            "shell": {"type": "path", "default": "/usr/sbin/nologin"},
            "comment": {"type": "str", "default": "vLLM inference server"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        mode = int(params["mode"], 8)
    except ValueError:
        module.fail_json(msg=f"mode must be an octal string such as '0750', got {params['mode']!r}")
    if not os.path.isabs(params["home"]):
        module.fail_json(msg=f"home must be an absolute path, got {params['home']!r}")
    wanted = {name: params[name] for name in ("user", "group", "home", "shell", "comment")} | {"mode": mode}
    try:
        group, user, home = read_group(wanted["group"]), read_user(wanted["user"]), read_home(wanted["home"])
    except ValueError as error:
        module.fail_json(msg=str(error))
    found = differences(wanted, group, user, home)
    if found and not module.check_mode:
        apply(module, wanted, found)
    before = {
        "group": group is not None,
        "user": user,
        "home": home and {**home, "mode": f"{home['mode']:04o}"},
    }
    after = {
        "group": True,
        "user": {field: wanted[field] for field in ("group", "home", "shell", "comment")},
        "home": {"owner": wanted["user"], "group": wanted["group"], "mode": f"{mode:04o}"},
    }
    module.exit_json(changed=bool(found), changes=changes(found), diff={"before": before, "after": after})


if __name__ == "__main__":
    main()
