#!/usr/bin/python
# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_instance_info
short_description: List the vLLM instances of a host, each with its unit's state and its server's load
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads the instance records that M(llmops.vllm.vllm_instance) writes (the C(vllm_server) role runs it), one
    C(INSTANCE.json) per instance in O(config_dir), and returns each record's fields with the live state of the
    instance.
  - From systemd, through C(systemctl show), the unit's active and sub state, whether it is enabled, its main
    PID, how long it has been active and how often systemd restarted it; from its journal, how the engine
    died when a run ended by itself.
  - From the server, at the record's C(url), when the unit is active and O(metrics) is true, whether
    C(/health) answers 200 and, from C(/metrics), the requests running and waiting in the engine and the
    fraction of the KV cache in use. Both paths are open without the API key.
  - Only the C(*.json) records are opened. The C(INSTANCE.env) files beside them hold secrets and are read
    only with O(include_api_key).
  - A record that is not valid JSON, or lacks a field or has one of the wrong type, fails the module with the
    file's name and what is wrong, whichever instances O(instances) asks for. A host without O(config_dir)
    has no instance, which is no failure.
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
    description:
      - Report only these instances, by name. A name without a record fails the module, which lists the
        instances that have one.
      - All of them by default.
    type: list
    elements: str
  metrics:
    description: Ask each active instance's server for C(/health) and C(/metrics).
    type: bool
    default: true
  timeout:
    description: Seconds that each HTTP request to a server may take.
    type: float
    default: 2.0
  include_api_key:
    description:
      - Add each instance's API key as RV(instances[].api_key), read from the EnvironmentFile that its record
        names (C(secrets)), for a client that runs elsewhere (a benchmark from the controller).
      - The result then holds secrets; register it in a task with C(no_log=true). Modules on the host itself
        read the key from the record on their own (O(llmops.vllm.vllm_service#module:instance)).
    type: bool
    default: false
seealso:
  - module: llmops.vllm.vllm_service
"""

EXAMPLES = r"""
- name: List the instances of the host
  llmops.vllm.vllm_instance_info:
  register: vllm_info

- name: Show which instances serve and how loaded they are
  ansible.builtin.debug:
    msg: >-
      {{ item.instance }} ({{ item.unit }}) {{ item.active_state }}, serving {{ item.serving }},
      {{ item.requests_running }} running, {{ item.requests_waiting }} waiting
  loop: "{{ vllm_info.instances }}"
  loop_control:
    label: "{{ item.instance }}"

- name: Read the units of two instances only, without asking their servers
  llmops.vllm.vllm_instance_info:
    instances: [tiny, minimax_m25]
    metrics: false
"""

RETURN = r"""
instances:
  description:
    - The instances that have a record, sorted by name, or only those asked for in O(instances).
    - Each holds the record's own fields (C(instance), C(unit), C(model), C(served_name), C(host), C(port),
      C(url), C(gpus), C(model_path), C(python), C(vllm_version), C(layout), C(load_timeout), C(drain_timeout),
      C(stop_timeout) and C(secrets), where the API key lives) and the live fields below.
  returned: always
  type: list
  elements: dict
  contains:
    instance:
      description: The instance's name, from its record.
      type: str
    unit:
      description: The instance's systemd unit, from its record.
      type: str
    port:
      description: The port its server listens on, from its record.
      type: int
    url:
      description: Where the host reaches its server, from its record.
      type: str
    load_timeout:
      description: Seconds its start may take until it serves, from its record.
      type: int
    secrets:
      description: Where its API key lives (C(environment_file), C(api_key_variable)); never the key.
      type: dict
    outdated:
      description:
        - The fields that the record lacks because an older release of the collection wrote it; empty for a
          current record. Such an instance is listed, but M(llmops.vllm.vllm_service) and M(llmops.vllm.vllm_bench)
          refuse to act on it until it is deployed again.
      type: list
      elements: str
    api_key:
      description: The instance's API key; null when it has none.
      returned: with O(include_api_key)
      type: str
    gpus:
      description: The GPU indexes the instance uses, from its record; empty when it uses all GPUs or the host has none.
      type: list
      elements: int
    active_state:
      description: The unit's ActiveState, or V(not-found) when systemd has no unit file for it.
      type: str
    sub_state:
      description: The unit's SubState.
      type: str
    enabled:
      description: Whether the unit's UnitFileState is V(enabled), that is it starts at boot.
      type: bool
    main_pid:
      description: The unit's main PID; V(0) when no main process runs.
      type: int
    uptime:
      description:
        - Seconds since the unit became active, to 0.1 s; null when it is not active.
        - From systemd's ActiveEnterTimestampMonotonic and this host's monotonic clock, so a change of the
          wall clock does not alter it.
      type: float
    restarts:
      description: The automatic restarts systemd has made of the unit (C(NRestarts)).
      type: int
    engine_death:
      description:
        - How vLLM's engine died in the unit's last run that ended by itself (systemd then restarts the
          unit), from its journal; null when no run has ended so since the last stop that was asked for.
      type: str
      sample: "the engine died: Worker proc VllmWorker-0 died unexpectedly (exit code: -4, SIGILL)"
    serving:
      description:
        - Whether the server's C(/health) answered 200 and, for one with sleep mode, it is awake.
        - Null when the server was not asked (the unit is not active, or O(metrics=false)).
      type: bool
    asleep:
      description:
        - Whether a server started with sleep mode sleeps (C(/is_sleeping)); its unit is active, its GPUs are
          free for another server, and it does not serve until it is woken.
        - Null for a server without sleep mode, or one that was not asked.
      type: bool
    requests_running:
      description:
        - Requests in the engine's running batches (C(vllm:num_requests_running)), summed over its label
          sets (engines, models).
        - Null when not asked, or when C(/metrics) did not answer or lacks the metric.
      type: int
    requests_waiting:
      description: Requests queued in the engine (C(vllm:num_requests_waiting)), summed and null as above.
      type: int
    kv_cache_usage:
      description:
        - The fraction of the KV cache in use, from 0 to 1 (C(vllm:kv_cache_usage_perc), which vLLM reports
          as a fraction despite its name).
        - With several engines (data parallelism) each reports its own cache; this is the fullest one's
          fraction, the largest over the label sets, so that it stays a fraction.
        - Null as above.
      type: float
  sample:
    - instance: tiny
      unit: vllm-tiny.service
      model: tiny
      served_name: tiny
      host: 0.0.0.0
      port: 8000
      url: http://127.0.0.1:8000
      gpus: [0, 1]
      model_path: /var/lib/vllm/models/tiny
      vllm_version: 0.32.0
      python: /opt/vllm/venv/bin/python
      layout: {"tensor_parallel_size": 1}
      load_timeout: 300
      drain_timeout: 10
      stop_timeout: 30
      secrets: {"environment_file": "/etc/vllm/tiny.env", "api_key_variable": "VLLM_API_KEY"}
      outdated: []
      active_state: active
      sub_state: running
      enabled: true
      main_pid: 4242
      uptime: 3605.2
      restarts: 0
      engine_death: null
      serving: true
      requests_running: 3
      requests_waiting: 0
      kv_cache_usage: 0.12
"""

import math
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import positive_seconds
from ansible_collections.llmops.vllm.plugins.module_utils.instance.record import (
    DEFAULT_CONFIG_DIR,
    RecordError,
    api_key,
    check_instance_name,
    choose,
    read_records,
)
from ansible_collections.llmops.vllm.plugins.module_utils.service.unit import Unit, UnitError, UnitState
from ansible_collections.llmops.vllm.plugins.module_utils.service.vllm_api import (
    KV_CACHE_USAGE,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    get,
    is_sleeping,
    metric_samples,
    metric_total,
)

NOT_ASKED = dict.fromkeys(("serving", "asleep", "requests_running", "requests_waiting", "kv_cache_usage"))


def uptime(state: UnitState, now: float) -> float | None:
    """Seconds since the unit became active, or None when it is not; `now` is time.monotonic()."""
    if not state.exists or state.active_state != "active" or not state.active_since_us:
        return None
    return round(max(0.0, now - state.active_since_us / 1e6), 1)


def unit_fields(state: UnitState, now: float) -> dict:
    return {
        "active_state": state.active_state if state.exists else "not-found",
        "sub_state": state.sub_state,
        "enabled": state.unit_file_state == "enabled",
        "main_pid": state.main_pid,
        "uptime": uptime(state, now),
        "restarts": state.restarts,
    }


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def metric_fields(metrics_text: str) -> dict:
    """Requests running and waiting (summed) and KV cache usage (the largest) from /metrics; None if absent."""
    fields = {}
    for key, name in (("requests_running", REQUESTS_RUNNING), ("requests_waiting", REQUESTS_WAITING)):
        try:
            total = finite(metric_total(metrics_text, name))
        except ValueError:  # a sample whose value is not a number
            total = None
        fields[key] = None if total is None else int(total)
    # One value per label set (engine): their sum would not be a fraction.
    try:
        usages = [finite(usage) for usage in metric_samples(metrics_text, KV_CACHE_USAGE)]
    except ValueError:
        usages = []
    usages = [usage for usage in usages if usage is not None]
    fields["kv_cache_usage"] = max(usages) if usages else None
    return fields


def server_fields(url: str, timeout: float, sleep_mode: bool = False) -> dict:
    """What the server says on /health, /metrics and, with sleep mode, /is_sleeping; None for what it did not say."""
    health = get(url, "/health", timeout=timeout)
    fields = {**NOT_ASKED, "serving": health.status == 200}
    if health.status is None:  # nothing answers: /metrics would only wait out the timeout again
        return fields
    if sleep_mode:
        fields["asleep"] = is_sleeping(url, timeout)
        fields["serving"] = fields["serving"] and not fields["asleep"]
    metrics = get(url, "/metrics", timeout=timeout)
    if metrics.status == 200:
        fields.update(metric_fields(metrics.body))
    return fields


def describe(record: dict, run_command, metrics: bool, timeout: float) -> dict:
    """A record with its unit's state and, when the unit is active, its server's (at the record's URL)."""
    unit = Unit(record["unit"], run_command)
    state = unit.state()
    live = unit_fields(state, time.monotonic())
    # Only a unit that systemd restarted, or one that is not running, can have a run that ended by itself.
    restarted_or_down = state.exists and (state.restarts or state.stopped or state.crashed)
    live["engine_death"] = unit.last_engine_death(state.stopped) if restarted_or_down else None
    active = live["active_state"] == "active"
    # A record of an older release may lack the URL: its server is not asked.
    asked = active and metrics and "url" in record
    server = server_fields(record["url"], timeout, record.get("sleep_mode", False)) if asked else NOT_ASKED
    return {**record, **live, **server}


def main():
    module = AnsibleModule(
        argument_spec={
            "config_dir": {"type": "path", "default": DEFAULT_CONFIG_DIR},
            "instances": {"type": "list", "elements": "str"},
            "metrics": {"type": "bool", "default": True},
            "timeout": {"type": "float", "default": 2.0},
            "include_api_key": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    config_dir = module.params["config_dir"]
    try:
        timeout = positive_seconds(module.params["timeout"], "timeout")
        for name in module.params["instances"] or []:
            check_instance_name(name, "instances")
    except ValueError as error:  # RecordError included
        module.fail_json(msg=str(error))
    try:
        records = choose(read_records(config_dir), module.params["instances"], config_dir)
    except RecordError as error:
        module.fail_json(msg=str(error))
    try:
        instances = [describe(record, module.run_command, module.params["metrics"], timeout) for record in records]
        if module.params["include_api_key"]:
            for instance in instances:
                instance["api_key"] = api_key(instance)
    except UnitError as error:
        module.fail_json(msg=f"Reading the state of a vLLM unit failed: {error}")
    except RecordError as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, instances=instances)


if __name__ == "__main__":
    main()
