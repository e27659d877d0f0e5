#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: python_wheel
short_description: Build a pure-Python wheel from files given as text
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Writes C(NAME-VERSION-py3-none-any.whl) into O(dest), a wheel that holds O(files) and a C(.dist-info) with
    C(METADATA), C(WHEEL), the O(entry_points) and C(RECORD), for pip or uv to install like any other wheel.
  - The same input gives the same bytes (every member dated 1980-01-01, in the order of their paths), so a wheel
    that is already there is not written again.
  - The C(vllm_install) role puts the collection's helpers into a venv this way (the middleware of every server,
    the CPU build's AMX plugin and its registration under the name C(vllm), a base interpreter's site-packages),
    so that the venv's installer records their files and removes them as it removes any distribution.
  - A O(dest) that cannot be a directory, or input that cannot make a wheel, fails before anything is written.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It builds the wheel in memory and says whether the file would be written.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  dest:
    description: The directory to write the wheel into; made (with its parents) when missing.
    type: path
    required: true
  name:
    description: The distribution's name.
    type: str
    required: true
  version:
    description: The distribution's version, a release with an optional local label (C(1.0), C(0.32.0+cpu)).
    type: str
    required: true
  files:
    description:
      - The wheel's files, by their path inside it (C(package/module.py), C(name.pth)), each with its text.
      - None may be under a C(.dist-info) directory, which the wheel writes itself; without any, the wheel is its
        metadata alone (a distribution that registers a name).
    type: dict
    default: {}
  entry_points:
    description: The entry points, by group, each a mapping of a name to C(module:callable).
    type: dict
    default: {}
  summary:
    description: The one line of C(Summary) in the wheel's metadata.
    type: str
    default: ""
seealso:
  - module: llmops.vllm.vllm_install_info
"""

EXAMPLES = r"""
- name: Build a plugin for vLLM as a wheel
  llmops.vllm.python_wheel:
    dest: /opt/vllm/venv/share/llmops-vllm/wheels
    name: my-vllm-plugin
    version: "1.0"
    files:
      my_vllm_plugin.py: "{{ lookup('ansible.builtin.file', 'my_vllm_plugin.py', rstrip=false) }}"
    entry_points:
      vllm.general_plugins:
        my_plugin: my_vllm_plugin:register
  register: plugin_wheel

- name: Install it
  ansible.builtin.command:
    argv: [/opt/vllm/venv/bin/python, -m, pip, install, --no-index, "{{ plugin_wheel.path }}"]
  when: plugin_wheel is changed
"""

RETURN = r"""
path:
  description: The wheel's path.
  returned: success
  type: str
  sample: /opt/vllm/venv/share/llmops-vllm/wheels/my_vllm_plugin-1.0-py3-none-any.whl
"""

import os
import posixpath

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import (
    directory_problem,
    write_if_changed,
)
from ansible_collections.llmops.vllm.plugins.module_utils.install.wheel import build, wheel_file_name, wheel_problems


def main():
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "name": {"type": "str", "required": True},
            "version": {"type": "str", "required": True},
            "files": {"type": "dict", "default": {}},
            "entry_points": {"type": "dict", "default": {}},
            "summary": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    problems = wheel_problems(params["name"], params["version"], params["files"], params["entry_points"])
    problem = directory_problem(params["dest"], "dest")
    if problem:
        problems.append(problem)
    if problems:
        module.fail_json(msg="; ".join(problems))
    content = build(params["name"], params["version"], params["files"], params["entry_points"], params["summary"])
    path = posixpath.join(params["dest"], wheel_file_name(params["name"], params["version"]))
    if not module.check_mode:
        os.makedirs(params["dest"], mode=0o755, exist_ok=True)
    module.exit_json(changed=write_if_changed(module, path, content, mode=0o644), path=path)


if __name__ == "__main__":
    main()
