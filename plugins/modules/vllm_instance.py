#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_instance
short_description: Write the record of a vLLM instance, the one source of truth about it
version_added: 0.3.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Writes O(config_dir)/INSTANCE.json, the instance record that M(llmops.vllm.vllm_instance_info),
    M(llmops.vllm.vllm_service) and M(llmops.vllm.vllm_bench) read back. It holds the unit, where the server
    listens and the URL where the host reaches it (computed from O(host) and O(port)), the served name, the
    GPUs, the weights, the interpreter and vLLM release, and the load, drain and stop timeouts.
  - The record names where the instance's API key lives (O(environment_file), variable C(VLLM_API_KEY)) and
    never holds a secret; the modules that send the key read it from there.
  - Changes nothing when the file already holds this record; writes it atomically otherwise.
  - The C(vllm_server) role runs it for every instance it deploys.
extends_documentation_fragment:
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The record's JSON before and after.
  idempotent:
    support: full
options:
  config_dir:
    description: Directory of the records; it must exist (in check mode it may be missing).
    type: path
    default: /etc/vllm
  instance:
    description: Name of the instance (letters, digits and C(_.-), starting with a letter or digit).
    type: str
    required: true
  unit:
    description: The instance's systemd unit.
    type: str
    required: true
  model:
    description: Catalog name of the model it serves.
    type: str
    required: true
  served_name:
    description: The model name the server answers to.
    type: str
    required: true
  host:
    description: Address the server listens on; V(0.0.0.0) and V(::) are reached on loopback from the host.
    type: str
    required: true
  port:
    description: Port the server listens on.
    type: int
    required: true
  gpus:
    description: GPU indices of the instance; empty for every GPU, or a host without any.
    type: list
    elements: int
    default: []
  model_path:
    description: Directory of the weights on the host.
    type: path
    required: true
  python:
    description: Interpreter of the instance's vLLM venv.
    type: path
    required: true
  vllm_version:
    description: vLLM release in that venv.
    type: str
    required: true
  layout:
    description: The parallel sizes it runs with.
    type: dict
    required: true
  load_timeout:
    description: Seconds from its start until it must serve.
    type: int
    required: true
  drain_timeout:
    description: Seconds that in-flight requests may run when it stops (its C(--shutdown-timeout)).
    type: int
    required: true
  stop_timeout:
    description: Seconds after the drain for its processes to exit before they get SIGKILL.
    type: int
    required: true
  environment_file:
    description: The unit's EnvironmentFile, where the API key lives (as C(VLLM_API_KEY)).
    type: path
    required: true
seealso:
  - module: llmops.vllm.vllm_instance_info
"""

EXAMPLES = r"""
- name: Record the instance tiny
  llmops.vllm.vllm_instance:
    instance: tiny
    unit: vllm-tiny.service
    model: tiny
    served_name: tiny
    host: 0.0.0.0
    port: 8000
    model_path: /var/lib/vllm/models/tiny
    python: /opt/vllm/venv/bin/python
    vllm_version: 0.32.0
    layout: {tensor_parallel_size: 1}
    load_timeout: 300
    drain_timeout: 10
    stop_timeout: 30
    environment_file: /etc/vllm/tiny.env
"""

RETURN = r"""
path:
  description: The record's file.
  returned: always
  type: str
  sample: /etc/vllm/tiny.json
record:
  description: The record as written.
  returned: always
  type: dict
  sample:
    instance: tiny
    unit: vllm-tiny.service
    model: tiny
    served_name: tiny
    host: 0.0.0.0
    port: 8000
    url: http://127.0.0.1:8000
    gpus: []
    model_path: /var/lib/vllm/models/tiny
    python: /opt/vllm/venv/bin/python
    vllm_version: 0.32.0
    layout: {"tensor_parallel_size": 1}
    load_timeout: 300
    drain_timeout: 10
    stop_timeout: 30
    secrets: {"environment_file": "/etc/vllm/tiny.env", "api_key_variable": "VLLM_API_KEY"}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils._instance_record import (
    API_KEY_VARIABLE,
    DEFAULT_CONFIG_DIR,
    RecordError,
    build_record,
    current_text,
    record_path,
    record_text,
    write_record,
)
from ansible_collections.llmops.vllm.plugins.module_utils._instances import INSTANCE_NAME

REQUIRED_TEXT = {"type": "str", "required": True}
REQUIRED_INT = {"type": "int", "required": True}


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "instance": REQUIRED_TEXT,
            "unit": REQUIRED_TEXT,
            "model": REQUIRED_TEXT,
            "served_name": REQUIRED_TEXT,
            "host": REQUIRED_TEXT,
            "port": REQUIRED_INT,
            "gpus": {"type": "list", "elements": "int", "default": []},
            "model_path": {"type": "path", "required": True},
            "python": {"type": "path", "required": True},
            "vllm_version": REQUIRED_TEXT,
            "layout": {"type": "dict", "required": True},
            "load_timeout": REQUIRED_INT,
            "drain_timeout": REQUIRED_INT,
            "stop_timeout": REQUIRED_INT,
            "environment_file": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not INSTANCE_NAME.match(params["instance"]):
        module.fail_json(
            msg="instance must be letters, digits and '_.-', starting with a letter or digit, "
            f"got {params['instance']!r}"
        )
    # In check mode the directory may be one that the play would have created by now.
    if not os.path.isdir(params["config_dir"]) and not (module.check_mode and not os.path.exists(params["config_dir"])):
        module.fail_json(msg=f"config_dir {params['config_dir']} is not a directory; create it first")
    secrets = {"environment_file": params["environment_file"], "api_key_variable": API_KEY_VARIABLE}
    try:
        record = build_record({**params, "secrets": secrets})
    except RecordError as error:
        module.fail_json(msg=str(error))
    path = record_path(params["config_dir"], params["instance"])
    before = current_text(path)
    after = record_text(record)
    changed = before != after
    if changed and not module.check_mode:
        write_record(path, record)
    diff = {"before": before or "", "after": after, "before_header": path, "after_header": path}
    module.exit_json(changed=changed, path=path, record=record, diff=diff)


if __name__ == "__main__":
    main()
