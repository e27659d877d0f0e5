#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_sandbox_info
short_description: Read what the vLLM unit's sandbox check needs of a host, in one call
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Returns where each of O(paths) leads once its symbolic links are followed, and with O(proc_devices) the host's
    C(/proc/devices), the two things of the host that the filter P(llmops.vllm.vllm_sandbox_refusals#filter) needs
    to say what the hardened unit would keep from the server.
  - A path that does not exist is resolved as far as it exists, and is no failure; whether it exists is the
    business of the task that needs it.
  - C(ansible.builtin.stat) says where a path leads only when the path itself is a link (C(lnk_source)); a model
    under a linked directory (C(/var/lib/vllm/models) a link to C(/home/data/models)) is reached through its
    parent, which the sandbox would hide from the server all the same. This module follows every link of a path,
    as C(realpath) does, for the C(vllm_server) role's preflight, in one call for all the paths.
  - With O(account), it also says how the host has the service's group, user and home, which the unit runs as and
    writes to. The C(vllm_server) role leaves them to C(ansible.builtin.group), C(user) and C(file) only where they
    differ from what it asks, so that a deploy to a host that has them makes no call for them.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It only reads, so it runs in check mode like in a normal run.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  paths:
    description: Absolute paths to follow through their symbolic links.
    type: list
    elements: path
    default: []
  proc_devices:
    description: Read C(/proc/devices), whose character device groups systemd's C(DeviceAllow=) resolves.
    type: bool
    default: false
  account:
    description: The service's account to read, its user, group and home directory.
    type: dict
    suboptions:
      user:
        description: The user's name.
        type: str
        required: true
      group:
        description: The group's name.
        type: str
        required: true
      home:
        description: The home directory.
        type: path
        required: true
seealso:
  - module: llmops.vllm.vllm_instance
"""

EXAMPLES = r"""
- name: Read the paths that the server must reach under the sandbox, and the host's device groups
  llmops.vllm.vllm_sandbox_info:
    paths: [/opt/vllm/venv/bin/python, /var/lib/vllm/models/tiny, /var/lib/vllm]
    proc_devices: true
    account: {user: vllm, group: vllm, home: /var/lib/vllm}
  register: sandbox_host
"""

RETURN = r"""
resolved:
  description: Each of O(paths), in order, with its symbolic links followed (C(os.path.realpath)).
  returned: always
  type: list
  elements: str
  sample: [/usr/bin/python3.11, /var/lib/vllm/models/tiny, /var/lib/vllm]
proc_devices:
  description: The text of C(/proc/devices); empty without O(proc_devices).
  returned: always
  type: str
account:
  description: The account of O(account) as the host has it; null without O(account).
  returned: always
  type: dict
  contains:
    group:
      description: The group's name where the group exists, else null.
      type: str
    user:
      description: The user where it exists (its primary group by name, home, shell and comment), else null.
      type: dict
    home:
      description: The home directory's owner, group and mode (four octal digits) where it is a directory, else null.
      type: dict
  sample:
    group: vllm
    user: {name: vllm, group: vllm, home: /var/lib/vllm, shell: /usr/sbin/nologin, comment: vLLM inference server}
    home: {owner: vllm, group: vllm, mode: "0750"}
"""

import grp
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

PROC_DEVICES = "/proc/devices"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def read_account(user: str, group: str, home: str) -> dict:
    """The group, the user and the home directory as the host has them, in the terms the role asks for them."""
    try:
        grp.getgrnam(group)
        found_group = group
    except KeyError:
        found_group = None
    try:
        entry = pwd.getpwnam(user)
        found_user = {"name": user, "group": _group_name(entry.pw_gid), "home": entry.pw_dir,
                      "shell": entry.pw_shell, "comment": entry.pw_gecos}  # fmt: skip
    except KeyError:
        found_user = None
    try:
        status = os.stat(home)
    except (FileNotFoundError, NotADirectoryError):  # missing, or under a file: no home to compare
        status = None
    found_home = None
    if status is not None and stat.S_ISDIR(status.st_mode):
        found_home = {"owner": _user_name(status.st_uid), "group": _group_name(status.st_gid),
                      "mode": f"{stat.S_IMODE(status.st_mode):04o}"}  # fmt: skip
    return {"group": found_group, "user": found_user, "home": found_home}


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "proc_devices": {"type": "bool", "default": False},
            "account": {
                "type": "dict",
                "options": {
                    "user": {"type": "str", "required": True},
                    "group": {"type": "str", "required": True},
                    "home": {"type": "path", "required": True},
                },
            },
        },
        supports_check_mode=True,
    )
    account = module.params["account"]
    relative = [path for path in module.params["paths"] if not os.path.isabs(path)]
    if relative:
        module.fail_json(msg=f"paths must be absolute, got {relative}")
    if account and not os.path.isabs(account["home"]):
        module.fail_json(msg=f"account.home must be absolute, got {account['home']!r}")
    devices = ""
    if module.params["proc_devices"]:
        with open(PROC_DEVICES, encoding="utf-8") as text:
            devices = text.read()
    resolved = [os.path.realpath(path) for path in module.params["paths"]]
    found = read_account(account["user"], account["group"], account["home"]) if account else None
    module.exit_json(changed=False, resolved=resolved, proc_devices=devices, account=found)


if __name__ == "__main__":
    main()
