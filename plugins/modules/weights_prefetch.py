#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: weights_prefetch
short_description: Read a model's weight files into the page cache, when they fit the host's free memory
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads the weight files at or under O(path) once, so that the kernel keeps them in its page cache. Run during a
    swap while the old server still serves, it lets the new server load its weights from memory, not from the
    disk, once the old one has stopped.
  - The files are those whose names match O(patterns). Symbolic links to files are followed (the Hugging Face hub's
    cache links C(snapshots/) to C(blobs/)) and each real file counts once; links to directories are not followed,
    and dangling links are passed over.
  - The files are read only when their total size is at most the host's C(MemAvailable) (from C(/proc/meminfo))
    less O(reserve_mib); otherwise nothing is read and RV(reason) gives both figures.
  - The reading stops when O(timeout) runs out; the rest stays on disk, RV(complete) is false, and the module
    does not fail.
  - It never writes. The page cache is no state a user manages, so it never reports a change.
  - It fails, reading nothing, when O(path) does not exist or holds no file matching O(patterns).
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
    details: It lists the files, sums their sizes and checks the fit, but reads nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: It changes nothing but what the kernel keeps in its page cache.
options:
  path:
    description: A model's weights directory, walked recursively, or one weight file.
    type: path
    required: true
  patterns:
    description:
      - Shell-style patterns (fnmatch, case-sensitive) of the names of the files to read; a file named by O(path)
        must match one too.
    type: list
    elements: str
    default: ["*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf"]
  reserve_mib:
    description: MiB of C(MemAvailable) that must stay available after the weights are read.
    type: int
    default: 4096
  timeout:
    description: Seconds the reading may take; when they run out, the reading stops where it is.
    type: float
    default: 600
notes:
  - Reading into the page cache may evict other cached files; the kernel takes them back from C(MemAvailable),
    which is why the weights must fit it with O(reserve_mib) to spare.
seealso:
  - module: llmops.vllm.model_weights
"""

EXAMPLES = r"""
- name: Read the new model's weights into the page cache while the old server still serves
  llmops.vllm.weights_prefetch:
    path: /var/lib/vllm/models/minimax_m25
    reserve_mib: 8192
    timeout: 900
  register: prefetch

- name: Prefetch a model from the Hugging Face hub's cache, safetensors only
  llmops.vllm.weights_prefetch:
    path: /var/lib/vllm/.cache/huggingface/hub/models--Qwen--Qwen3-8B
    patterns: ["*.safetensors"]
"""

RETURN = r"""
files:
  description: Number of matching files, each real file once.
  returned: success
  type: int
  sample: 3
bytes:
  description: Total size of the matching files.
  returned: success
  type: int
  sample: 2211908608
read_bytes:
  description: Bytes read; less than RV(bytes) when the weights were skipped or the timeout stopped the reading.
  returned: success
  type: int
  sample: 2211908608
seconds:
  description: Seconds the reading took, 0 when nothing was read.
  returned: success
  type: float
  sample: 1.897
mib_per_s:
  description: MiB read per second, null when nothing was read.
  returned: success
  type: float
  sample: 1112.0
mem_available_bytes:
  description: The host's C(MemAvailable) before the reading, in bytes.
  returned: success
  type: int
  sample: 43164602368
prefetched:
  description: Whether every matching file was read to its end.
  returned: success
  type: bool
  sample: true
complete:
  description:
    - False only when O(timeout) stopped the reading before its end; true when every file was read, and when
      nothing was to be read (skipped for memory, or check mode).
  returned: success
  type: bool
  sample: true
reason:
  description:
    - Why the weights were not all read, empty when RV(prefetched) is true.
    - The memory's verdict, with the weights' size, C(MemAvailable) and the reserve in GiB; the timeout's; or
      V(check mode) when the weights fit and check mode read nothing.
  returned: success
  type: str
  sample: 57.1 GiB of weights do not fit 40.2 GiB available less the 4.0 GiB reserve
msg:
  description: What was done, in a line.
  returned: always
  type: str
  sample: read 2.06 GiB of 3 files into the page cache in 1.9 s (1112 MiB/s)
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import positive_seconds
from ansible_collections.llmops.vllm.plugins.module_utils.weights.page_cache import (
    DEFAULT_PATTERNS,
    PrefetchError,
    prefetch,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "patterns": {"type": "list", "elements": "str", "default": list(DEFAULT_PATTERNS)},
            "reserve_mib": {"type": "int", "default": 4096},
            "timeout": {"type": "float", "default": 600},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        timeout = positive_seconds(params["timeout"], "timeout")
        if params["reserve_mib"] < 0:
            raise ValueError(f"reserve_mib must be 0 MiB or more, got {params['reserve_mib']}")
        if not params["patterns"] or not all(params["patterns"]):
            raise ValueError(f"patterns must name the weight files, such as *.safetensors, got {params['patterns']}")
        result = prefetch(
            params["path"], params["patterns"], params["reserve_mib"], timeout, check_mode=module.check_mode
        )
    except (ValueError, PrefetchError) as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
