#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_sandbox_info
short_description: Read what the vLLM unit's sandbox check needs of a host, in one call
version_added: 0.6.0
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
seealso:
  - module: llmops.vllm.vllm_instance
"""

EXAMPLES = r"""
- name: Read the paths that the server must reach under the sandbox, and the host's device groups
  llmops.vllm.vllm_sandbox_info:
    paths: [/opt/vllm/venv/bin/python, /var/lib/vllm/models/tiny, /var/lib/vllm]
    proc_devices: true
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
"""

import os

from ansible.module_utils.basic import AnsibleModule

PROC_DEVICES = "/proc/devices"


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "proc_devices": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    relative = [path for path in module.params["paths"] if not os.path.isabs(path)]
    if relative:
        module.fail_json(msg=f"paths must be absolute, got {relative}")
    devices = ""
    if module.params["proc_devices"]:
        with open(PROC_DEVICES, encoding="utf-8") as text:
            devices = text.read()
    resolved = [os.path.realpath(path) for path in module.params["paths"]]
    module.exit_json(changed=False, resolved=resolved, proc_devices=devices)


if __name__ == "__main__":
    main()
