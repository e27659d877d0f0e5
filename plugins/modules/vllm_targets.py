#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_targets
short_description: Say where Prometheus scrapes a host's vLLM instances, and let only those who may read /metrics
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads the host's instance records (M(llmops.vllm.vllm_instance) writes them) and the state of their units, and
    returns the Prometheus targets of the instances that systemd is to run (unit enabled, or running), as file-based
    service discovery groups, one target each, with the labels C(host), C(vllm_instance), C(model),
    C(served_name), C(gpus) and C(vllm_version). An instance that a stop or a swap has stopped and disabled is no
    target. The address comes from the record, the one writer of the instance's URL.
  - Writes O(readers_file), which the collection's middleware in every vLLM server reads (it is installed in each
    venv, C(llmops_vllm_dev_guard.MetricsReaders)). vLLM's C(--api-key) does not guard C(/metrics); the middleware
    answers it to the host itself and to the addresses and networks in that file, and 403 to every other client.
    O(metrics_readers) gives them; host names are resolved here, on the host whose servers they will reach.
  - Returns the target of the host's router too (C(vllm-router.service), which the C(vllm_router) role runs) while
    systemd is to run it, at the address and port of its metrics that the unit's command line gives
    (C(--prometheus-host), C(--prometheus-port)), with the label C(host). A router whose metrics listen on loopback
    alone is a target of a Prometheus on this host only.
  - The C(vllm_targets) role runs it at the end of deploy, swap, rollout, stop, tune and router, and writes the
    targets on the monitoring hosts.
extends_documentation_fragment:
  - llmops.vllm.records
  - llmops.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The readers file before and after.
  idempotent:
    support: full
options:
  host:
    description: The value of the C(host) label, the host's inventory name.
    type: str
    required: true
  address:
    description:
      - The address at which the monitoring hosts reach this host, for the instances that listen on every address
        (C(0.0.0.0), C(::)). An instance that listens on one address is scraped there.
    type: str
    required: true
  metrics_readers:
    description:
      - Who besides the host itself may read C(/metrics) of its vLLM servers, each an address (C(10.0.0.5)), a
        network (C(10.0.0.0/24)) or a host name, which is resolved here. The monitoring hosts, typically.
      - Empty leaves C(/metrics) to the host itself.
    type: list
    elements: str
    default: []
  readers_file:
    description: The file the servers' middleware reads; the middleware reads this path, change it only in tests.
    type: path
    default: /etc/vllm/metrics-readers
seealso:
  - module: llmops.vllm.vllm_instance_info
"""

EXAMPLES = r"""
- name: Publish the targets of the host's instances, readable by the monitoring host
  llmops.vllm.vllm_targets:
    host: "{{ inventory_hostname }}"
    address: "{{ ansible_host | default(inventory_hostname) }}"
    metrics_readers: [10.0.0.5]
  register: targets

- name: Write them where Prometheus on the monitoring host discovers them
  ansible.builtin.copy:
    content: "{{ targets.targets | to_nice_json }}"
    dest: /etc/prometheus/vllm-targets/vllm/{{ inventory_hostname }}.json
    mode: "0644"
  delegate_to: monitor-01
"""

RETURN = r"""
targets:
  description:
    - The file_sd target groups for a Prometheus on another host, one per instance that systemd is to run, sorted by
      instance. An instance that listens on loopback alone is out of its reach and left out (RV(local_only)).
  returned: always
  type: list
  elements: dict
  sample:
    - targets: ["10.0.0.12:8000"]
      labels: {host: gpu-01, vllm_instance: tiny, model: tiny, served_name: tiny, gpus: "0,1", vllm_version: 0.32.0}
local_targets:
  description: The same groups for a Prometheus on this host, each at the address of its record's URL.
  returned: always
  type: list
  elements: dict
  sample:
    - targets: ["127.0.0.1:8000"]
      labels: {host: gpu-01, vllm_instance: tiny, model: tiny, served_name: tiny, gpus: "0,1", vllm_version: 0.32.0}
local_only:
  description: The instances among the targets that listen on loopback alone, which no other host reaches.
  returned: always
  type: list
  elements: str
  sample: [tiny-b]
outdated:
  description: Instances whose record an older release of the collection wrote; no target until deployed again.
  returned: always
  type: list
  elements: str
  sample: []
guard_targets:
  description:
    - The file_sd target groups of the guards of the host's multi-host group members (their Prometheus metrics,
      on the port of the record's C(group.guard_port)), for a Prometheus on another host; a guard on loopback
      alone is left out.
  returned: always
  type: list
  elements: dict
  sample:
    - targets: ["10.0.0.12:18001"]
      labels: {host: gpu-01, vllm_instance: kimi_k25_pair, model: kimi_k25_pair}
