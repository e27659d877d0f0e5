#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_import_check
short_description: Check that vLLM and its native ops load in a venv, as vLLM loads them on this host
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Runs the venv's interpreter once. It imports vLLM the way vLLM's engine does (C(vllm._custom_ops), which
    loads the native ops built for this host's CPU, or the CUDA build's), checks that torch then knows the op
    C(_C::rms_norm) that every build registers, and on the CPU build runs it once, so that the library's
    instructions have run on this CPU.
  - It fails, naming what failed, when vLLM is another release than O(version), chose another device than
    O(device), could not load its ops (with vLLM's own warning, such as a missing system library), lacks one of
    the O(plugins), or when the import died (a signal is named; SIGILL is a library built for another CPU).
  - C(import vllm._C) would not be such a check. On the CPU build it loads the AVX-512 library, and dies of SIGILL
    on a CPU with AVX2 alone, where vLLM itself serves.
  - The C(vllm_install) role runs it after every change of a venv.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It only reads (an import in a child process), so it runs in check mode like in a normal run.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  venv:
    description: The venv's directory (absolute); its C(bin/python) runs the check.
    type: path
    required: true
  version:
    description: The release vLLM must be, C(X.Y.Z); a local version such as C(+cpu) is not compared.
    type: str
    required: true
  device:
    description: The device vLLM must choose on this host.
    type: str
    choices: [cpu, cuda]
    required: true
  plugins:
    description:
      - Names of C(vllm.general_plugins) entry points that must be installed. Each is called, as vLLM calls it in
        each of its processes, and what it returns is reported.
    type: list
    elements: str
    default: []
  modules:
    description: More modules that must import with the venv's interpreter, such as a middleware of the collection.
    type: list
    elements: str
    default: []
seealso:
  - module: llmops.vllm.vllm_install_info
"""

EXAMPLES = r"""
- name: Check vLLM's CPU build and the collection's AMX plugin
  llmops.vllm.vllm_import_check:
    venv: /opt/vllm/venv
    version: 0.32.0
    device: cpu
    plugins: [llmops_amx_permission]
    modules: [llmops_vllm_dev_guard]
"""

RETURN = r"""
version:
  description: vLLM's version, as it reports itself.
  returned: success
  type: str
  sample: 0.32.0+cpu
device:
  description: The device vLLM chose on this host.
  returned: success
  type: str
  sample: cpu
libraries:
  description: vLLM's native-ops libraries that the import loaded, relative to the site-packages directory.
  returned: success
  type: list
  elements: str
  sample: [vllm/_C_AVX2.abi3.so]
isa:
  description:
    - The CPU's instruction set level, from C(/proc/cpuinfo), as vLLM's CPU build tells its kernels apart
      (V(AMX), V(AVX-512 BF16), V(AVX-512), V(AVX2), V(below AVX2)).
  returned: always
  type: str
  sample: AVX2
torch_isa:
  description: What torch, whose checks vLLM's CPU build follows, says this CPU supports.
  returned: success
  type: dict
  sample: {avx2: true, avx512: false, avx512_bf16: false, amx_tile: false}
plugins:
  description: What each entry point of O(plugins) returned (the AMX plugin says whether it asked for AMX).
  returned: success
  type: dict
  sample: {llmops_amx_permission: false}
warnings_logged:
  description: vLLM's warnings during the import.
  returned: success
  type: list
  elements: str
  sample: []
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.install.cpu_isa import read_isa_level
from ansible_collections.llmops.vllm.plugins.module_utils.install.native_ops import (
    CHECK,
    CheckError,
    describe_exit,
    native_libraries,
    parse,
    request,
    verdict,
)
from ansible_collections.llmops.vllm.plugins.module_utils.install.venv import python_of

# A module to import: identifiers joined by dots.
DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def main():
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "version": {"type": "str", "required": True},
            "device": {"type": "str", "choices": ["cpu", "cuda"], "required": True},
            "plugins": {"type": "list", "elements": "str", "default": []},
            "modules": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    venv = params["venv"]
    if not os.path.isabs(venv):
        module.fail_json(msg=f"venv must be an absolute directory, got {venv!r}")
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", params["version"]):
        module.fail_json(msg=f"version must be a release X.Y.Z, got {params['version']!r}")
    bad_modules = [name for name in params["modules"] if not DOTTED_NAME.fullmatch(name)]
    if bad_modules:
        module.fail_json(msg=f"modules must be Python module names such as pkg.mod, got {bad_modules}")
    bad_plugins = [name for name in params["plugins"] if not name or any(char.isspace() for char in name)]
    if bad_plugins:
        module.fail_json(msg=f"plugins must be entry point names, without spaces, got {bad_plugins}")
    isa = read_isa_level()
    python = python_of(venv)
    if not os.path.exists(python):
        module.fail_json(msg=f"{venv} has no interpreter ({python}): vLLM is not installed there", isa=isa)
    rc, stdout, stderr = module.run_command([python, "-c", CHECK, request(params["plugins"], params["modules"])])
    where = f"vLLM in {venv} (this CPU: {isa})"
    if rc != 0:
        module.fail_json(msg=f"{where}: {describe_exit(rc, stderr)}", rc=rc, stderr=stderr, isa=isa)
    try:
        answer = parse(stdout)
    except CheckError as error:
        module.fail_json(msg=f"{where}: {error}", stderr=stderr, isa=isa)
    result = {
        "version": answer["version"],
        "device": answer["device"],
        "libraries": native_libraries(answer["mapped"]),
        "isa": isa,
        "torch_isa": answer["torch_isa"],
        "plugins": answer["plugins"],
        "warnings_logged": answer["warnings"],
    }
    problems = verdict(answer, params["version"], params["device"], params["plugins"])
    if problems:
        module.fail_json(msg=f"{where}: " + "; ".join(problems), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
