#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_instance
short_description: Write a vLLM instance's EnvironmentFile, unit and record, the one source of truth about it
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Writes the three files of one instance, each only when it differs (content, mode, owner root) and each
    atomically. They are its EnvironmentFile O(environment_file) (mode 0600; O(environment) and the API key, as
    C(VLLM_API_KEY)), its systemd unit O(unit_file) (mode 0644, O(unit_content)), and its record.
  - The record is O(config_dir)/INSTANCE.json (the directory made, mode 0755, when missing), which
    M(llmops.vllm.vllm_instance_info), M(llmops.vllm.vllm_service) and M(llmops.vllm.vllm_bench) read back. It
    holds the unit, where the server listens and the URL where the host reaches it (computed from O(host) and
    O(port)), the served name, the GPUs, the weights, the interpreter and vLLM release, and the load, drain and
    stop timeouts.
  - The record names where the instance's API key lives (O(environment_file), variable C(VLLM_API_KEY)) and
    never holds a secret; the modules that send the key read it from there.
  - Returns which of the three files changed, so that a caller restarts the server when its unit or its
    environment did. It does not reload systemd; M(llmops.vllm.vllm_service) does when the unit changed.
  - The C(vllm_server) role runs it for every instance it deploys.
extends_documentation_fragment:
  - llmops.vllm.records
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The unit and the record before and after; of the EnvironmentFile only whether it changes (secrets).
  idempotent:
    support: full
options:
  instance:
    description: Name of the instance (letters, digits and C(_.-), starting with a letter or digit).
    type: str
    required: true
  unit:
    description: The instance's systemd unit, for example C(vllm-tiny.service).
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
    description: Directory of the weights on the host, an absolute path.
    type: path
    required: true
  python:
    description: Interpreter of the instance's vLLM venv, an absolute path.
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
  sleep_mode:
    description: Whether it runs with vLLM's sleep mode, so that a swap may put it to sleep.
    type: bool
    default: false
  group:
    description:
      - For a member of a multi-host group, its part of the group as the record keeps it, with C(role) (C(head) or
        C(worker)), C(hosts), C(head) (C(name), C(address)), C(serves_api), C(data_parallel_size) and the port of
        its guard's metrics, C(guard_port). Empty for a one-host instance.
      - A member that serves no API (a headless worker) is reached, in its record's C(url), at the head.
    type: dict
    default: {}
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
    description: The unit's EnvironmentFile, written here, where the API key lives (as C(VLLM_API_KEY)).
    type: path
    required: true
  environment:
    description: The server's environment but the key (the C(llmops.vllm.vllm_server_environment) filter's).
    type: dict
    required: true
  api_key:
    description: The API key that clients must send; written to O(environment_file) alone, never logged.
    type: str
  unit_file:
    description: The unit file to write, an absolute path such as C(/etc/systemd/system/vllm-tiny.service).
    type: path
    required: true
  unit_content:
    description: The unit file's text.
    type: str
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
    environment: {HOME: /var/lib/vllm, HF_HUB_OFFLINE: "1"}
    api_key: "{{ vllm_server_api_key }}"
    unit_file: /etc/systemd/system/vllm-tiny.service
    unit_content: "{{ lookup('ansible.builtin.template', 'vllm.service.j2') }}"
"""

RETURN = r"""
path:
  description: The record's file.
  returned: always
  type: str
  sample: /etc/vllm/tiny.json
changed_files:
  description: Which files changed (or would, in check mode), of V(environment), V(unit) and V(record).
  returned: always
  type: list
  elements: str
  sample: [unit, record]
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
    sleep_mode: false
    group: {}
    load_timeout: 300
    drain_timeout: 10
    stop_timeout: 30
    secrets: {"environment_file": "/etc/vllm/tiny.env", "api_key_variable": "VLLM_API_KEY"}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import (
    current_text,
    differs,
    write_if_changed,
)
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    API_KEY_VARIABLE,
    DEFAULT_CONFIG_DIR,
    ENVIRONMENT_MODE,
    RECORD_MODE,
    UNIT_MODE,
    build_record,
    check_instance_name,
    environment_text,
    record_path,
    record_text,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import check_unit_name

# The records' directory, created when missing: everyone may read the records, the EnvironmentFiles are 0600.
CONFIG_DIR_MODE = 0o755
REQUIRED_TEXT = {"type": "str", "required": True}
REQUIRED_INT = {"type": "int", "required": True}
# Where the files go and what the unit runs: a relative path would depend on the module's working directory.
ABSOLUTE_PATHS = ("config_dir", "unit_file", "model_path", "python")


def wanted_files(params, record):
    """(name, path, text, mode) of each file of the instance."""
    variables = dict(params["environment"])
    if params["api_key"]:
        variables[API_KEY_VARIABLE] = params["api_key"]
    return [
        ("environment", params["environment_file"], environment_text(params["unit"], variables), ENVIRONMENT_MODE),
        ("unit", params["unit_file"], params["unit_content"], UNIT_MODE),
        ("record", record_path(params["config_dir"], params["instance"]), record_text(record), RECORD_MODE),
    ]


def file_diff(name, path, text):
    before = current_text(path) or ""
    if name == "environment":  # secrets: only whether it changes
        return {"before_header": path, "after_header": path, "before": "(secrets)\n", "after": "(secrets, new)\n"}
    return {"before_header": path, "after_header": path, "before": before, "after": text}


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
            "sleep_mode": {"type": "bool", "default": False},
            "group": {"type": "dict", "default": {}},
            "load_timeout": REQUIRED_INT,
            "drain_timeout": REQUIRED_INT,
            "stop_timeout": REQUIRED_INT,
            "environment_file": {"type": "path", "required": True},
            "environment": {"type": "dict", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "unit_file": {"type": "path", "required": True},
            "unit_content": REQUIRED_TEXT,
        },
        supports_check_mode=True,
    )
    params = module.params
    secrets = {"environment_file": params["environment_file"], "api_key_variable": API_KEY_VARIABLE}
    try:
        check_instance_name(params["instance"])
        check_unit_name(params["unit"], "unit")
        for name in ABSOLUTE_PATHS:
            if not os.path.isabs(params[name]):
                raise ValueError(f"{name} must be an absolute path, got {params[name]!r}")
        record = build_record({**params, "secrets": secrets})
        files = wanted_files(params, record)
    except ValueError as error:  # RecordError and SystemdSyntaxError included
        module.fail_json(msg=str(error))
    config_dir = params["config_dir"]
    created = not os.path.exists(config_dir)
    if created and not module.check_mode:
        os.makedirs(config_dir, CONFIG_DIR_MODE)
        os.chmod(config_dir, CONFIG_DIR_MODE)
    for _name, path, _text, _mode in files:
        directory = os.path.dirname(path)
        # In check mode the records' directory may be one that this module would have created.
        if not os.path.isdir(directory) and not (module.check_mode and created and directory == config_dir):
            module.fail_json(msg=f"{directory} is not a directory; create it first")
    changed = [(name, path, text, mode) for name, path, text, mode in files if differs(path, text, mode)]
    diff = [file_diff(name, path, text) for name, path, text, _mode in changed]
    if not module.check_mode:
        for _name, path, text, mode in changed:
            write_if_changed(module, path, text, mode)
    module.exit_json(
        changed=bool(changed),
        changed_files=[name for name, *_rest in changed],
        path=files[-1][1],
        record=record,
        diff=diff,
    )


if __name__ == "__main__":
    main()