guard_local_targets:
  description: The same groups for a Prometheus on this host.
  returned: always
  type: list
  elements: dict
  sample:
    - targets: ["127.0.0.1:18001"]
      labels: {host: gpu-01, vllm_instance: kimi_k25_pair, model: kimi_k25_pair}
router_targets:
  description:
    - The file_sd target group of the host's router for a Prometheus on another host; empty without a router that
      systemd is to run, or one whose metrics listen on loopback alone.
  returned: always
  type: list
  elements: dict
  sample:
    - targets: ["10.0.0.12:29000"]
      labels: {host: gpu-01}
router_local_targets:
  description: The same group for a Prometheus on this host.
  returned: always
  type: list
  elements: dict
  sample:
    - targets: ["127.0.0.1:29000"]
      labels: {host: gpu-01}
readers:
  description: The networks written to O(readers_file), the names resolved.
  returned: always
  type: list
  elements: str
  sample: [10.0.0.5/32]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.file_writer import current_text, write_if_changed
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    DEFAULT_CONFIG_DIR,
    RecordError,
    read_records,
)
from ansible_collections.llmops.vllm.plugins.module_utils.observability.metrics_readers import (
    READERS_FILE,
    READERS_MODE,
    ReadersError,
    reader_networks,
    readers_text,
)
from ansible_collections.llmops.vllm.plugins.module_utils.observability.prometheus_targets import (
    guard_target_groups,
    is_target,
    only_local,
    router_target_groups,
    target_groups,
)
from ansible_collections.llmops.vllm.plugins.module_utils.router.record import ROUTER_UNIT
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import (
    Unit,
    UnitError,
    exec_start_argv,
    flag_value,
)

DIRECTORY_MODE = 0o755


def router_metrics(state) -> tuple[str, int] | None:
    """Where the host's router serves its metrics, from its unit's command line; None without a router that systemd
    is to run."""
    if not state.exists or not is_target(state.active_state, state.unit_file_state):
        return None
    argv = exec_start_argv(state.exec_start)
    listen, port = flag_value(argv, "--prometheus-host"), flag_value(argv, "--prometheus-port")
    if not listen or not port or not port.isdigit():
        return None
    return listen, int(port)


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "host": {"type": "str", "required": True},
            "address": {"type": "str", "required": True},
            "metrics_readers": {"type": "list", "elements": "str", "default": []},
            "readers_file": {"type": "path", "default": READERS_FILE},
        },
        supports_check_mode=True,
    )
    params = module.params
    for option in ("host", "address"):
        if not params[option].strip():
            module.fail_json(msg=f"{option} must name the host, got {params[option]!r}")
    try:
        readers = reader_networks(params["metrics_readers"])
    except ReadersError as error:
        module.fail_json(msg=str(error))
    try:
        records = read_records(params["config_dir"])
        states = {record["instance"]: Unit(record["unit"], module.run_command).state() for record in records}
        router = router_metrics(Unit(ROUTER_UNIT, module.run_command).state())
    except RecordError as error:
        module.fail_json(msg=str(error))
    except UnitError as error:
        module.fail_json(msg=f"Reading the state of a vLLM unit failed: {error}")
    outdated = [record["instance"] for record in records if record["outdated"]]
    targets = [
        record
        for record in records
        if not record["outdated"]
        and is_target(states[record["instance"]].active_state, states[record["instance"]].unit_file_state)
    ]
    path, text = params["readers_file"], readers_text(readers)
    diff = {"before_header": path, "after_header": path, "before": current_text(path) or "", "after": text}
    if not module.check_mode:
        # A host without instances yet has no records' directory, where the file goes by default.
        os.makedirs(os.path.dirname(path), DIRECTORY_MODE, exist_ok=True)
    changed = write_if_changed(module, path, text, READERS_MODE)
    module.exit_json(
        changed=changed,
        diff=diff,
        targets=target_groups(targets, params["host"], params["address"], local=False),
        local_targets=target_groups(targets, params["host"], params["address"], local=True),
        local_only=[record["instance"] for record in targets if only_local(record)],
        guard_targets=guard_target_groups(targets, params["host"], params["address"], local=False),
        guard_local_targets=guard_target_groups(targets, params["host"], params["address"], local=True),
        router_targets=router_target_groups(router, params["host"], params["address"], local=False),
        router_local_targets=router_target_groups(router, params["host"], params["address"], local=True),
        outdated=outdated,
        readers=readers,
    )


if __name__ == "__main__":
    main()
