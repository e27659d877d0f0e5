#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: weights_root
short_description: The directory that holds the models' weights, and whether the interpreter that fills it is there
version_added: 0.6.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Makes O(root) a directory owned by root with mode C(0755) (its missing parents too), acting only on a difference.
  - Says whether O(python), the interpreter that writes generated models and fetches from the hub (vLLM's venv), is
    there, so that the C(vllm_weights) role knows it from the same call, where a C(stat) took one of its own.
  - A path at O(root) that is not a directory, or a missing O(python) with O(require_python), fails the module
    before anything is changed.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It reads the root and says whether it would make it or change its owner or mode.
  diff_mode:
    support: full
    details: The root's owner and mode, before and after.
  idempotent:
    support: full
options:
  root:
    description: The directory under which each model's weights get a directory of their own.
    type: path
    required: true
  python:
    description: The interpreter to look for; RV(python_exists) is false without it.
    type: path
  require_python:
    description: Fail, before the root is made, when O(python) does not exist (it must write a generated model).
    type: bool
    default: false
seealso:
  - module: llmops.vllm.tiny_model
  - module: llmops.vllm.model_weights
"""

EXAMPLES = r"""
- name: Create the weights root and look for vLLM's interpreter
  llmops.vllm.weights_root:
    root: /var/lib/vllm/models
    python: /opt/vllm/venv/bin/python
  register: weights_root
"""

RETURN = r"""
changes:
  description: What was done, or would be in check mode; a subset of V(created), V(owner), V(mode), in that order.
  returned: always
  type: list
  elements: str
  sample: [created, owner, mode]
python_exists:
  description: Whether O(python) exists (followed through its symbolic links).
  returned: always
  type: bool
"""

import os
import stat

from ansible.module_utils.basic import AnsibleModule

MODE = 0o755


def root_changes(found):
    """What the root needs, from its os.stat() result or None when missing: a subset of created, owner, mode."""
    if found is None:
        return ["created", "owner", "mode"]
    changes = []
    if (found.st_uid, found.st_gid) != (0, 0):
        changes.append("owner")
    if stat.S_IMODE(found.st_mode) != MODE:
        changes.append("mode")
    return changes


def describe(found):
    return found and {"owner": f"{found.st_uid}:{found.st_gid}", "mode": f"{stat.S_IMODE(found.st_mode):04o}"}


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "python": {"type": "path"},
            "require_python": {"type": "bool", "default": False},
        },
        required_if=[("require_python", True, ("python",))],
        supports_check_mode=True,
    )
    root, python = module.params["root"], module.params["python"]
    if not os.path.isabs(root):
        module.fail_json(msg=f"root must be an absolute path, got {root!r}")
    python_exists = bool(python) and os.path.exists(python)
    if module.params["require_python"] and not python_exists:
        module.fail_json(
            msg=f"{python} does not exist; it writes generated models (install vLLM first with "
            "llmops.vllm.vllm_install, or set vllm_weights_python)"
        )
    try:
        found = os.stat(root)
    except FileNotFoundError:
        found = None
    if found is not None and not stat.S_ISDIR(found.st_mode):
        module.fail_json(msg=f"the weights root {root} exists and is not a directory: move it away, or choose another")
    changes = root_changes(found)
    if changes and not module.check_mode:
        os.makedirs(root, mode=MODE, exist_ok=True)
        os.chown(root, 0, 0)
        os.chmod(root, MODE)
    module.exit_json(
        changed=bool(changes),
        changes=changes,
        python_exists=python_exists,
        diff={"before": describe(found) or {}, "after": {"owner": "0:0", "mode": f"{MODE:04o}"}},
    )


if __name__ == "__main__":
    main()
