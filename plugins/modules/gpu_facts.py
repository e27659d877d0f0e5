#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: Report a host's NVIDIA GPUs, driver, and how each pair of GPUs is linked
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Sets the fact C(vllm_gpus) with the GPU count, each GPU's name, UUID, memory, MIG mode and PCI bus ID,
    the driver and CUDA versions, and the interconnect between each pair of GPUs as C(nvidia-smi topo -m)
    shows it (NVLink or a PCIe path). The layout planner reads it.
  - The topology always comes from C(nvidia-smi topo -m), also with the NVML backend, and is empty where
    that command is missing.
  - On a host without an NVIDIA driver (no C(nvidia-smi), no C(libnvidia-ml.so.1)) the module does not
    fail. It sets C(vllm_gpus.present=false), C(count=0) and a C(reason) that says what was missing, so
    that a play skips its GPU steps on CPU hosts with C(when) V(vllm_gpus.present).
  - It only reads, so it runs in check mode like in a normal run.
extends_documentation_fragment:
  - llmops.vllm.attributes
  - llmops.vllm.nvidia
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options: {}
seealso:
  - module: llmops.vllm.gpu_memory_wait
"""

EXAMPLES = r"""
- name: Read the GPUs
  llmops.vllm.gpu_facts:

- name: GPU steps run only on hosts with a driver and at least one GPU
  ansible.builtin.debug:
    msg: "{{ vllm_gpus.count }} x {{ vllm_gpus.gpus[0].name }}, all NVLink: {{ vllm_gpus.topology.all_nvlink }}"
  when: vllm_gpus.present

- name: Say why a host has no GPUs
  ansible.builtin.debug:
    msg: "{{ vllm_gpus.reason }}"
  when: not vllm_gpus.present
"""

RETURN = r"""
ansible_facts:
  description: The facts set.
  returned: always
  type: dict
  contains:
    vllm_gpus:
      description: The host's NVIDIA GPUs.
      returned: always
      type: dict
      contains:
        present:
          description: Whether a driver answered and lists at least one GPU.
          type: bool
          sample: true
        reason:
          description: Why O(ignore:present) is false; what was looked for and not found.
          type: str
          returned: when present is false
          sample: >-
            No NVIDIA driver: libnvidia-ml.so.1 cannot be loaded (libnvidia-ml.so.1: cannot open shared object
            file: No such file or directory); nvidia-smi is not on PATH
        backend:
          description: How the driver was read, V(null) without a driver.
          type: str
          sample: nvml
        count:
          description: Number of GPUs.
          type: int
          sample: 8
        driver_version:
          description: Version of the NVIDIA driver; empty without one.
          type: str
          sample: 580.159.04
        cuda_version:
          description: Highest CUDA version the driver supports; empty without a driver.
          type: str
          sample: "13.0"
        gpus:
          description: Each GPU, by nvidia-smi index (PCI bus order).
          type: list
          elements: dict
          sample:
            - index: 0
              uuid: GPU-d0f1eba3-ac23-d843-fbe6-d95a497ee56c
              name: NVIDIA H200
              memory_total_mib: 143771
              memory_used_mib: 0
              mig_mode: Disabled
              pci_bus_id: "00000000:00:06.0"
        topology:
          description:
            - C(matrix) holds the GPU-by-GPU labels of C(nvidia-smi topo -m) (V(X) for self, V(NV18) for 18
              bonded NVLinks, V(PIX), V(PXB), V(PHB), V(NODE), V(SYS) for PCIe paths).
            - C(pairs) lists each pair once with its C(link) label and C(kind) (V(nvlink) or V(pcie)).
            - C(all_nvlink) is true when there are two GPUs or more and every pair is linked by NVLink.
          type: dict
          sample:
            matrix: [["X", "NV18"], ["NV18", "X"]]
            pairs: [{"gpus": [0, 1], "link": "NV18", "kind": "nvlink"}]
            all_nvlink: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.gpu.nvidia import (
    BACKEND_OPTION,
    NoDriver,
    NvidiaError,
    open_backend,
    topology,
)

try:
    import pynvml
except ImportError:
    pynvml = None


def absent(reason):
    return {
        "present": False,
        "reason": reason,
        "backend": None,
        "count": 0,
        "driver_version": "",
        "cuda_version": "",
        "gpus": [],
        "topology": topology([]),
    }


def read_facts(backend):
    gpus = backend.gpus()
    driver_version, cuda_version = backend.versions()
    facts = {
        "present": bool(gpus),
        "backend": backend.name,
        "count": len(gpus),
        "driver_version": driver_version,
        "cuda_version": cuda_version,
        "gpus": [gpu.as_dict() for gpu in gpus],
        "topology": backend.topology() if gpus else topology([]),
    }
    if not gpus:
        facts["reason"] = f"the NVIDIA driver {driver_version} answers but lists no GPU"
    return facts


def main():
    module = AnsibleModule(
        argument_spec={"backend": BACKEND_OPTION},
        supports_check_mode=True,
    )
    try:
        backend = open_backend(module.params["backend"], pynvml, module.get_bin_path("nvidia-smi"), module.run_command)
    except NoDriver as no_driver:
        module.exit_json(changed=False, ansible_facts={"vllm_gpus": absent(f"No NVIDIA driver: {no_driver.reason}")})
    try:
        facts = read_facts(backend)
    except NvidiaError as error:
        module.fail_json(msg=f"The NVIDIA driver answered, but reading the GPUs through {backend.name} failed: {error}")
    finally:
        backend.close()
    module.exit_json(changed=False, ansible_facts={"vllm_gpus": facts})


if __name__ == "__main__":
    main()
