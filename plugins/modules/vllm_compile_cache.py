#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_compile_cache
short_description: An instance's compile cache, packed for identical hosts or unpacked from theirs
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - vLLM compiles a model at its first start (torch.compile, Inductor and Triton kernels, DeepGEMM's JIT warm-up)
    into the directory C(VLLM_CACHE_ROOT), which the C(vllm_server) role sets per vLLM release and catalog entry
    under the service's home. A start that finds that directory filled does not compile again what it holds.
  - The module reads the instance's record, its unit file with its drop-ins and its C(EnvironmentFile) to find
    the directory and the cache's key - the vLLM release, the catalog entry, the serve command less C(--host) and
    C(--port), vLLM's own variables (C(VLLM_*)) in the unit's environment less its address, port, key and cache
    directory, and the device (the model, driver and compute capability of the instance's GPUs from
    C(nvidia-smi), or the CPU's model and instruction set) - and says whether the directory holds a cache.
  - O(state=archived) packs the cache into O(archive) with its key, for the controller to keep, and with vLLM's
    answers about model classes that the entry's C(modelinfos) link leads to (the unit links it to one directory
    of the release), as the entry's own, so that the host that unpacks it resolves the model's config without
    importing the model's class first.
  - O(state=imported) unpacks O(archive) into the instance's empty cache directory, owned by the service's user,
    only when the key it carries is this host's own; an archive of another key is refused (RV(refused) says how
    it differs) and the host keeps compiling for itself. A host whose directory holds a cache keeps it.
extends_documentation_fragment:
  - llmops.vllm.records
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It reads the record, the cache and the archive's key, and says what it would pack or unpack.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: >-
      O(state=imported) leaves a filled cache alone; O(state=archived) writes the archive again, which the roles
      call only for a key that the controller lacks.
