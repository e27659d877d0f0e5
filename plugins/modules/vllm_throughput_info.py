#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_throughput_info
short_description: Measure the tokens per second of a host's vLLM instances from their /metrics, without Prometheus
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads each instance's C(/metrics) at the URL of its record (M(llmops.vllm.vllm_instance) writes the records)
    twice, O(seconds) apart, and returns the tokens per second that its engine generated
    (C(vllm:generation_tokens_total)) and the prompt tokens per second that it processed
    (C(vllm:prompt_tokens_total)) in between.
  - All instances are read at once, so the module takes O(seconds) and the time of the reads, however many
    instances the host runs.
  - C(/metrics) answers the host itself, where this module runs, without the API key.
  - The C(vllm_status) role runs it with C(vllm_status_throughput_seconds).
extends_documentation_fragment:
  - llmops.vllm.records
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
  instances:
    description: Measure only these instances, by name; all of them by default.
    type: list
    elements: str
  seconds:
    description: Seconds between the two reads; more gives a steadier figure.
    type: float
    default: 5.0
  timeout:
    description: Seconds that each read of C(/metrics) may take.
    type: float
    default: 2.0
seealso:
  - module: llmops.vllm.vllm_instance_info
"""

EXAMPLES = r"""
- name: Tokens per second of every instance of the host, over 5 s
  llmops.vllm.vllm_throughput_info:
  register: throughput

- name: Show them
  ansible.builtin.debug:
    msg: "{{ item.instance }}: {{ item.generation_tokens_per_second }} generated tok/s"
  loop: "{{ throughput.instances }}"
  loop_control:
    label: "{{ item.instance }}"
"""

RETURN = r"""
instances:
  description: One item per instance with a record, sorted by name.
  returned: always
  type: list
  elements: dict
  contains:
    instance:
      description: The instance's name.
      type: str
    generation_tokens_per_second:
      description:
        - Tokens per second that the engine generated between the two reads, summed over its engines.
        - Null when a read did not answer 200 or lacked the counter, or the counter went back (a restart).
      type: float
    prompt_tokens_per_second:
      description: Prompt tokens per second that the engine processed, null as above.
      type: float
    seconds:
      description: The seconds between the two reads of this instance.
      type: float
  sample:
    - instance: tiny
      generation_tokens_per_second: 612.4
      prompt_tokens_per_second: 80.2
      seconds: 5.01
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.bench.throughput import measure
from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import positive_seconds
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    DEFAULT_CONFIG_DIR,
    RecordError,
    choose,
    read_records,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "instances": {"type": "list", "elements": "str"},
            "seconds": {"type": "float", "default": 5.0},
            "timeout": {"type": "float", "default": 2.0},
        },
        supports_check_mode=True,
    )
    config_dir = module.params["config_dir"]
    try:
        seconds = positive_seconds(module.params["seconds"], "seconds")
        timeout = positive_seconds(module.params["timeout"], "timeout")
    except ValueError as error:
        module.fail_json(msg=str(error))
    try:
        records = choose(read_records(config_dir), module.params["instances"], config_dir)
    except RecordError as error:
        module.fail_json(msg=str(error))
    # A record of an older release may lack the URL: its server is not asked.
    urls = {record["instance"]: record["url"] for record in records if "url" in record}
    measured = measure(urls, seconds, timeout) if urls else {}
    empty = {"generation_tokens_per_second": None, "prompt_tokens_per_second": None, "seconds": None}
    instances = [{"instance": record["instance"], **measured.get(record["instance"], empty)} for record in records]
    module.exit_json(changed=False, instances=instances)


if __name__ == "__main__":
    main()
