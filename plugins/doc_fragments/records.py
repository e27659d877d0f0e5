# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Where the instance records lie, for every module that reads or writes them (module_utils/instance/record.py).
    DOCUMENTATION = r"""
options:
  config_dir:
    description:
      - Where the instance records lie, one C(INSTANCE.json) per instance; the roles pass their C(vllm_config_dir).
    type: path
    default: /etc/vllm
"""