options:
  instance:
    description: The instance, as its record in O(config_dir) names it.
    type: str
    required: true
  device:
    description: The device vLLM serves on, which says how the device part of the key is read.
    type: str
    choices: [cuda, cpu]
    default: cuda
  state:
    description:
      - V(archived) packs the cache into O(archive); V(imported) unpacks O(archive) into the instance's empty cache
        directory.
      - Omitted, the module only reads the key and the cache.
    type: str
    choices: [archived, imported]
  archive:
    description: The archive on the host (a gzip'd tar that begins with C(KEY.json)); required with O(state).
    type: path
seealso:
  - module: llmops.vllm.vllm_instance
"""

EXAMPLES = r"""
- name: Read the key of tiny's compile cache
  llmops.vllm.vllm_compile_cache:
    instance: tiny
  register: compile_cache

- name: Pack it for the fleet's other hosts
  llmops.vllm.vllm_compile_cache:
    instance: tiny
    state: archived
    archive: /var/tmp/tiny-compile-cache.tar.gz
  when: compile_cache.populated

- name: Unpack the fleet's cache before the first start of tiny on this host
  llmops.vllm.vllm_compile_cache:
    instance: tiny
    state: imported
    archive: "/var/tmp/{{ compile_cache.name }}"
"""

RETURN = r"""
path:
  description: The instance's cache directory (its C(VLLM_CACHE_ROOT)).
  returned: always
  type: str
  sample: /var/lib/vllm/.cache/vllm/0.26.0/minimax_m25
key:
  description: What the cache is valid for.
  returned: always
  type: dict
  sample:
    format: 1
    vllm: 0.26.0
    model: minimax_m25
    command: 3f5a0c...
    environment: 9b21e4...
    device: {kind: cuda, gpus: [NVIDIA H200 / 580.159.04 / 9.0]}
name:
  description: The file name of the archive of this key, under which the controller keeps it.
  returned: always
  type: str
  sample: minimax_m25-0.26.0-9c1d2e3f4a5b6c7d.tar.gz
populated:
  description: Whether the cache directory holds files (after the module's action).
  returned: always
  type: bool
files:
  description: The files in the cache directory (after the module's action).
  returned: always
  type: int
bytes:
  description: Their size in bytes.
  returned: always
  type: int
refused:
  description: With O(state=imported), how the archive's key differs from this host's; empty when it was not.
  returned: always
  type: str
  sample: "device {'kind': 'cpu', ...} where this host has {'kind': 'cuda', ...}"
msg:
  description: What was done, in one line.
  returned: always
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.install.cpu_isa import cpu_flags, isa_level
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    RecordError,
    check_instance_name,
    read_record,
    record_path,
    usable,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.compile_cache import (
    CompileCacheError,
    archive_name,
    cache_key,
    contents,
    cpu_device,
    cuda_device,
    key_differences,
    owner_of_nearest,
    read_key,
    unpack,
    write_archive,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.systemd import (
    parse_environment_directives,
    parse_environment_file,
    unit_file_exec_start,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import UNIT_DIRS, drop_ins_on_disk

CACHE_VARIABLE = "VLLM_CACHE_ROOT"
NVIDIA_QUERY = "--query-gpu=index,name,driver_version,compute_cap"


def read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise CompileCacheError(f"cannot read {what} {path}: {error.strerror or error}") from error


def device_part(module: AnsibleModule, device: str, gpus: list[int]) -> dict:
    if device == "cpu":
        cpuinfo = read_text("/proc/cpuinfo", "the CPU's description")
        return cpu_device(cpuinfo, isa_level(cpu_flags(cpuinfo)))
    nvidia_smi = module.get_bin_path("nvidia-smi", required=True)
    command = [nvidia_smi, NVIDIA_QUERY, "--format=csv,noheader"]
    rc, stdout, stderr = module.run_command(command)
    if rc != 0:
        module.fail_json(msg=f"nvidia-smi failed (rc {rc}): {stderr.strip()}", cmd=command, rc=rc, stderr=stderr)
    return cuda_device(stdout, gpus)


def instance_cache(module: AnsibleModule) -> tuple[str, dict]:
    """The instance's cache directory and its key, from its record, its unit file with its drop-ins and its
    environment file, as they are on disk (a unit written but not loaded yet included)."""
    params = module.params
    record = usable(read_record(record_path(params["config_dir"], check_instance_name(params["instance"]))))
    unit_text = read_text(os.path.join(UNIT_DIRS[0], record["unit"]), "the unit file")
    drop_ins = sorted(drop_ins_on_disk(record["unit"], UNIT_DIRS), key=os.path.basename)
    environment_file = record["secrets"]["environment_file"]
    environment = {
        **parse_environment_directives([unit_text, *(read_text(path, "the drop-in") for path in drop_ins)]),
        **parse_environment_file(read_text(environment_file, "the environment file")),
    }
    if not environment.get(CACHE_VARIABLE):
        raise CompileCacheError(
            f"{environment_file} sets no {CACHE_VARIABLE}: the instance was deployed by an older release of "
            "llmops.vllm; deploy it again (playbooks/deploy.yml)"
        )
    device = device_part(module, params["device"], record["gpus"])
    key = cache_key(record, unit_file_exec_start(unit_text), environment, device)
    return environment[CACHE_VARIABLE], key


def import_archive(module: AnsibleModule, path: str, key: dict, archive: str) -> dict:
    if contents(path)[0]:
        return {"changed": False, "msg": f"{path} holds this host's own compile cache: kept"}
    if not os.path.isfile(archive):
        raise CompileCacheError(f"archive {archive} is not a file on the host")
    differences = key_differences(key, read_key(archive))
    if differences:
        refused = "; ".join(differences)
        module.warn(f"The compile cache {archive} was made for another host: {refused}. Not used: vLLM compiles.")
        return {"changed": False, "refused": refused, "msg": f"refused {archive}: {refused}"}
    if module.check_mode:
        return {"changed": True, "msg": f"would unpack {archive} into {path}"}
    files = unpack(archive, path, owner_of_nearest(path))
    return {"changed": True, "msg": f"unpacked {files} files of {archive} into {path}"}


def archive_cache(module: AnsibleModule, path: str, key: dict, archive: str) -> dict:
    files, size = contents(path)
    if not files:
        return {"changed": False, "msg": f"{path} holds no compile cache: nothing to pack"}
    if not module.check_mode:
        write_archive(path, key, archive)
    return {"changed": True, "msg": f"packed {files} files ({size / 2**20:.1f} MiB) of {path} into {archive}"}


def main():
    module = AnsibleModule(
        argument_spec={
            "instance": {"type": "str", "required": True},
            "config_dir": {"type": "path", "default": "/etc/vllm"},
            "device": {"type": "str", "choices": ["cuda", "cpu"], "default": "cuda"},
            "state": {"type": "str", "choices": ["archived", "imported"]},
            "archive": {"type": "path"},
        },
        required_if=[("state", "archived", ["archive"]), ("state", "imported", ["archive"])],
        supports_check_mode=True,
    )
    params = module.params
    try:
        path, key = instance_cache(module)
        result = {"changed": False, "msg": f"{path}: key {json.dumps(key, sort_keys=True)}"}
        if params["state"] == "imported":
            result = import_archive(module, path, key, params["archive"])
        elif params["state"] == "archived":
            result = archive_cache(module, path, key, params["archive"])
    except (CompileCacheError, RecordError, ValueError) as error:
        module.fail_json(msg=str(error))
    except OSError as error:
        module.fail_json(msg=f"{params['state'] or 'reading the cache'} failed: {error}")
    files, size = contents(path)
    module.exit_json(
        path=path, key=key, name=archive_name(key), populated=files > 0, files=files, bytes=size,
        refused=result.pop("refused", ""), **result,
    )  # fmt: skip


if __name__ == "__main__":
    main()
