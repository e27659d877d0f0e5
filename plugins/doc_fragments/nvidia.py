# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # How the modules that read NVIDIA GPUs reach the driver (module_utils/gpu/nvidia.py, BACKEND_OPTION).
    DOCUMENTATION = r"""
options:
  backend:
    description:
      - How to read the driver. V(auto) uses NVML when the Python package C(nvidia-ml-py) is importable by
        the module's interpreter and NVML starts (a memory poll costs microseconds), else the C(nvidia-smi)
        command (tens of milliseconds a poll).
      - V(nvml) or V(nvidia-smi) use only that one.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
requirements:
  - an NVIDIA driver (C(libnvidia-ml.so.1), C(nvidia-smi)) on the host, to read any GPU
  - optionally the Python package C(nvidia-ml-py) for the module's interpreter, to read through NVML
"""
